"""The study's objectives, declared once: each :class:`Objective` says its name (Optuna's metric name and the key in
``sweep report --json``), its direction, its unit, how a complete trial's :class:`~sweeper.trial.TrialResult` gives
it, and how it is shown. Dominance, the front, the knee and the picks read them from here, for any number of
objectives.

A study's objectives are its Optuna metric names, in order (:func:`study_objectives`); a study written before metric
names were set is an old one, ranked by :data:`LEGACY_OBJECTIVES`. Adding an objective is one
:func:`register_objective` call here (and a study created with it: ``open_study(..., objectives=...)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import optuna

from sweeper.errors import StudyError
from sweeper.notation import format_instability, format_margin
from sweeper.stability import edge_proximity, learning_progress_noise
from sweeper.trial import TrialResult

Direction = Literal["minimize", "maximize"]


@dataclass(frozen=True, kw_only=True)
class Objective:
    """One objective of a study.

    Attributes:
        name: Optuna's metric name, the key of its value in ``sweep report --json``'s front, a column of the tables.
        direction: ``minimize`` or ``maximize``.
        unit: Its unit (``GiB``), or ``""`` for a ratio.
        description: One line for ``--help``, the report and docs: what it measures.
        value_of: Its value for a COMPLETE trial's result (finite; a complete trial without the measurement gets the
            value that ranks it worst among plausible ones, never an exception).
        shown: How a trial shows it (``0.982``, ``19x``): a function of the trial's result and its stored value.
        role: ``memory`` for the objective ``--pick min-memory`` minimizes, ``stability`` for the one
            ``--pick most-stable`` optimizes, ``learning`` for ``learning_progress`` (a measurement every report
            row already shows), None for any other.
        interval: Its noise: ``(low, high)`` of a COMPLETE trial's value (the trial's measured interval); None when
            the value is taken as exact. Dominance, the front and the picks treat two values whose intervals overlap
            as tied (:func:`dominates_beyond_noise`).
    """

    name: str
    direction: Direction
    unit: str
    description: str
    value_of: Callable[[TrialResult], float]
    shown: Callable[[TrialResult, float], str]
    role: Literal["memory", "stability", "learning"] | None = None
    interval: Callable[[TrialResult], tuple[float, float]] | None = None

    def signed_interval(self, result: TrialResult, value: float) -> tuple[float, float]:
        """``(low, high)`` of ``value`` signed by :meth:`better` (lower is better), from :attr:`interval`
        (``(value, value)`` without one); the value itself always lies inside."""
        low, high = self.interval(result) if self.interval is not None else (value, value)
        low, high = min(low, value), max(high, value)
        return (-high, -low) if self.direction == "maximize" else (low, high)

    def tied(self, a: tuple[float, float], b: tuple[float, float]) -> bool:
        """Whether two signed intervals of this objective (:meth:`signed_interval`) are tied: neither value is
        clearly better (:func:`tied`, the rule the front and the picks use)."""
        return tied(a, b)

    @property
    def optuna_direction(self) -> optuna.study.StudyDirection:
        """Optuna's :class:`~optuna.study.StudyDirection` of :attr:`direction`."""
        return optuna.study.StudyDirection[self.direction.upper()]

    def better(self, value: float) -> float:
        """``value`` signed so that lower is better (maximized objectives are negated): what dominance compares."""
        return -value if self.direction == "maximize" else value


_REGISTRY: dict[str, Objective] = {}


def register_objective(objective: Objective) -> Objective:
    """Make ``objective`` known by its name to :func:`study_objectives` and ``open_study(..., objectives=...)``.

    Returns:
        ``objective``, for ``NAME = register_objective(Objective(...))``.

    Raises:
        ValueError: Another objective of that name is registered.
    """
    known = _REGISTRY.get(objective.name)
    if known is not None and known != objective:
        raise ValueError(f"an objective '{objective.name}' is already registered")
    _REGISTRY[objective.name] = objective
    return objective


def unregister_objective(name: str) -> None:
    """Forget the objective ``name`` (a test's throwaway objective); nothing when none is registered."""
    if name not in (o.name for o in (*DEFAULT_OBJECTIVES, *LEGACY_OBJECTIVES)):
        _REGISTRY.pop(name, None)


def objective(name: str) -> Objective:
    """The registered objective ``name``.

    Raises:
        KeyError: No objective of that name is registered.
    """
    return _REGISTRY[name]


def _edge_proximity_value(result: TrialResult) -> float:
    proximity = edge_proximity(result.stress.stability_margin)
    return 1.0 if proximity is None else proximity  # never ranked safer than a trial measured at its edge


def _edge_proximity_interval(result: TrialResult) -> tuple[float, float]:
    """``1 / stability_margin``'s interval from the margin's (``stability_margin_low``/``_high``): 0 below a capped
    margin (no upper end), the value itself where no interval is known."""
    value = _edge_proximity_value(result)
    stress = result.stress
    if stress.stability_margin_low is None:
        return value, value
    low = edge_proximity(stress.stability_margin_high) or 0.0
    high = edge_proximity(stress.stability_margin_low) or value
    return low, high


#: Two peaks within this share of each other are the same memory to the ``safe`` pick (which then prefers the one
#: that learns most): the seed alone (LoRA's initialisation and the data order) moves a trial's measured peak by up to
#: it. Measured by ``benchmarks/stability/seed_noise.py`` on the CPU (peak RSS; the built-in model in float32 at 2e-4, 3
#: seeds): 8.3% at batch 1 and 64 tokens and 1.9% at batch 2 and 128 over 12 steps
#: (``benchmarks/stability/results/seed_noise.json``); 6.5% and 9.7% in a first run of 6 steps. CUDA's peak reserved
#: memory is not measured here; the CPU's figure stands for it until it is.
MEMORY_NOISE_SHARE = 0.10

#: Peak memory (GiB): the peak reserved memory on CUDA, the peak RSS on the CPU (``TrialResult.memory.memory_kind``).
PEAK_MEMORY = register_objective(
    Objective(
        name="peak_memory_gib",
        direction="minimize",
        unit="GiB",
        description="the trial's peak memory (CUDA peak reserved, or the CPU's peak RSS)",
        value_of=lambda r: float(r.memory.peak_memory_gib if r.memory.peak_memory_gib is not None else math.inf),
        shown=lambda _r, v: f"{v:.3f}",
        role="memory",
    )
)

#: ``1 / stability_margin``: the trial's learning rate over the rate its stress phase diverged at
#: (:func:`sweeper.stability.edge_proximity`); 1 when the margin is unknown.
EDGE_PROXIMITY = register_objective(
    Objective(
        name="edge_proximity",
        direction="minimize",
        unit="",
        description="1 / stability_margin: the learning rate as a share of the rate the stress phase diverged at",
        value_of=_edge_proximity_value,
        shown=lambda r, _v: format_margin(r.stress.stability_margin, r.stress.margin_capped),
        role="stability",
        interval=_edge_proximity_interval,
    )
)

#: sweeper 0.1.x's second objective (:mod:`sweeper.stability`): kept for the studies it wrote.
INSTABILITY = register_objective(
    Objective(
        name="instability",
        direction="minimize",
        unit="",
        description="the probe loss's instability (sweeper 0.1.x's second objective)",
        value_of=lambda r: float(r.constant.instability or 0.0),
        shown=lambda _r, v: format_instability(v),
        role="stability",
    )
)


def _learning_progress_value(result: TrialResult) -> float:
    progress = result.constant.learning_progress
    return float(progress) if progress is not None and math.isfinite(progress) else -1.0  # unknown: ranked last


#: ``learning_progress``: how far the probe loss fell over the constant phase at the trial's own rate (a fraction,
#: maximized), an optional third objective (``study.objectives``): with it the front no longer rewards a small step
#: for being far from its edge while it barely trains. Its interval is the seed noise each side
#: (:func:`sweeper.stability.learning_progress_noise`: 0.01 safely below the edge, 0.14 near it).
LEARNING_PROGRESS = register_objective(
    Objective(
        name="learning_progress",
        direction="maximize",
        unit="",
        description="the probe loss's relative drop over the constant phase at the trial's learning rate",
        value_of=_learning_progress_value,
        shown=lambda _r, v: f"{100 * v:.0f}%",
        role="learning",
        interval=lambda r: (
            _learning_progress_value(r) - learning_progress_noise(r.stress),
            _learning_progress_value(r) + learning_progress_noise(r.stress),
        ),
    )
)

#: A new study's objectives, in order.
DEFAULT_OBJECTIVES: tuple[Objective, ...] = (PEAK_MEMORY, EDGE_PROXIMITY)

#: The objectives of the studies sweeper wrote before the stability margin (0.1.x): they keep ranking by the
#: instability, so that a resumed old study compares like with like.
LEGACY_OBJECTIVES: tuple[Objective, ...] = (PEAK_MEMORY, INSTABILITY)


def resolve_objectives(names: Sequence[str], where: str) -> tuple[Objective, ...]:
    """The registered objectives ``names``, in order; the first must be ``peak_memory_gib`` and one of them a
    stability objective (the picks and the memory preflight rely on both).

    Raises:
        StudyError: One line naming ``where`` (the file or option), the unknown or missing objective and the known
            ones.
    """
    known = ", ".join(_REGISTRY)
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise StudyError(f"{where}: study.objectives: no objective '{unknown[0]}'; choose among {known}")
    chosen = tuple(_REGISTRY[n] for n in names)
    if len(set(names)) != len(names):
        raise StudyError(f"{where}: study.objectives: an objective is named twice ({', '.join(names)})")
    if not chosen or chosen[0] is not PEAK_MEMORY or not any(o.role == "stability" for o in chosen):
        raise StudyError(
            f"{where}: study.objectives: the first objective must be peak_memory_gib and one a stability objective "
            f"(edge_proximity); got {', '.join(names) or 'none'}"
        )
    return chosen


def study_objectives(study: optuna.Study) -> tuple[Objective, ...]:
    """The objectives ``study`` ranks by: its metric names when each is registered and they match its directions,
    else :data:`LEGACY_OBJECTIVES` (an old study without metric names)."""
    names = list(study.metric_names or ())
    if names and len(names) == len(study.directions) and all(n in _REGISTRY for n in names):
        chosen = tuple(_REGISTRY[n] for n in names)
        if [o.optuna_direction for o in chosen] == list(study.directions):
            return chosen
    return LEGACY_OBJECTIVES


def is_sweeper_study(study: optuna.Study) -> bool:
    """Whether ``study`` has a sweeper study's objectives: registered metric names in its directions with peak memory
    first and a stability objective, or no metric names and two minimized objectives (sweeper 0.1.x)."""
    names = list(study.metric_names or ())
    if not names:
        return list(study.directions) == [optuna.study.StudyDirection.MINIMIZE] * 2
    try:
        chosen = resolve_objectives(names, study.study_name)
    except StudyError:
        return False
    return [o.optuna_direction for o in chosen] == list(study.directions)


def stability_objective(study: optuna.Study) -> str:
    """The name of the study's stability objective: ``edge_proximity``, or ``instability`` for a study written
    before the margin."""
    return next(o.name for o in study_objectives(study) if o.role == "stability")


def dominates(a: Sequence[float], b: Sequence[float], objectives: Sequence[Objective]) -> bool:
    """Whether values ``a`` dominate ``b``: no worse on every objective (by its direction) and better on one; the
    definition of ``optuna.study._multi_objective._dominates``."""
    signed_a = [o.better(x) for o, x in zip(objectives, a)]
    signed_b = [o.better(x) for o, x in zip(objectives, b)]
    return all(x <= y for x, y in zip(signed_a, signed_b)) and signed_a != signed_b


#: Relative tolerance when two interval ends meet: the margin's intervals are ladder steps apart, and ``5.8 * 1.8``
#: and ``18.9 / 1.8`` differ in the last bits.
_TOUCH = 1e-9


def _clearly_below(x: tuple[float, float], y: tuple[float, float]) -> bool:
    """``x``'s high end at or below ``y``'s low end (within :data:`_TOUCH`), and ``x`` not the same point as ``y``:
    ``x`` is clearly lower."""

    def close(u: float, v: float) -> bool:
        return abs(u - v) <= _TOUCH * max(abs(u), abs(v))

    return (x[1] <= y[0] or close(x[1], y[0])) and not (close(x[0], y[0]) and close(x[1], y[1]))


def dominates_beyond_noise(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> bool:
    """Whether ``a`` dominates ``b`` beyond their noise: each a sequence of signed intervals ``(low, high)``, one per
    objective, lower better (:meth:`Objective.signed_interval`). ``a`` is not clearly worse on any objective and
    clearly better on one (its high end at or below ``b``'s low end). For exact values (``low == high``) this is
    :func:`dominates`; two values whose intervals overlap are tied (:func:`tied`).

    Intervals that only meet at an end are not tied. Each interval is one reading's noise: a margin's is one ladder
    step each side, inside which 90% of a second seed's readings fell. The difference of two independent readings is
    noisier by sqrt(2), so two readings differ beyond it at 1.4 steps or more. Margins 2 steps apart (intervals
    meeting at an end) differ; margins 1 step apart (intervals overlapping) are tied."""
    not_worse = all(not _clearly_below(y, x) for x, y in zip(a, b))
    better = any(_clearly_below(x, y) for x, y in zip(a, b))
    return not_worse and better


def dominated_beyond_noise(intervals: Sequence[Sequence[tuple[float, float]]], block: int = 512) -> list[bool]:
    """For each point (one row of signed intervals per point, as :func:`dominates_beyond_noise` takes them), whether
    another point dominates it beyond the noise: the same rule, computed for all pairs at once with NumPy (a study of
    thousands of trials compares millions of pairs), ``block`` rows at a time to bound the memory.

    Returns:
        One flag per point, in order.
    """
    if not intervals:
        return []
    arr = np.asarray(intervals, dtype=float)  # (n, k, 2)
    low, high = arr[:, :, 0], arr[:, :, 1]
    n = len(arr)

    below = _clearly_below_array
    out = np.zeros(n, dtype=bool)
    with np.errstate(invalid="ignore"):
        for start in range(0, n, block):
            b = slice(start, start + block)  # the points judged: does any point a dominate them?
            al, ah = low[:, None, :], high[:, None, :]  # (n, 1, k): every a
            bl, bh = low[None, b, :], high[None, b, :]  # (1, m, k): the block's b
            better = below(al, ah, bl, bh).any(axis=2)  # a clearly below b on some objective
            not_worse = ~below(bl, bh, al, ah).any(axis=2)  # b clearly below a on none
            out[b] = (better & not_worse).any(axis=0)
    return out.tolist()


def _close_array(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.abs(u - v) <= _TOUCH * np.maximum(np.abs(u), np.abs(v))


def _clearly_below_array(xl: np.ndarray, xh: np.ndarray, yl: np.ndarray, yh: np.ndarray) -> np.ndarray:
    """:func:`_clearly_below` broadcast over arrays of interval ends: x's high end at or below y's low end, and x not
    the same point as y."""
    close = _close_array
    return ((xh <= yl) | close(xh, yl)) & ~(close(xl, yl) & close(xh, yh))


def tied_matrix(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> np.ndarray:
    """:func:`tied` for every pair of intervals of one objective, ``a`` by ``b``, at once.

    Returns:
        Booleans, shape ``(len(a), len(b))``.
    """
    x = np.asarray(a, dtype=float).reshape(-1, 2)
    y = np.asarray(b, dtype=float).reshape(-1, 2)
    xl, xh = x[:, None, 0], x[:, None, 1]
    yl, yh = y[None, :, 0], y[None, :, 1]
    with np.errstate(invalid="ignore"):
        return ~_clearly_below_array(xl, xh, yl, yh) & ~_clearly_below_array(yl, yh, xl, xh)


def tied(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals of one objective overlap beyond meeting at an end: neither value is clearly better."""
    return not _clearly_below(a, b) and not _clearly_below(b, a)


def knee_distance(values: Sequence[Sequence[float]], objectives: Sequence[Objective]) -> list[float]:
    """For each point of ``values`` (one row per trial), its distance to the ideal point after scaling each objective
    to [0, 1] over the points, best end at 0 (min-max, each by its direction), in Euclidean distance: the
    "compromise solution" of multi-objective decision making (Zeleny 1973; Deb, *Multi-Objective Optimization using
    Evolutionary Algorithms*, 2001, 8.2). A constant objective adds 0. Rounded to 12 digits so that ties are ties.
    """
    signed = [[o.better(x) for o, x in zip(objectives, row)] for row in values]
    if not signed:
        return []
    lows = [min(row[i] for row in signed) for i in range(len(objectives))]
    spans = [(max(row[i] for row in signed) - lows[i]) or 1.0 for i in range(len(objectives))]
    return [round(math.hypot(*((row[i] - lows[i]) / spans[i] for i in range(len(objectives)))), 12) for row in signed]
