"""A preflight that learns the machine: after each measured trial the sweep compares the trial's measured peak with
the memory model's prediction (:mod:`sweeper.estimate`) and corrects later predictions by the ratio it found.

The correction is a **median ratio** ``measured / predicted`` per group of configurations that run different code
paths (compute dtype and gradient checkpointing: on the CPU a bf16 trial runs under autocast and an fp16 or fp32
one does not; checkpointing changes which tensors are held). A group not measured yet borrows the smallest ratio of
the groups that were, so a setting is never pruned on another setting's larger error. A median of ratios needs no
more than one point, ignores an outlier among three, and is what the errors look like: on the demo (built-in model,
CPU, ``search_spaces/demo.yaml``) the memory model runs 1.4x-1.9x under the measured resident set, close to a
constant factor within a dtype (``benchmarks/preflight_calibration.py`` prints the figures).

Only ``complete`` trials are points: an ``oom`` trial's peak is where it died, a lower bound, and a ``nan`` or
``diverged`` trial may stop before the step's peak. Predictions are recomputed from each trial's stored config with
the current memory model, so a study written by an older model still fits the model that applies the correction.
The fit is stored as the study user attribute ``memory_calibration`` (one entry per memory kind:
``cpu_peak_rss``, ``cuda_max_reserved``), so a resumed sweep and a sweep on another machine start from it; no
torch here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import optuna

from sweeper.study._stored import TrialStatus, stored_trials
from sweeper.trial import cuda_visible

#: Study user attribute holding the fitted correction, ``{memory_kind: Calibration.to_dict()}``.
CALIBRATION_ATTR = "memory_calibration"

#: Trial user attribute: the corrected prediction the preflight used for this trial (GiB, same kind as
#: ``peak_memory_gib``); absent before the study had a measured trial of this memory kind.
CORRECTED_ATTR = "corrected_peak_gib"

#: Bounds of a fitted ratio: outside them the stored data is not a measurement of the same thing (a hand-edited study,
#: a peak of another model), and the correction keeps the bound.
RATIO_BOUNDS = (0.25, 4.0)


def device_kind() -> str:
    """The memory kind of the trials this machine runs: ``cuda_max_reserved`` when a GPU is visible, else
    ``cpu_peak_rss`` (as the trial process measures it, :func:`sweeper.trial.cuda_visible`)."""
    return "cuda_max_reserved" if cuda_visible() else "cpu_peak_rss"


def group_of(config: Mapping[str, Any]) -> str:
    """The calibration group of a trial config: ``<compute dtype>/<checkpointing on|off>``, e.g. ``bfloat16/ckpt``."""
    checkpointing = "ckpt" if config.get("gradient_checkpointing", True) else "no-ckpt"
    return f"{config.get('bnb_4bit_compute_dtype', 'bfloat16')}/{checkpointing}"


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
        points: Per group, how many trials the ratio is the median of.
        trials: The numbers of the trials fitted, in order.
        median_error_raw: Median of ``|predicted - measured| / measured`` of the uncorrected model over those trials.
    """

    kind: str
    ratios: dict[str, float] = field(default_factory=dict)
    points: dict[str, int] = field(default_factory=dict)
    trials: list[int] = field(default_factory=list)
    median_error_raw: float | None = None

    @property
    def fallback(self) -> float:
        """The ratio of a group not measured yet: the smallest measured one (1.0 with none)."""
        return min(self.ratios.values()) if self.ratios else 1.0

    def factor(self, config: Mapping[str, Any]) -> tuple[float, str]:
        """The ratio applied to ``config`` and where it comes from (one phrase for a reason line)."""
        group = group_of(config)
        if group in self.ratios:
            n = self.points[group]
            return self.ratios[group], f"{n} measured trial{'s' if n != 1 else ''} of {group}"
        n = len(self.trials)
        return self.fallback, f"smallest ratio of {n} measured trial{'s' if n != 1 else ''}, none of {group}"

    def correct(self, config: Mapping[str, Any], predicted_gib: float) -> float:
        """The corrected prediction in GiB: ``predicted_gib`` times :meth:`factor`."""
        return predicted_gib * self.factor(config)[0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, as stored in the study user attribute :data:`CALIBRATION_ATTR`."""
        return {
            "ratios": dict(self.ratios),
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
            trials = [int(n) for n in data.get("trials", [])]
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        if not ratios or set(ratios) != set(points) or not all(math.isfinite(v) and v > 0 for v in ratios.values()):
            return None
        raw = data.get("median_error_raw")
        return cls(
            kind=kind,
            ratios=ratios,
            points=points,
            trials=trials,
            median_error_raw=float(raw) if isinstance(raw, (int, float)) else None,
        )


def calibration_points(
    study: optuna.Study, predict: Callable[[Mapping[str, Any]], float | None], kind: str
) -> list[CalibrationPoint]:
    """The study's ``complete`` trials of memory kind ``kind`` with a measured peak, repeats left out, in trial order;
    ``predict`` gives the memory model's prediction of a stored config (None when unknown: the trial is left out)."""
    out = []
    for t in stored_trials(study):
        if t.is_repeat or t.status != TrialStatus.COMPLETE or "config" not in t.user_attrs:
            continue
        measured = t.result.peak_memory_gib
        if t.result.memory_kind != kind or measured is None or not math.isfinite(measured) or measured <= 0:
            continue
        predicted = predict(t.user_attrs["config"])
        if predicted is None or not math.isfinite(predicted) or predicted <= 0:
            continue
        out.append(
            CalibrationPoint(
                number=t.number,
                group=group_of(t.user_attrs["config"]),
                predicted_gib=predicted,
                measured_gib=measured,
            )
        )
    return out


def fit_calibration(points: Iterable[CalibrationPoint], kind: str) -> Calibration | None:
    """The median ratio per group of ``points`` (bounded by :data:`RATIO_BOUNDS`), or None without points."""
    points = list(points)
    if not points:
        return None
    by_group: dict[str, list[float]] = {}
    for p in points:
        by_group.setdefault(p.group, []).append(p.ratio)
    low, high = RATIO_BOUNDS
    return Calibration(
        kind=kind,
        ratios={g: min(high, max(low, statistics.median(r))) for g, r in by_group.items()},
        points={g: len(r) for g, r in by_group.items()},
        trials=[p.number for p in points],
        median_error_raw=statistics.median(abs(p.predicted_gib - p.measured_gib) / p.measured_gib for p in points),
    )


def stored_calibration(study: optuna.Study, kind: str) -> Calibration | None:
    """The correction stored on the study for memory kind ``kind``, or None."""
    data = study.user_attrs.get(CALIBRATION_ATTR)
    if not isinstance(data, Mapping) or not isinstance(data.get(kind), Mapping):
        return None
    return Calibration.from_dict(kind, data[kind])


def update_calibration(
    study: optuna.Study, predict: Callable[[Mapping[str, Any]], float | None], kind: str
) -> Calibration | None:
    """Fit the correction again from every measured trial of ``kind`` and store it on the study (the other kinds'
    entries are kept). Several sweeps may do this at once: each fits all the trials it sees, so the last write holds
    at least the trials the others saw when they wrote.

    Returns:
        The stored correction, or None when the study has no point yet (nothing is stored then).
    """
    fitted = fit_calibration(calibration_points(study, predict, kind), kind)
    if fitted is None:
        return None
    data = study.user_attrs.get(CALIBRATION_ATTR)
    stored = dict(data) if isinstance(data, Mapping) else {}
    stored[kind] = fitted.to_dict()
    study.set_user_attr(CALIBRATION_ATTR, stored)
    return fitted


def prediction_errors(study: optuna.Study) -> list[dict[str, Any]]:
    """Predicted vs measured for each measured ``complete`` trial (repeats left out), as the sweep predicted it before
    running it: ``{"number", "memory_kind", "predicted_gib", "corrected_gib", "measured_gib", "error",
    "corrected_error"}`` (GiB); an error is ``(prediction - measured) / measured`` (negative: under), None where the
    prediction is unknown (for ``corrected_error``: no correction existed yet when the trial was asked)."""
    rows = []
    for t in stored_trials(study):
        if t.is_repeat or t.status != TrialStatus.COMPLETE:
            continue
        measured = t.result.peak_memory_gib
        if measured is None or measured <= 0:
            continue
        predicted = t.result.predicted_peak_gib
        corrected = t.user_attrs.get(CORRECTED_ATTR)
        corrected = float(corrected) if isinstance(corrected, (int, float)) else None
        rows.append(
            {
                "number": t.number,
                "memory_kind": t.result.memory_kind,
                "predicted_gib": predicted,
                "corrected_gib": corrected,
                "measured_gib": measured,
                "error": None if predicted is None else (predicted - measured) / measured,
                "corrected_error": None if corrected is None else (corrected - measured) / measured,
            }
        )
    return rows


def median_abs(values: Iterable[float | None]) -> float | None:
    """The median of the absolute values that are known, or None when none is."""
    known = [abs(v) for v in values if v is not None]
    return statistics.median(known) if known else None
