"""The report's text that ``sweep run``'s console (:mod:`sweeper.cli._sweep_console`) shares with ``sweep report``:
a trial's line, the front's table, the counts by status and NaN cause, the picks' block, the front's axis.

A public module beside the face (:mod:`sweeper.report`), as :mod:`sweeper.study.picks` is beside the study's: the
sweep's console lives in the CLI because it renders :mod:`sweeper.sweep`'s events, which the report never imports.
"""

from __future__ import annotations

from sweeper.report._console import format_params, plural
from sweeper.report._data_text import format_counts, format_data_nan_summary
from sweeper.report._front_text import format_front, front_axis, legacy_instability_warning
from sweeper.report._picks_data import picks_block
from sweeper.report._progress import format_duration
from sweeper.report._trial_text import format_trial_line, worst_case_data_line

__all__ = [
    "format_counts",
    "format_data_nan_summary",
    "format_duration",
    "format_front",
    "format_params",
    "format_trial_line",
    "front_axis",
    "legacy_instability_warning",
    "picks_block",
    "plural",
    "worst_case_data_line",
]
