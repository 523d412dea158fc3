"""Figures of a study (plotly): the second step after :mod:`sweeper.report._data`, which computes each figure's
data as a record (:mod:`sweeper.report._records`); :mod:`sweeper.report._html` puts them in the HTML report.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from sweeper.notation import format_chance, format_instability, format_margin, headroom_text
from sweeper.report._analysis_records import Curve, FitMap, MemoryEffects, NotShown, ParamImportance
from sweeper.report._console import margin_text
from sweeper.report._records import FrontData, ImportancePart, TrialRecord

#: The front figure's height of a point: its stability margin, or a pre-margin study's instability (None: unknown).
Height: TypeAlias = Callable[[TrialRecord], float | None]


#: Marker per status in the front figure (plotly symbol names).
SYMBOLS = {
    "complete": "circle",
    "nan": "x",
    "diverged": "x-open",
    "oom": "triangle-up",
    "timeout": "hourglass",
    "crash": "star",
    "error": "square",
    "predicted_oom": "triangle-up-open",
    "dominated_oom": "triangle-down-open",
}


COLORS = {
    "front": "#d62728",
    "complete": "#1f77b4",
    "nan": "#ff7f0e",
    "diverged": "#9467bd",
    "oom": "#7f7f7f",
    "fits": "#2ca02c",
    "not_tried": "#eeeeee",
}


def _hover(point: TrialRecord) -> str:
    params = "<br>".join(f"{k}={v}" for k, v in point.params.items())
    memory = "-" if point.peak_memory_gib is None else f"{point.peak_memory_gib:.3f} GiB"
    if point.predicted_peak_gib is not None:
        memory += f" (predicted {point.predicted_peak_gib:.2f})"
    phases = point.phases_line()
    if phases:
        memory += f"<br>{phases}"
    stability = format_instability(point.instability)
    if point.stability.stability_margin is not None:
        stability = f"margin {margin_text(point.stability)}, " + stability
    reason = html.escape(point.reason)[:200]
    confirmed = point.confirmation
    long = ""
    if confirmed:
        long = f"<br>confirmed at {confirmed.steps} steps: {html.escape(str(confirmed.status))}"
        if not confirmed.passed:
            long += f" at step {confirmed.fail_step}"
    if point.stability.headroom is not None:
        long += f"<br>headroom {headroom_text(point.stability)}"
    if point.stability.stability_call is not None:
        long += f"<br>P(diverges within {point.stability.horizon_steps} steps) {format_chance(point.stability)}"
    return f"trial {point.number}: {point.label}<br>peak {memory}, margin {stability}{long}<br>{params}<br>{reason}"


def _margin(point: TrialRecord) -> float | None:
    return point.stability.stability_margin


def _instability(point: TrialRecord) -> float | None:
    return point.instability


def front_figure(front: FrontData) -> Any:
    """Peak memory (x) against the stability margin (y, log axis, higher is safer) for every trial of
    :func:`sweeper.report._data.front_data`: the front as a red line, other complete trials in blue, pruned and failed
    trials where their memory is known in a band below a margin of 1 (they failed at their own rate), one marker per
    status (NaN cause in the hover and legend). A study written before the margin plots its instability instead
    (linear, lower is better, failures in a band above)."""
    import plotly.graph_objects as go

    points = front.points
    margin = front.ranks_by_margin
    height: Height = _margin if margin else _instability
    complete = [(p, y) for p in points if (y := height(p)) is not None]
    on_front = sorted(((p, y) for p, y in complete if p.on_front), key=lambda py: py[0].peak_memory_gib or 0.0)
    if margin:
        band = min([0.7, *(y / 1.6 for _, y in complete)])
    else:
        band = max((y for _, y in complete), default=1.0) * 1.15 + 0.05
    fig = go.Figure()
    for trace in (
        *_complete_traces(complete, on_front, margin),
        *_confirmation_traces(complete),
        *_near_edge_traces(complete),
        *_failed_traces(points, band, height, margin),
    ):
        fig.add_trace(trace)
    limit = front.memory_limit_gib
    if limit is not None:
        fig.add_vline(
            x=limit,
            line_dash="dash",
            line_color="#7f7f7f",
            annotation_text=f"memory_limit_gib {limit:g}"
            + (" (on private memory; the peaks count shared libraries)" if front.memory_kind == "cpu_peak_rss" else "")
            + "".join(
                f" of the card's {gib:.2f} GiB ({name})"
                for name, (device, gib) in front.cards.items()
                if device == "cuda"
            ),
            annotation_position="bottom left" if margin else "top left",
        )
    knee, safe = front.knee, front.picks.get("safe")
    for p, y in complete:
        # The knee, and the safe pick (sweep export's default) wherever it lies: below it when both are one trial.
        marks = (("knee", knee if p.on_front else None), ("safe", safe))
        names = [n for n, number in marks if p.number == number]
        if names:
            fig.add_annotation(
                x=p.peak_memory_gib,
                y=math.log10(y) if margin else y,
                text=" · ".join(names),
                showarrow=True,
                arrowhead=2,
                ax=-45 if margin else 40,
                ay=-35 if margin else -40,
            )
    kind = front.memory_kind or "peak memory"
    fig.update_layout(
        title=(
            "Peak memory against stability margin (upper left is better)"
            if margin
            else "Peak memory against instability (lower left is better)"
        ),
        xaxis_title=f"peak_memory_gib ({kind})",
        yaxis_title="stability_margin (x the trial's learning rate, log)" if margin else "instability",
        template="plotly_white",
        height=480,
    )
    if margin:
        fig.update_yaxes(type="log", dtick=1)  # ticks at 1, 10, 100 ...: no unlabelled minor values
    return fig


def _scatter(points: Sequence[tuple[TrialRecord, float]], **style: Any) -> Any:
    """A plotly scatter of ``points`` (each trial with its height) at their peak memory, hovering each trial's
    text (:func:`_hover`), styled by ``style``."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[p.peak_memory_gib for p, _ in points],
        y=[y for _, y in points],
        **style,
        hovertext=[_hover(p) for p, _ in points],
        hoverinfo="text",
    )


def _complete_traces(
    complete: Sequence[tuple[TrialRecord, float]], on_front: Sequence[tuple[TrialRecord, float]], margin: bool
) -> list[Any]:
    """Of :func:`front_figure`: the complete trials (each with its height) off the front in blue, then the front (by
    memory) as a red line labelled with the trial numbers and, when ``margin``, each point's margin ("#4 5.8x"): a
    log axis ticked at its decades only would leave a 61x point between the 10 and 100 ticks unread."""

    traces = []
    rest = [(p, y) for p, y in complete if not p.on_front]
    if rest:
        traces.append(_scatter(rest, mode="markers", name="complete", marker={"color": COLORS["complete"], "size": 9}))
    if on_front:
        traces.append(
            _scatter(
                on_front,
                mode="lines+markers+text",
                name="Pareto front",
                text=[f"#{p.number} {format_margin(y)}" if margin else f"#{p.number}" for p, y in on_front],
                # beside its marker, not over it (the near-edge square around a point is wider than the point)
                textposition="middle right",
                line={"color": COLORS["front"]},
                marker={"color": COLORS["front"], "size": 12},
            )
        )
    return traces


def _near_edge_traces(complete: Sequence[tuple[TrialRecord, float]]) -> list[Any]:
    """Of :func:`front_figure`: an orange square around each complete trial not called safe (its chance of
    diverging within the study's horizon undecided or likely to fail), the mark the front table's headroom column
    gives it."""
    import plotly.graph_objects as go

    group = [(p, y) for p, y in complete if p.stability.near_edge]
    if not group:
        return []
    return [
        go.Scatter(
            x=[p.peak_memory_gib for p, _ in group],
            y=[y for _, y in group],
            mode="markers",
            name="not safe (P(diverge) undecided or likely fails)",
            marker={"symbol": "square-open", "size": 22, "color": "#ff7f0e", "line": {"width": 2}},
            hovertext=[_hover(p) for p, _ in group],
            hoverinfo="text",
        )
    ]


def _confirmation_traces(complete: Sequence[tuple[TrialRecord, float]]) -> list[Any]:
    """Of :func:`front_figure`: rings around the complete trials whose long run passed, crosses where it failed."""
    import plotly.graph_objects as go

    traces = []
    for passed, name, symbol, color in (
        (True, "confirmed: the long run completed", "circle-open", "#2ca02c"),
        (False, "failed its confirmation (long run)", "x-open", "#d62728"),
    ):
        group = [(p, y) for p, y in complete if p.confirmation is not None and p.confirmation.passed == passed]
        if group:
            traces.append(
                go.Scatter(
                    x=[p.peak_memory_gib for p, _ in group],
                    y=[y for _, y in group],
                    mode="markers",
                    name=name,
                    marker={"symbol": symbol, "size": 22, "color": color, "line": {"width": 3}},
                    hovertext=[_hover(p) for p, _ in group],
                    hoverinfo="text",
                )
            )
    return traces


def _failed_traces(points: Sequence[TrialRecord], band: float, height: Height, margin: bool) -> list[Any]:
    """Of :func:`front_figure`: the trials with no height (no margin, or no instability when not ``margin``) but a
    known memory, at height ``band``, one trace per label (so a NaN's cause shows in the legend), one marker per
    status."""
    import plotly.graph_objects as go

    failed = [p for p in points if height(p) is None and p.peak_memory_gib is not None]
    traces = []
    for label in sorted({p.label for p in failed}):
        group = [p for p in failed if p.label == label]
        status = group[0].status or ""
        traces.append(
            go.Scatter(
                x=[p.peak_memory_gib for p in group],
                y=[band] * len(group),
                mode="markers",
                name=f"{label} (no {'margin' if margin else 'instability'})",
                marker={"symbol": SYMBOLS.get(status, "diamond"), "size": 12, "color": COLORS.get(status, "#9467bd")},
                hovertext=[_hover(p) for p in group],
                hoverinfo="text",
            )
        )
    return traces


def fit_map_figure(fit: FitMap) -> Any:
    """A grid of per_device_train_batch_size (rows) x max_seq_length (columns): green fits (with the measured peak
    range), grey OOM, blank not tried."""
    import plotly.graph_objects as go

    batches, lengths = fit.batch_sizes, fit.max_seq_lengths
    z, text = [], []
    for b in batches:
        row_z, row_t = [], []
        for s in lengths:
            c = fit.cell(b, s)
            if c is None:
                row_z.append(0)
                row_t.append("not tried")
            elif c.state == "fits":
                row_z.append(2)
                lo, hi = c.min_peak_memory_gib, c.max_peak_memory_gib
                peak = "" if lo is None else (f"{lo:.2f}" if lo == hi else f"{lo:.2f}-{hi:.2f}") + " GiB"
                row_t.append(f"fits {peak}" + (f" ({c.ooms} OOM)" if c.ooms else ""))
            else:
                row_z.append(1)
                row_t.append(f"OOM ({c.ooms})")
        z.append(row_z)
        text.append(row_t)
    colorscale = [[0, COLORS["not_tried"]], [0.5, COLORS["oom"]], [1, COLORS["fits"]]]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[str(s) for s in lengths],
            y=[str(b) for b in batches],
            text=text,
            texttemplate="%{text}",
            zmin=0,
            zmax=2,
            colorscale=colorscale,
            showscale=False,
            hovertemplate="batch %{y} x %{x} tokens: %{text}<extra></extra>",
        )
    )
    cap = "" if fit.memory_limit_gib is None else f" of {fit.memory_limit_gib:g} GiB"
    fig.update_layout(
        title=f"What fits the memory cap{cap}"
        + ("<br><sup>CPU: the cap is on private memory; the peaks count shared libraries too</sup>" if fit.cpu else ""),
        xaxis_title="max_seq_length",
        xaxis_type="category",
        yaxis_title="per_device_train_batch_size",
        yaxis_type="category",
        template="plotly_white",
        # At least 200 px of cells between the title and the axis (a one-row map was a 2-px line whose text and
        # axis title did not fit), 70 px a row beyond.
        height=max(320, 180 + 70 * len(batches)),
        margin={"t": 60, "b": 60},
    )
    return fig


def curves_figure(curves: Sequence[Curve]) -> Any:
    """Loss (left) and pre-clip gradient norm (right, log scale) per step for the front's and the NaN trials; a NaN
    trial's failing step is a gap."""
    import plotly.colors
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    palette = plotly.colors.qualitative.Plotly
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "gradient norm (before clipping)"))
    for i, c in enumerate(curves):
        line = {"dash": "solid" if c.kind == "front" else "dot", "color": palette[i % len(palette)]}
        steps = list(range(1, max(len(c.loss), len(c.grad_norm)) + 1))
        fig.add_trace(
            go.Scatter(x=steps, y=list(c.loss), mode="lines+markers", name=c.label, legendgroup=c.label, line=line),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=steps,
                y=list(c.grad_norm),
                mode="lines+markers",
                name=c.label,
                legendgroup=c.label,
                showlegend=False,
                line=line,
            ),
            row=1,
            col=2,
        )
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_layout(
        title="Curves of the front (solid) and of failed trials (dotted: NaN or diverged, up to the failing step)",
        template="plotly_white",
        height=420,
    )
    return fig


def importance_figure(importance: Mapping[str, ImportancePart]) -> Any:
    """Two panels (:func:`sweeper.report._importance.importance_data`): what moves the predicted peak memory, in GiB, by
    the memory model at the study's configurations; and optuna's importance of the stability objective with its
    bootstrap interval, or the reason it is not shown."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(importance)
    titles = [
        "peak memory: spread of the predicted peak (GiB)" if i == 0 else f"{name}: importance (PED-ANOVA, 90% interval)"
        for i, name in enumerate(names)
    ]
    # One panel under the other: side by side, a panel's long setting names and its title did not fit at 900 px.
    fig = make_subplots(rows=max(1, len(names)), cols=1, subplot_titles=titles or [""], vertical_spacing=0.25)
    for i, (name, part) in enumerate(importance.items(), 1):
        if isinstance(part, NotShown):
            panel = fig.get_subplot(i, 1)
            fig.add_annotation(
                text="not shown: " + part.reason,
                xref="paper",
                yref="paper",
                x=0.5,
                y=sum(panel.yaxis.domain) / 2,  # the middle of its own panel
                showarrow=False,
            )
            fig.update_xaxes(visible=False, row=i, col=1)  # no empty axes under the reason
            fig.update_yaxes(visible=False, row=i, col=1)
            continue
        values = part.effects_gib if isinstance(part, MemoryEffects) else part.importance
        items = sorted(values.items(), key=lambda kv: kv[1])
        error = None
        if isinstance(part, ParamImportance):
            low = [v - part.interval[k][0] for k, v in items]
            high = [part.interval[k][1] - v for k, v in items]
            error = {"type": "data", "symmetric": False, "array": high, "arrayminus": low}
        fig.add_trace(
            go.Bar(
                x=[v for _, v in items],
                y=[k for k, _ in items],
                orientation="h",
                name=name,
                showlegend=False,
                error_x=error,
            ),
            row=i,
            col=1,
        )
    fig.update_layout(title="What explains each objective", template="plotly_white", height=160 + 220 * len(names))
    return fig
