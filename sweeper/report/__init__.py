"""What a study says, for people and for other tools: the report's data (:mod:`._data`, plain dicts), its figures and
self-contained HTML (:mod:`._figures`, plotly), the terminal text (:mod:`._console`), optuna-dashboard with sweeper's
notes and figure (:mod:`._dashboard`). The production configs of ``sweep export`` are :mod:`sweeper.export`'s.

Every reader takes an ``optuna.Study`` and reads its trials through :func:`sweeper.study.stored_trial`.
"""

from sweeper.report._console import (
    format_audit,
    format_counts,
    format_data_nan_summary,
    format_data_warnings,
    format_dropped_rows,
    format_front,
    format_instability,
    format_margin,
    format_memory_prediction,
    format_params,
    format_trace,
    format_trial_line,
    margin_line,
    status_label,
)
from sweeper.report._dashboard import dashboard_app, failure_note, publish_study, serve
from sweeper.report._data import (
    counts_with_stale,
    curves_data,
    describe_fit,
    fit_map_data,
    front_data,
    importance_data,
    memory_prediction_data,
    no_picks_reason,
    picks,
    report_dict,
    trial_params,
    trial_record,
)
from sweeper.report._figures import render_html, write_html_report
from sweeper.report._progress import LiveProgress, format_duration
from sweeper.report._sweep_console import (
    SweepConsole,
    all_failed_line,
    front_axis,
    memory_line,
    resume_lines,
    sweep_header,
    sweep_summary,
)

__all__ = [
    "LiveProgress",
    "SweepConsole",
    "all_failed_line",
    "counts_with_stale",
    "curves_data",
    "dashboard_app",
    "describe_fit",
    "failure_note",
    "fit_map_data",
    "format_audit",
    "format_counts",
    "format_data_nan_summary",
    "format_data_warnings",
    "format_dropped_rows",
    "format_duration",
    "format_front",
    "format_instability",
    "format_margin",
    "format_memory_prediction",
    "format_params",
    "format_trace",
    "format_trial_line",
    "front_axis",
    "front_data",
    "importance_data",
    "margin_line",
    "memory_line",
    "memory_prediction_data",
    "no_picks_reason",
    "picks",
    "publish_study",
    "render_html",
    "report_dict",
    "resume_lines",
    "serve",
    "status_label",
    "sweep_header",
    "sweep_summary",
    "trial_params",
    "trial_record",
    "write_html_report",
]
