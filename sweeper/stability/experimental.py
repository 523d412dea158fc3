"""Experimental (no interface promise until promoted): the critical learning rate, how far along the optimizer's
own next update the loss keeps falling. Its registered comparison with the stability margin (issue 54,
docs/validity.md) found it the weaker predictor of the long run (AUC 0.752/0.870 against 0.945/0.998) at 13-37% of
the constant phase, so no trial reads it unless its job asks (``Measures(experimental=("critical_lr",))``, which
warns :class:`sweeper.errors.ExperimentalWarning`), and its figures are stored under ``experimental`` outside the
stable stored attributes (docs/contract.md). ``benchmarks/stability/critical_lr.py`` and its results hold the
registered comparison.

Kalra et al., "A scalable measure of loss landscape curvature" (arXiv 2601.16979, 2026): the critical learning rate
is the smallest step along the optimizer's update direction at which the loss rises after the step. It is found by a
line search in forward passes only (no Hessian-vector products, so frozen 4-bit layers do not stand in its way), and
progressive sharpening shows as the critical rate falling over training.

A trial reads it at a few points of its constant phase (:func:`line_search_points`) on each of the probe's rows: at
each point the adapter's next update ``d`` (what the optimizer is about to apply at the trial's rate, computed and
not applied) is scaled by multiples ``m`` and the row's loss at ``theta + m d`` compared with its loss at ``theta``
(:func:`critical_multiples`). The smallest multiple at which it rises, in units of the trial's learning rate, is a
*reading*; :func:`critical_rate_of` summarizes the readings (their median, their spread, and their trend over the
constant phase projected to the step at which the critical multiple would fall to 1, the trial's own rate).

Pure (no torch): the search takes the forward pass as a function, so it tests on synthetic losses in milliseconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: Factor between the multiples of the coarse search; each bracket is then halved (geometrically) once, so a reading
#: is good to a factor of 2, about the stress ladder's 1.8 (the bracket's geometric middle is reported, sqrt(2) from
#: either end). Each refinement costs a forward per distinct bracket.
COARSE_FACTOR = 4.0
REFINEMENTS = 1
#: The search's range, in multiples of the trial's learning rate: a row whose loss still falls at the largest is
#: read as above it (censored), one whose loss rises at the smallest as below it.
MAX_MULTIPLE = 4.0**6
MIN_MULTIPLE = 4.0**-2
#: Line-search points in the constant phase (at least 3; the last is the constant phase's last update).
LINE_SEARCH_POINTS = 3
#: A projected crossing further than this many times the constant phase's steps away is "not within the horizon".
PROJECTION_HORIZON = 20.0


def line_search_points(max_steps: int, points: int = LINE_SEARCH_POINTS) -> list[int]:
    """The optimizer steps (1-based) before whose update the line search runs: ``points`` steps spread evenly over
    ``[2, max_steps]``, the last ``max_steps`` (the constant phase's last update); fewer when there are fewer steps
    (step 1 is left out: Adam's first update is its sign, whatever the curvature).

    Args:
        max_steps: The constant phase's optimizer steps (>= 1).
        points: How many (>= 1).

    Returns:
        Increasing distinct steps; empty when ``max_steps < 2``.
    """
    if max_steps < 2:
        return []
    if points == 1:
        return [max_steps]
    chosen = {round(2 + (max_steps - 2) * i / (points - 1)) for i in range(points)}
    return sorted(chosen)


@dataclass(frozen=True)
class Bracket:
    """One row's reading: the largest multiple at which its loss was seen to fall (``held``) and the smallest at which
    it rose (``rose``); either None where the search's range ended first."""

    held: float | None
    rose: float | None

    @property
    def multiple(self) -> float | None:
        """The critical multiple: the bracket's geometric middle; the range's end where the bracket is open (a
        censored reading: ``MAX_MULTIPLE`` when it never rose, ``MIN_MULTIPLE`` when it always rose); None when
        neither side was seen."""
        if self.held is not None and self.rose is not None:
            return math.sqrt(self.held * self.rose)
        if self.rose is None and self.held is not None:
            return self.held
        if self.held is None and self.rose is not None:
            return self.rose
        return None

    @property
    def censored(self) -> bool:
        """The bracket is open on one side (the reading is a bound)."""
        return (self.held is None) != (self.rose is None)


def critical_multiples(
    evaluate: Callable[[float], Sequence[float]],
    start: float = 1.0,
    *,
    coarse: float = COARSE_FACTOR,
    refinements: int = REFINEMENTS,
    max_multiple: float = MAX_MULTIPLE,
    min_multiple: float = MIN_MULTIPLE,
) -> tuple[list[Bracket], int]:
    """Line-search the critical multiple of each batch along one update direction, in forward passes.

    ``evaluate(m)`` returns each batch's loss at ``theta + m d`` (``m = 0``: at ``theta``); a batch's loss *rises* at
    ``m`` when it is above its loss at 0 or not finite. Multiples are searched by ``coarse`` steps from ``start``
    (up while some batch has not risen, down while some batch rose at every multiple tried), then each distinct
    bracket is halved geometrically ``refinements`` times. Every forward serves every batch.

    Args:
        evaluate: The batches' losses at a multiple of the update (one forward each call).
        start: The first multiple tried (> 0): the last reading's, to save forwards.
        coarse, refinements, max_multiple, min_multiple: The search (module constants by default).

    Returns:
        Each batch's :class:`Bracket`, and the forwards spent (``evaluate`` calls, the one at 0 included).

    Raises:
        ValueError: ``start`` is not positive, or the losses at 0 are not finite (there is nothing to compare with).
    """
    if not start > 0:
        raise ValueError(f"start must be > 0, but got {start}")
    base = list(evaluate(0.0))
    if not all(math.isfinite(x) for x in base):
        raise ValueError(f"the losses at the current weights must be finite, but got {base}")
    n = len(base)
    held: list[float | None] = [None] * n
    rose: list[float | None] = [None] * n
    calls = 1

    def probe(m: float) -> None:
        nonlocal calls
        calls += 1
        for i, x in enumerate(evaluate(m)):
            if not math.isfinite(x) or x > base[i]:
                rose[i] = m if rose[i] is None else min(rose[i], m)  # type: ignore[type-var]
            elif rose[i] is None or m < rose[i]:  # type: ignore[operator]
                held[i] = m if held[i] is None else max(held[i], m)  # type: ignore[type-var]

    m = min(max(start, min_multiple), max_multiple)
    probe(m)
    up = m
    while any(r is None for r in rose) and up * coarse <= max_multiple * (1 + 1e-9):
        up *= coarse
        probe(up)
    down = m
    while any(h is None for h in held) and down / coarse >= min_multiple * (1 - 1e-9):
        down /= coarse
        probe(down)
    for _ in range(refinements):
        mids = sorted(
            {math.sqrt(h * r) for h, r in zip(held, rose) if h is not None and r is not None and r / h > 1.0 + 1e-9}
        )
        for mid in mids:
            probe(mid)
    return [Bracket(h if r is None or h is None or h < r else None, r) for h, r in zip(held, rose)], calls


@dataclass(frozen=True)
class CriticalRate:
    """The critical learning rate of a trial, as multiples of its own learning rate.

    Attributes:
        multiple: The median reading over every point and row (x the trial's rate); None without a reading.
        multiple_low, multiple_high: The readings' own spread: the smallest and the largest reading of the last point
            (the constant phase's end, where the figure applies), widened by half a bracket (``sqrt(2)``) each side,
            the search's resolution.
        end_multiple: The median reading at the last point.
        slope_per_step: The trend of log(multiple) per optimizer step (least squares over every uncensored
            reading); negative when the critical rate falls (progressive sharpening). None with fewer than 2 points.
        projected_step: The optimizer step at which the trend meets the trial's own rate (multiple 1), None when it is
            not falling or would meet it beyond :data:`PROJECTION_HORIZON` times the constant phase.
        projected_step_low, projected_step_high: Its interval from the slope's standard error (t at 95%, or the
            horizon where the slope's interval reaches 0).
        readings: ``(step, row, multiple, censored)`` for each reading.
        forwards: Forward passes the line searches took.
    """

    multiple: float | None
    multiple_low: float | None
    multiple_high: float | None
    end_multiple: float | None
    slope_per_step: float | None
    projected_step: int | None
    projected_step_low: int | None
    projected_step_high: int | None
    readings: tuple[tuple[int, int, float, bool], ...]
    forwards: int


def critical_rate_of(
    readings: Sequence[tuple[int, int, float, bool]], max_steps: int, forwards: int = 0
) -> CriticalRate:
    """Summarize line-search readings (:class:`CriticalRate`).

    Args:
        readings: ``(step, row, multiple, censored)``: the optimizer step before whose update it was read, the probe
            row, the critical multiple (> 0) and whether it is a bound.
        max_steps: The constant phase's steps (the projection's horizon is :data:`PROJECTION_HORIZON` times it).
        forwards: Forward passes spent, carried into the result.

    Returns:
        The summary; every field None when ``readings`` is empty.
    """
    if not readings:
        return CriticalRate(None, None, None, None, None, None, None, None, (), forwards)
    multiples = [m for _, _, m, _ in readings]
    last = max(s for s, _, _, _ in readings)
    at_end = [m for s, _, m, _ in readings if s == last]
    step_res = math.sqrt(2.0)
    low, high = min(at_end) / step_res, max(at_end) * step_res
    slope = projected = p_low = p_high = None
    pts = [(float(s), math.log(m)) for s, _, m, c in readings if not c]
    if len({s for s, _ in pts}) >= 2:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        intercept = my - slope * mx
        horizon = PROJECTION_HORIZON * max_steps
        dof = len(pts) - 2
        resid = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
        se = math.sqrt(resid / dof / sxx) if dof > 0 else math.inf
        t = _t95(dof)

        def meets(b: float) -> float | None:  # the step where the line through the readings' centre meets log 1
            if b >= 0:
                return None
            step = mx + (0.0 - my) / b
            return step if step <= horizon else None

        centre = meets(slope)
        if centre is not None:
            projected = max(round(centre), last)
            steep = meets(slope - t * se)
            shallow = meets(slope + t * se)
            p_low = max(round(steep), last) if steep is not None else last
            p_high = round(shallow) if shallow is not None else None
    return CriticalRate(
        multiple=statistics.median(multiples),
        multiple_low=low,
        multiple_high=high,
        end_multiple=statistics.median(at_end),
        slope_per_step=slope,
        projected_step=projected,
        projected_step_low=p_low,
        projected_step_high=p_high,
        readings=tuple(readings),
        forwards=forwards,
    )


def _t95(dof: int) -> float:
    """Student's t at 97.5% for ``dof`` degrees of freedom (inf for none); a table, to keep scipy out."""
    table = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23}
    if dof <= 0:
        return math.inf
    return table.get(dof, 2.0 if dof > 30 else 2.1)
