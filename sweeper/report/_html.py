"""The self-contained HTML report: the figures of :mod:`sweeper.report._figures` (plotly, with plotly.js inlined so
it opens offline), the front's table, the memory predictions and the notes, in one file.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeper.notation import format_chance, format_instability, format_rate_range, headroom_text
from sweeper.report import _data as data
from sweeper.report._analysis_records import MemoryPrediction
from sweeper.report._console import margin_text, plural
from sweeper.report._figures import curves_figure, fit_map_figure, front_figure, importance_figure
from sweeper.report._importance import IMPORTANCE_RESAMPLES, MIN_IMPORTANCE_TRIALS
from sweeper.report._records import FrontRow, Report
from sweeper.stability import DEFAULT_HORIZON_STEPS
from sweeper.study import StudySnapshot


def _table(rows: Sequence[Sequence[Any]]) -> str:
    head, *body = rows
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(str(c))}</th>" for c in head) + "</tr></thead><tbody>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in body]
    return "\n".join(out) + "</tbody></table>"


def _memory_section(prediction: MemoryPrediction) -> str:
    """The preflight's predictions against the measured peaks (:func:`sweeper.report._data.memory_prediction_data`)
    as HTML: the median errors and one row per complete trial."""
    from sweeper.report._memory_text import format_memory_prediction

    line = format_memory_prediction(prediction)
    if line is None:
        return "<p>No complete trial with a prediction.</p>"

    def gib(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:+.0f}%"

    rows: list[list[Any]] = [["trial", "memory model GiB", "error", "corrected GiB", "error", "measured GiB", "kind"]]
    rows += [
        [
            r.number,
            gib(r.predicted_gib),
            pct(r.error),
            gib(r.corrected_gib),
            pct(r.corrected_error),
            gib(r.measured_gib),
            r.memory_kind or "-",
        ]
        for r in prediction.trials
    ]
    return (
        f"<p>{html.escape(line.removeprefix('memory  '))}. The preflight corrects the memory model by what the study's "
        "complete trials measured (per compute dtype and checkpointing: the median measured/predicted ratio, or a "
        "line through the measured peaks once their predictions spread); each corrected value is the one it used "
        "before the trial ran.</p>\n" + _table(rows)
    )


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _front_rows(summary: Report, keys: list[str], off_front: Sequence[FrontRow] = ()) -> list[list[Any]]:
    """The HTML report's front table (:attr:`sweeper.report._records.Report.front`): a header row, then per trial its
    searched ``keys``, peak memory, margin, headroom, the chance of diverging within the study's horizon with its
    call, the safe rate, ceiling, predicted max rate (the edge), progress, instability, confirmation and
    the picks that choose it; ``off_front``, picked trials that are not on the front (the ``safe`` pick chooses among
    every complete trial), in order of peak memory among them, their picks marked ``(off the front)``."""
    from sweeper.report._console import SHORT_NAMES

    by_trial: dict[int, list[str]] = {}
    for name, number in summary.picks.items():
        by_trial.setdefault(number, []).append(name)
    header = [
        "trial",
        *[SHORT_NAMES.get(k, k) for k in keys],
        "peak_memory_gib",
        "stability_margin (seed noise)",
        "headroom (95%)",
        f"P(diverge within {_horizon(summary)} steps) (95%), call",
        "safe_learning_rate",
        "tied with",
        "lr_ceiling",
        "predicted_max_lr (95%)",
        "learns",
        "instability",
        "confirmed",
        "pick",
    ]
    rows = sorted([*summary.front, *off_front], key=lambda f: f.peak_memory_gib)
    extra = {f.number for f in off_front}
    return [header] + [
        _front_row(f, keys, [f"{p} (off the front)" if f.number in extra else p for p in by_trial.get(f.number, [])])
        for f in rows
    ]


def _horizon(summary: Report) -> int:
    """The horizon the front's chances are given at (one per study: its ``confirm_steps``, else 400)."""
    return next(
        (f.stability.horizon_steps for f in summary.front if f.stability.horizon_steps is not None),
        DEFAULT_HORIZON_STEPS,
    )


def _sources(summary: Report) -> str:
    """`` predicted_max_lr: uncalibrated: factor from ...``: which factor made the front's predictions, once."""
    sources = sorted(
        {f.stability.predicted_max_lr_source for f in summary.front if f.stability.predicted_max_lr_source}
    )
    return f" predicted_max_lr: {'; '.join(sources)}." if sources else ""


def _front_row(f: FrontRow, keys: list[str], picked: list[str]) -> list[Any]:
    from sweeper.report._console import _fmt

    return [
        f.number,
        *[_fmt(f.params.get(k)) for k in keys],
        f"{f.peak_memory_gib:.3f}",
        margin_text(f.stability),
        headroom_text(f.stability),
        format_chance(f.stability),
        _fmt_rate(f.stability.safe_learning_rate),
        ", ".join(f"#{n}" for n in f.tied_with) or "-",
        _fmt_rate(f.stability.lr_ceiling),
        # its source (which factor made it) is said once under the table: in each cell it ran the table off the page
        format_rate_range(
            f.stability.predicted_max_lr, f.stability.predicted_max_lr_low, f.stability.predicted_max_lr_high
        ),
        "-" if f.learning_progress is None else f"{100 * f.learning_progress:.0f}%",
        format_instability(f.instability),
        f.confirmation.label if f.confirmation else "-",
        ", ".join(picked),
    ]


def render_html(study: StudySnapshot) -> str:
    """The whole report as one HTML page: front table, counts, fit frontier, and the four figures, with plotly.js
    inline (about 4.7 MB) so that it opens offline."""
    import plotly.io as pio

    summary = data.report_data(study)
    fit_map = data.fit_map_data(study)
    figures = [
        front_figure(data.front_data(study)),
        fit_map_figure(fit_map),
        curves_figure(data.curves_data(study)),
        importance_figure(summary.importance),
    ]
    divs = [
        pio.to_html(
            fig, full_html=False, include_plotlyjs=(i == 0), div_id=f"figure-{i}", config={"displaylogo": False}
        )
        for i, fig in enumerate(figures)
    ]
    counts = " · ".join(f"{k} {v}" for k, v in summary.status_counts.items())
    causes = ", ".join(f"{k} {len(v)}" for k, v in summary.nan_causes.items()) or "none"
    fit = ", ".join(f"batch {b}: {s}" for b, s in data.describe_fit(fit_map).items())
    failed = [t for t in summary.trials if t.state != "COMPLETE"]
    failed_rows = [["trial", "status", "reason"]] + [[t.number, t.label, t.reason] for t in failed]
    title = f"sweeper report: {html.escape(study.name)}"
    other = (
        f"<p><b>{html.escape(summary.other_setups.removeprefix('note    '))}</b>.</p>" if summary.other_setups else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}}p,ul,h1,h2{{max-width:1200px}}table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 5px;text-align:right}}th{{background:#f3f3f3}}
.wide{{overflow-x:auto;max-width:100%}}.wide td{{white-space:nowrap}}
.wide td:last-child{{white-space:normal;text-align:left}}</style></head>
<body><h1>{title}</h1>
<p>Generated {time.strftime("%Y-%m-%d %H:%M:%S")}. Objectives, both minimized: {
        html.escape(", ".join(summary.objectives))
    } (edge_proximity = 1 / stability_margin: the learning rate over the rate its stress phase diverged at).</p>
{_front_section(study, summary)}
<p>Trials by status: {html.escape(counts)}. NaN causes: {html.escape(causes)}.</p>
{other}
<p>Largest max_seq_length that fit, per batch size: {html.escape(fit) or "none measured"}.</p>
{divs[0]}
<h2 id="fit-map">Fit map</h2>{divs[1]}
<h2 id="curves">Curves</h2>{divs[2]}
{_importance_section(summary, divs[3])}
<h2 id="memory">Predicted vs measured peak memory</h2>{_memory_section(summary.memory_prediction)}
<h2 id="failed">Pruned and failed trials</h2>{_table(failed_rows) if failed else "<p>none</p>"}
<script type="application/json" id="report-data">{html.escape(json.dumps(summary.to_dict()))}</script>
</body></html>
"""


def _front_section(study: StudySnapshot, summary: Report) -> str:
    """The front's heading and table (the front, then the picks off it), its columns' names and sources, and the
    picks with what each means."""
    from sweeper.report._console import SHORT_NAMES

    keys = list(summary.front[0].params) if summary.front else []
    picked = data.picked_off_front(study, summary.picks)
    shown = [*study.front, *picked]
    off_front = [
        data.front_row(t, study.searched, study.objectives, ties)
        for t, ties in zip(picked, study.ties_on_stability(picked, shown))
    ]
    front_rows = _front_rows(summary, keys, off_front)
    return f"""<h2 id="front">Pareto front ({len(summary.front)} of {plural(len(summary.trials), "trial")})</h2>
<div class="wide">{_table(front_rows)}</div>
<p>Columns: {html.escape(", ".join(f"{SHORT_NAMES[k]} = {k}" for k in keys if SHORT_NAMES.get(k, k) != k))}.{
        html.escape(_sources(summary))
    }</p>
<p>Picks (<code>sweep export {html.escape(study.name)}</code> writes <code>safe</code>; <code>--pick NAME</code>
another): {"".join(f"<br>{html.escape(line)}" for line in summary.pick_lines.values()) or "none"}.<br>safe: the least
memory among the trials called safe (the 95% upper end of their chance of diverging within the study's horizon under
5%) that learn at least half as fast as the fastest of them, within 10% of that memory (the seed's noise on the
measured peak) the one that learns most.
The knee is the front's point nearest the ideal after scaling both objectives to [0, 1]. Picks prefer a confirmed
trial when it is as good within the noise, and say so.</p>"""


def _importance_section(summary: Report, figure: str) -> str:
    """The importance's heading, what each objective's importance is computed from, and its figure."""
    n_complete = sum(1 for t in summary.trials if t.state == "COMPLETE")
    return f"""<h2 id="importance">What explains each objective</h2>
<p>Peak memory: how much each searched setting moves the memory model's predicted peak, at this study's own
configurations (the spread over the setting's searched values, median over the configurations; a setting no tensor's
size depends on, such as lora_alpha/r, moves it by 0). Stability: optuna's importance (PED-ANOVA) over the {n_complete}
complete trials, shown from {MIN_IMPORTANCE_TRIALS} of them, with a 90% interval from {IMPORTANCE_RESAMPLES} bootstrap
resamples of the trials.</p>
{figure}"""


def write_html_report(study: StudySnapshot, path: str | Path) -> Path:
    """Write :func:`render_html` to ``path`` (through a temporary file and a rename: an earlier report is never
    left half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(study), encoding="utf-8")
    os.replace(tmp, path)
    return path
