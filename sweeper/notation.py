"""How the stability figures are written for people: the one place a margin, an instability, a headroom or a
predicted learning rate is rounded and spelled, for every view (the terminal, the HTML report, optuna-dashboard) and
every export's header.

The measures themselves are :mod:`sweeper.stability` (numbers, no text). This module sits below the readers rather
than in :mod:`sweeper.report` because the export (a layer below the report) and the picks' lines
(:mod:`sweeper.study.picks`) write the same figures the same way.
"""

from __future__ import annotations

import math

from sweeper.stability import Headroom, StabilityFigures


def format_instability(value: float | None) -> str:
    """An instability as shown everywhere: 3 decimals, ``0`` for exactly zero, and 3 significant digits below 0.001
    (``6.85e-05``), so that a trial on the front never reads as ``0.000`` beside one that is exactly 0 (which would
    make it look dominated). ``-`` when it is unknown (a trial that did not complete)."""
    if value is None or not isinstance(value, (int, float)):
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2e}" if abs(value) < 0.001 else f"{value:.3f}"


def format_headroom(headroom: Headroom | None, *, mark: bool = True) -> str:
    """A headroom with its interval as every view shows it (:func:`format_headroom_range`); ``mark`` adds ``near
    edge`` when it is :attr:`Headroom.near_edge`; ``-`` when unknown."""
    if headroom is None:
        return "-"
    high = None if headroom.capped else headroom.high
    return format_headroom_range(headroom.value, headroom.low, high, mark and headroom.near_edge, headroom.call)


def format_headroom_range(
    value: float | None, low: float | None, high: float | None, near_edge: bool | None, call: str | None = None
) -> str:
    """``16x (7.1-36x)``, ``>=42x (>=19x)`` without a high end (capped), with the call inside the parentheses when
    ``near_edge`` (not called safe): ``, undecided`` or ``, likely fails`` (``call``), ``, above edge`` when the
    headroom is below 1 (the trial's own rate is above its edge, ``predicted_max_lr``), ``, near edge`` for a trial
    stored without a call; ``-`` when unknown."""
    if value is None or low is None:
        return "-"
    near = (", above edge" if value < 1 else f", {call or 'near edge'}") if near_edge else ""
    if high is None:
        return f"{format_margin(value, True)} (>={format_margin(low)}{near})"
    return f"{format_margin(value)} ({format_margin(low)[:-1]}-{format_margin(high)}{near})"


def round_figure(x: float | None, digits: int) -> float | None:
    """``x`` as an export writes it: ``digits`` significant digits when ``digits`` > 4 (learning rates), else
    ``digits`` decimals (margins, headroom, fractions); None stays None."""
    return None if x is None else float(f"{x:.{digits}g}") if digits > 4 else round(x, digits)


def format_margin_range(
    value: float | None, capped: bool | None, low: float | None, high: float | None, *, source: bool = False
) -> str:
    """A margin with its interval, as every view shows it: ``5.8x (3.2-10x)``, ``>=643x (>=357x)`` when capped,
    the bare margin when it has no interval, ``-`` when unknown. ``source`` adds where the interval comes from
    (``, seed noise``)."""
    shown = format_margin(value, capped)
    if shown == "-" or low is None:
        return shown
    why = ", seed noise" if source else ""
    if capped or high is None:
        return f"{shown} (>={format_margin(low)}{why})"
    return f"{shown} ({format_margin(low)[:-1]}-{format_margin(high)}{why})"


def format_rate_range(value: float | None, low: float | None, high: float | None) -> str:
    """A predicted learning rate with its 95% interval: ``3.36e-03 (1.5e-03-7.5e-03)``, ``>=0.37 (>=0.17)`` for a
    lower bound (no high end), ``-`` when unknown."""
    if value is None or not math.isfinite(value):
        return "-"
    if low is None:
        return f"{value:.3g}"
    if high is None:
        return f">={value:.3g} (>={low:.2g})"
    return f"{value:.3g} ({low:.2g}-{high:.2g})"


def format_margin(value: float | None, capped: bool | None = False) -> str:
    """A margin as shown everywhere: ``12x``, ``3.4x``, ``>=57.7x`` when capped, ``-`` when unknown."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    shown = f"{value:.1f}x" if value < 10 else f"{value:.0f}x"
    return (">=" + shown) if capped else shown


def headroom_text(figures: StabilityFigures) -> str:
    """The headroom of ``figures`` with its interval as every view shows it (:func:`format_headroom_range`)."""
    return format_headroom_range(
        figures.headroom, figures.headroom_low, figures.headroom_high, figures.near_edge, figures.stability_call
    )


def format_chance(figures: StabilityFigures, *, call: bool = True) -> str:
    """The chance of diverging within the run with its interval and (``call``) its call, as every view shows it:
    ``12% (5.9-23%) undecided``, ``<0.1% (<0.1-0.3%) safe``, ``<=1% (...)`` when the margin was capped (an upper
    bound), ``fails`` for a trial that itself failed, ``-`` when unknown."""
    if figures.stability_call == "fails":
        return "fails"
    p, low, high = figures.p_diverge, figures.p_diverge_low, figures.p_diverge_high
    if p is None or low is None or high is None:
        return "-"
    if high < 0.001:
        shown = "<0.1%"
    else:
        bound = "<=" if figures.margin_capped and p >= 0.001 else ""
        shown = f"{bound}{_percent(p)} ({_percent(low)[:-1]}-{_percent(high)})"
    return f"{shown} {figures.stability_call}" if call and figures.stability_call else shown


def _percent(p: float) -> str:
    """A chance as a percentage: ``12%``, ``5.9%``, ``0.3%``, ``<0.1%``, ``99.4%``, ``>99.9%``."""
    if p < 0.001:
        return "<0.1%"
    if p > 0.999:
        return ">99.9%"
    x = 100 * p
    return f"{x:.0f}%" if 10 <= x < 99 else f"{x:.1f}%"


def edge_phrase(headroom: Headroom) -> str:
    """How a line names a trial :attr:`~sweeper.stability.Headroom.near_edge`: ``above its predicted edge`` when its
    headroom is below 1 (its own rate is over ``predicted_max_lr``, predicted to fail), else its call at its own
    rate (``undecided at its own rate``, ``likely fails at its own rate``), or ``near its edge`` without one."""
    if headroom.value < 1:
        return "above its predicted edge"
    return f"{headroom.call} at its own rate" if headroom.call else "near its edge"


def rounded(figures: StabilityFigures) -> StabilityFigures:
    """``figures`` as an export's header writes them: margins to 1 decimal, learning rates to 6 significant digits,
    headroom to 2 decimals; ``near_edge`` as measured (before rounding)."""
    return StabilityFigures(
        stability_margin=round_figure(figures.stability_margin, 1),
        margin_capped=figures.margin_capped,
        lr_ceiling=round_figure(figures.lr_ceiling, 6),
        predicted_max_lr=round_figure(figures.predicted_max_lr, 6),
        stability_margin_low=round_figure(figures.stability_margin_low, 1),
        stability_margin_high=round_figure(figures.stability_margin_high, 1),
        predicted_max_lr_low=round_figure(figures.predicted_max_lr_low, 6),
        predicted_max_lr_high=round_figure(figures.predicted_max_lr_high, 6),
        predicted_max_lr_source=figures.predicted_max_lr_source,
        headroom=round_figure(figures.headroom, 2),
        headroom_low=round_figure(figures.headroom_low, 2),
        headroom_high=round_figure(figures.headroom_high, 2),
        near_edge=figures.near_edge,
        horizon_steps=figures.horizon_steps,
        p_diverge=round_figure(figures.p_diverge, 4),
        p_diverge_low=round_figure(figures.p_diverge_low, 4),
        p_diverge_high=round_figure(figures.p_diverge_high, 4),
        stability_call=figures.stability_call,
        safe_learning_rate=round_figure(figures.safe_learning_rate, 6),
    )


def repeat_reason(measured: int, max_seq_length: int | None, measured_length: int | None, longest: int | None) -> str:
    """The reason a repeat of a measured configuration carries (its stored ``reason``, shown by every view): the
    same configuration as trial ``measured``, or, at another ``max_seq_length`` that trains the same rows on data
    whose longest sample has ``longest`` tokens, that settlement with the numbers that make it."""
    if max_seq_length != measured_length and longest is not None:
        return (
            f"max_seq_length {max_seq_length} trains the same rows as {measured_length} on this data (longest "
            f"{longest:,} tokens): trial {measured}'s result is reused"
        )
    return f"same configuration as trial {measured}: its result is reused"
