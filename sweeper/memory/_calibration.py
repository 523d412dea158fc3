"""A preflight that learns the machine: after each measured trial the sweep compares the trial's measured peak with
the memory model's prediction (:mod:`sweeper.memory._model`) and corrects later predictions by what it found.

The correction is fitted per group of configurations that run different code paths (compute dtype and gradient
checkpointing: on the CPU a bf16 trial runs under autocast and an fp16 or fp32 one does not; checkpointing changes
which tensors are held). With one measured trial in a group, or several whose predictions lie within
:data:`MIN_SPAN_GIB` of each other, it is the **median ratio** ``measured / predicted``; with predictions spread wider
it is a **Theil-Sen line** ``measured = a + b * predicted`` (the median of the pairwise slopes, bounded by
:data:`SLOPE_BOUNDS`, and the median intercept), because the memory model's error is not one factor: on the demo
(built-in model, CPU) the fixed part (the process, the weights) is under-predicted by about 1.4x and the part that
grows with tokens by 2x (bf16) to 5x (fp32). A group not measured yet borrows the smallest ratio of the groups that
were, so a setting is never pruned on another setting's larger error. Medians need few points and ignore an outlier
among three (``benchmarks/memory/preflight_calibration.py`` prints the figures on a study).

Only ``complete`` trials are points: an ``oom`` trial's peak is where it died, a lower bound, and a ``nan`` or
``diverged`` trial may stop before the step's peak. Predictions are recomputed from each trial's stored config with
the current memory model, so a study written by an older model still fits the model that applies the correction.
The fit is stored as the study user attribute ``memory_calibration`` (one entry per memory kind:
``cpu_peak_rss``, ``cuda_max_reserved``), so a resumed sweep and a sweep on another machine start from it
(:func:`sweeper.study.update_calibration`). This module is the pure part, the fit: no study, no torch.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.space import TrialConfig

#: Bounds of a fitted ratio: outside them the stored data is not a measurement of the same thing (a hand-edited study,
#: a peak of another model), and the correction keeps the bound.
RATIO_BOUNDS = (0.25, 4.0)

#: A group's predictions must spread over this many GiB before a line is fitted through them: closer points leave the
#: slope to the measurement noise (about 0.05 GiB between identical CPU trials).
MIN_SPAN_GIB = 0.05

#: Bounds of a fitted line's slope (GiB measured per GiB predicted). Measured on the demo's CPU: 1.5 (bf16) to 5 (fp32).
SLOPE_BOUNDS = (0.25, 8.0)


#: The number a calibration gives the one-step measurement of the space's smallest configuration that stands in for
#: trials on the CPU before any completes (:func:`sweeper.study._calibration.store_baseline`): not a trial.
BASELINE_NUMBER = -1


def group_of(config: TrialConfig) -> str:
    """The calibration group of a trial config: ``<compute dtype>/<checkpointing on|off>``, e.g. ``bfloat16/ckpt``."""
    checkpointing = "ckpt" if config.gradient_checkpointing else "no-ckpt"
    return f"{config.bnb_4bit_compute_dtype}/{checkpointing}"


@dataclass(frozen=True, kw_only=True)
class CalibrationPoint:
    """One measured trial: its number, group, the memory model's prediction and the measured peak (GiB)."""

    number: int
    group: str
    predicted_gib: float
    measured_gib: float

    @property
    def ratio(self) -> float:
        """``measured / predicted``."""
        return self.measured_gib / self.predicted_gib


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """A fitted correction of the memory model for one memory kind.

    Attributes:
        kind: ``cpu_peak_rss`` or ``cuda_max_reserved``.
        ratios: Per group (:func:`group_of`), the median of ``measured / predicted`` of its measured trials.
        lines: Per group whose predictions spread over :data:`MIN_SPAN_GIB`, ``(a, b)`` of the Theil-Sen line
            ``measured = a + b * predicted`` (GiB); such a group is corrected by its line, the others by their ratio.
        points: Per group, how many trials it was fitted on.
        trials: The numbers of the trials fitted, in order.
        median_error_raw: Median of ``|predicted - measured| / measured`` of the uncorrected model over those trials.
    """

    kind: str
    ratios: dict[str, float] = field(default_factory=dict)
    lines: dict[str, tuple[float, float]] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)
    trials: list[int] = field(default_factory=list)
    median_error_raw: float | None = None

    @property
    def fallback(self) -> float:
        """The ratio of a group not measured yet: the smallest measured one (1.0 with none)."""
        return min(self.ratios.values()) if self.ratios else 1.0

    def explain(self, config: TrialConfig, predicted_gib: float) -> tuple[float, str]:
        """The corrected prediction of ``config`` in GiB, and how it was made (a phrase for a reason line)."""
        group = group_of(config)
        n = self.points.get(group, 0)
        trials = f"{n} measured trial{'s' if n != 1 else ''} of {group}"
        if self.trials == [BASELINE_NUMBER]:
            trials = "one measured step of the space's smallest configuration"
        if group in self.lines:
            a, b = self.lines[group]
            corrected = max(a + b * predicted_gib, predicted_gib * RATIO_BOUNDS[0])
            return (
                corrected,
                f"memory model {predicted_gib:.2f} GiB, line {a:+.2f} + {b:.2f} x predicted fitted on {trials}",
            )
        if group in self.ratios:
            ratio = self.ratios[group]
            return (
                predicted_gib * ratio,
                f"memory model {predicted_gib:.2f} GiB x {ratio:.2f}, the measured/predicted ratio of {trials}",
            )
        k = len(self.trials)
        return predicted_gib * self.fallback, (
            f"memory model {predicted_gib:.2f} GiB x {self.fallback:.2f}, the smallest measured/predicted ratio of "
            f"{k} measured trial{'s' if k != 1 else ''}, none of {group}"
        )

    def correct(self, config: TrialConfig, predicted_gib: float) -> float:
        """The corrected prediction in GiB (:meth:`explain`)."""
        return self.explain(config, predicted_gib)[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, as stored in the study user attribute ``memory_calibration``
        (:data:`sweeper.storage.StudyAttr.MEMORY_CALIBRATION`)."""
        return {
            "ratios": dict(self.ratios),
            "lines": {g: list(line) for g, line in self.lines.items()},
            "points": dict(self.points),
            "trials": list(self.trials),
            "median_error_raw": self.median_error_raw,
        }

    @classmethod
    def from_dict(cls, kind: str, data: Mapping[str, Any]) -> Calibration | None:
        """From :meth:`to_dict`; None for data this version cannot read (a study edited by hand)."""
        try:
            ratios = {str(k): float(v) for k, v in data["ratios"].items()}
            points = {str(k): int(v) for k, v in data["points"].items()}
            lines = {str(k): (float(v[0]), float(v[1])) for k, v in (data.get("lines") or {}).items()}
            trials = [int(n) for n in data.get("trials", [])]
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return None
        if not ratios or set(ratios) != set(points) or not all(math.isfinite(v) and v > 0 for v in ratios.values()):
            return None
        if not set(lines) <= set(ratios) or not all(math.isfinite(a) and math.isfinite(b) for a, b in lines.values()):
            return None
        raw = data.get("median_error_raw")
        return cls(
            kind=kind,
            ratios=ratios,
            lines=lines,
            points=points,
            trials=trials,
            median_error_raw=float(raw) if isinstance(raw, (int, float)) else None,
        )


def theil_sen(points: Iterable[CalibrationPoint]) -> tuple[float, float] | None:
    """``(a, b)`` of ``measured = a + b * predicted`` through ``points``: ``b`` the median of the slopes between
    pairs at least 0.01 GiB apart in prediction, bounded by :data:`SLOPE_BOUNDS`; ``a`` the median of
    ``measured - b * predicted``. None when the predictions spread less than :data:`MIN_SPAN_GIB`."""
    points = list(points)
    xs = [p.predicted_gib for p in points]
    if len(points) < 2 or max(xs) - min(xs) < MIN_SPAN_GIB:
        return None
    slopes = [
        (q.measured_gib - p.measured_gib) / (q.predicted_gib - p.predicted_gib)
        for p, q in itertools.combinations(points, 2)
        if abs(q.predicted_gib - p.predicted_gib) >= 0.01
    ]
    low, high = SLOPE_BOUNDS
    b = min(high, max(low, statistics.median(slopes)))
    return statistics.median(p.measured_gib - b * p.predicted_gib for p in points), b


def fit_calibration(points: Iterable[CalibrationPoint], kind: str) -> Calibration | None:
    """Per group of ``points``: the median ratio (bounded by :data:`RATIO_BOUNDS`) and, where the predictions spread
    enough, the Theil-Sen line (:func:`theil_sen`); None without points."""
    points = list(points)
    if not points:
        return None
    by_group: dict[str, list[CalibrationPoint]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p)
    low, high = RATIO_BOUNDS
    lines = {g: line for g, ps in by_group.items() if (line := theil_sen(ps)) is not None}
    return Calibration(
        kind=kind,
        ratios={g: min(high, max(low, statistics.median(p.ratio for p in ps))) for g, ps in by_group.items()},
        lines=lines,
        points={g: len(ps) for g, ps in by_group.items()},
        trials=[p.number for p in points],
        median_error_raw=statistics.median(abs(p.predicted_gib - p.measured_gib) / p.measured_gib for p in points),
    )


def median_abs(values: Iterable[float | None]) -> float | None:
    """The median of the absolute values that are known, or None when none is."""
    known = [abs(v) for v in values if v is not None]
    return statistics.median(known) if known else None
