"""The Pareto front's volume: the hypervolume a set of trials dominates, its reference point, and how far a study's
latest trials moved it (the ``front`` line of ``sweep run``). Where the front itself is (dominance within each
objective's noise) is :mod:`sweeper.study._front`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sweeper.storage import wfg_hypervolume
from sweeper.study._objectives import Objective


def hypervolume(points: Sequence[Sequence[float]], reference: Sequence[float]) -> float:
    """The hypervolume dominated by ``points`` (each objective minimized) and bounded by ``reference``, by Optuna's
    WFG (While et al. 2012; :func:`sweeper.storage.wfg_hypervolume`), which its own hypervolume-history plot and
    NSGA-III use. Points not better than ``reference`` on every objective add nothing (0.0 when none is).

    Args:
        points: One row per trial, one column per objective, in the objectives' units.
        reference: One value per objective, worse than every point that should count.
    """
    inside = [list(p) for p in points if all(x < r for x, r in zip(p, reference))]
    if not inside:
        return 0.0
    return wfg_hypervolume(np.asarray(inside, dtype=float), np.asarray(reference, dtype=float))


@dataclass(frozen=True)
class FrontProgress:
    """How far a study's last trials moved its front: the hypervolume (:func:`hypervolume`) of the complete trials'
    front before them and after them, against one reference point (:func:`reference_point`): each objective's worst
    value among the trials plus a tenth of its range, so that every trial counts, the worst too.

    Attributes:
        complete: Complete trials counted (repeats once).
        last: How many of them, the latest by number, the move is over.
        first_number: The number of the first of those ``last`` trials.
        moved: ``(after - before) / after``, in [0, 1]: 0 when the last trials found nothing beyond the front.
    """

    complete: int
    last: int
    first_number: int
    moved: float


def reference_point(signed: Sequence[Sequence[float]]) -> list[float]:
    """The hypervolume's reference point for minimized ``signed`` values (one row per trial): each objective's worst
    value plus a tenth of its range, so that every trial counts, the worst too."""
    worst = [max(col) for col in zip(*signed)]
    best = [min(col) for col in zip(*signed)]
    return [w + 0.1 * max(w - b, 1e-12) for w, b in zip(worst, best)]


def front_progress(
    trials: Sequence[tuple[int, Sequence[float]]], objectives: Sequence[Objective]
) -> FrontProgress | None:
    """:class:`FrontProgress` over the latest quarter of ``trials`` (3 to 10 of them), or None with fewer than 6.

    Args:
        trials: ``(number, values)`` of each complete trial, values in ``objectives``' order and units.
        objectives: The study's objectives (their directions sign the values).
    """
    ordered = sorted(trials, key=lambda t: t[0])
    if len(ordered) < 6:
        return None
    last = max(3, min(10, len(ordered) // 4))
    signed = [[o.better(v) for o, v in zip(objectives, values)] for _, values in ordered]
    reference = reference_point(signed)
    after = hypervolume(signed, reference)
    before = hypervolume(signed[:-last], reference)
    moved = (after - before) / after if after > 0 else 0.0
    return FrontProgress(complete=len(ordered), last=last, first_number=ordered[-last][0], moved=moved)
