"""What a study says, for people and for other tools: the report's data (:mod:`._data`, frozen records of
:mod:`._records`; ``sweep report --json`` is :meth:`._records.Report.to_dict`), its figures and self-contained HTML
(:mod:`._figures`, plotly), the terminal text (one view per kind of output: :mod:`._trial_text`,
:mod:`._front_text`, :mod:`._data_text`, :mod:`._memory_text`, over :mod:`._console`'s pieces; ``sweep report``'s
lines in :mod:`._report_console`;
the pieces ``sweep run``'s console, :mod:`sweeper.cli._sweep_console`, shares in :mod:`.text`), optuna-dashboard
with sweeper's notes and figure (:mod:`._dashboard`).
The production configs of ``sweep export`` are :mod:`sweeper.export`'s.

Every reader takes a study as it was read once (:class:`sweeper.study.StudySnapshot`, made by
:func:`sweeper.study.snapshot`: data only, it cannot read the storage) and reads its trials as
:class:`sweeper.study.StoredTrial`.

The face exports only what the CLI uses; the records and the smaller helpers are imported from their modules.
"""

from sweeper.notation import format_instability
from sweeper.report._console import format_params, margin_text, predicted_text
from sweeper.report._dashboard import publish_study, serve
from sweeper.report._data import report_data
from sweeper.report._data_text import format_audit, format_data_warnings, format_dropped_rows, format_untrained_rows
from sweeper.report._html import write_html_report
from sweeper.report._memory_text import format_cap, format_file_rows, format_same_rows
from sweeper.report._progress import LiveProgress, progress_interval_s
from sweeper.report._report_console import report_lines, report_written_line
from sweeper.report._trial_text import trial_header, trial_result_lines

__all__ = [
    "LiveProgress",
    "format_audit",
    "format_cap",
    "format_data_warnings",
    "format_dropped_rows",
    "format_file_rows",
    "format_instability",
    "format_params",
    "format_same_rows",
    "format_untrained_rows",
    "margin_text",
    "predicted_text",
    "progress_interval_s",
    "publish_study",
    "report_data",
    "report_lines",
    "report_written_line",
    "serve",
    "trial_header",
    "trial_result_lines",
    "write_html_report",
]
