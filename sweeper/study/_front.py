"""The front's arithmetic on stored trials: dominance with each objective's noise interval, the ties on stability
and the order by distance to the knee (the ideal point)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sweeper.study._objectives import Objective, dominated_beyond_noise, knee_distance, tied_matrix
from sweeper.study._stored import StoredTrial


def signed_intervals(trial: StoredTrial, objectives: Sequence[Objective]) -> list[tuple[float, float]]:
    """The COMPLETE ``trial``'s interval on each objective, signed so that lower is better
    (:meth:`sweeper.study.Objective.signed_interval`).

    Raises:
        ValueError: ``trial`` has no objective values.
    """
    if trial.values is None:
        raise ValueError(f"trial {trial.number} has no objective values")
    return [o.signed_interval(trial.result, v) for o, v in zip(objectives, trial.values)]


def non_dominated(trials: Sequence[StoredTrial], objectives: Sequence[Objective]) -> list[StoredTrial]:
    """The COMPLETE ``trials`` no other of them dominates beyond the noise of ``objectives``
    (:func:`sweeper.study._objectives.dominates_beyond_noise`: a margin within another's interval is a tie, so the
    front keeps both unless one is clearly better elsewhere), sorted by their values (peak memory first). All pairs
    are compared at once (:func:`sweeper.study._objectives.dominated_beyond_noise`)."""
    done = [t for t in trials if t.values is not None]
    dominated = dominated_beyond_noise([signed_intervals(t, objectives) for t in done])
    kept = [t for t, out in zip(done, dominated) if not out]
    return sorted(kept, key=lambda t: tuple(o.better(v) for o, v in zip(objectives, t.values or ())))


def tied_on_stability(trial: StoredTrial, others: Sequence[StoredTrial], objectives: Sequence[Objective]) -> list[int]:
    """The numbers of the COMPLETE ``others`` (``trial`` left out) whose stability objective's interval overlaps
    ``trial``'s: their difference in stability is within the noise (:func:`sweeper.study._objectives.tied`)."""
    return ties_on_stability([trial], others, objectives)[0]


def ties_on_stability(
    trials: Sequence[StoredTrial], others: Sequence[StoredTrial], objectives: Sequence[Objective]
) -> list[list[int]]:
    """:func:`tied_on_stability` for each of ``trials``, all pairs compared at once
    (:func:`sweeper.study._objectives.tied_matrix`; a front of a thousand trials is a million pairs).

    Returns:
        One list of numbers per trial, in order (empty for a trial without values, or without a stability
        objective).
    """
    at = next((i for i, o in enumerate(objectives) if o.role == "stability"), None)
    complete = [o for o in others if o.values is not None]
    if at is None or not complete:
        return [[] for _ in trials]
    theirs = [signed_intervals(o, objectives)[at] for o in complete]
    judged = [t for t in trials if t.values is not None]
    mine = [signed_intervals(t, objectives)[at] for t in judged]
    rows = dict(zip((t.number for t in judged), tied_matrix(mine, theirs))) if judged else {}
    numbers = np.array([o.number for o in complete])
    return [
        [] if (row := rows.get(t.number)) is None else numbers[row & (numbers != t.number)].tolist() for t in trials
    ]


def by_knee_distance(front: Sequence[StoredTrial], objectives: Sequence[Objective]) -> list[StoredTrial]:
    """``front`` nearest the ideal point first (:func:`sweeper.study._objectives.knee_distance`: each objective
    scaled to [0, 1] over the front, by its direction, then the Euclidean distance to the best corner); ties go to
    the better stability objective (``edge_proximity``, or the instability of an old study), then the lower memory.
    The first is the front's knee."""
    complete = [t for t in front if t.values is not None]
    if not complete:
        return list(front)
    distances = dict(zip((t.number for t in complete), knee_distance([t.values or () for t in complete], objectives)))
    stability = next((i for i, o in enumerate(objectives) if o.role == "stability"), 0)

    def key(t: StoredTrial) -> tuple[float, float, float]:
        if t.values is None:
            return (math.inf, math.inf, math.inf)
        signed = [o.better(v) for o, v in zip(objectives, t.values)]
        return (distances[t.number], signed[stability], signed[0])

    return sorted(front, key=key)
