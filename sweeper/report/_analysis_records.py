"""The study-wide analyses as records: the fit map, the memory effects and parameter importance, the memory
predictions against the measured peaks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from sweeper.study import PredictionError

#: Which trials a curve belongs to: the front's, a NaN trial's, a diverged trial's.
CurveKind: TypeAlias = Literal["front", "nan", "diverged"]


@dataclass(frozen=True, kw_only=True)
class FitCell:
    """One ``per_device_train_batch_size`` x ``max_seq_length`` shape of the fit map.

    Attributes:
        per_device_train_batch_size: Rows per step.
        max_seq_length: Tokens per row.
        fits: Trials of this shape that ran a step within the memory cap (``complete`` or ``nan``).
        ooms: Trials of this shape that ran out of memory.
        trials: Their numbers.
        state: ``fits`` when any trial fit, else ``oom``.
        min_peak_memory_gib: The lowest measured peak among the trials that fit (GiB), or None.
        max_peak_memory_gib: The highest (GiB), or None.
    """

    per_device_train_batch_size: int
    max_seq_length: int
    fits: int
    ooms: int
    trials: tuple[int, ...]
    state: Literal["fits", "oom"]
    min_peak_memory_gib: float | None
    max_peak_memory_gib: float | None


@dataclass(frozen=True, kw_only=True)
class FitMap:
    """Which batch shapes fit the memory cap: the searched batch sizes and lengths, and the cells that were tried.

    Attributes:
        batch_sizes: The ``per_device_train_batch_size`` values tried, ascending.
        max_seq_lengths: The ``max_seq_length`` values tried, ascending.
        cells: The tried shapes, by (batch size, length).
        memory_limit_gib: The highest cap its trials ran under (GiB), None when unknown.
        cpu: True when the peaks are CPU resident sets (``cpu_peak_rss``), which count shared libraries the cap on
            private memory does not: such a peak can stand above the cap of a trial that fit.
    """

    batch_sizes: tuple[int, ...]
    max_seq_lengths: tuple[int, ...]
    cells: tuple[FitCell, ...]
    memory_limit_gib: float | None = None
    cpu: bool = False

    def cell(self, batch_size: int, max_seq_length: int) -> FitCell | None:
        """The cell of that shape, None when no trial tried it."""
        return next(
            (
                c
                for c in self.cells
                if c.per_device_train_batch_size == batch_size and c.max_seq_length == max_seq_length
            ),
            None,
        )


@dataclass(frozen=True, kw_only=True)
class Curve:
    """The loss and gradient-norm curves of one trial.

    Attributes:
        number: The trial's number.
        kind: ``front`` (on the Pareto front), ``nan`` or ``diverged``.
        label: ``#4 nan/data``: the legend entry.
        loss: The training loss per step; None where it was not finite.
        grad_norm: The gradient norm before clipping per step; None where it was not finite.
    """

    number: int
    kind: CurveKind
    label: str
    loss: tuple[float | None, ...]
    grad_norm: tuple[float | None, ...]


@dataclass(frozen=True, kw_only=True)
class MemoryEffects:
    """What moves the predicted peak memory: for each searched setting, the spread (max - min, GiB) of the memory
    model's prediction over its searched values, the median over the study's measured configurations.

    Attributes:
        effects_gib: The spread by setting (GiB, >= 0; exactly 0 for a setting no tensor's size depends on).
        configurations: The measured configurations it is the median over.
    """

    effects_gib: Mapping[str, float]
    configurations: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"effects_gib": {param: GiB}, "configurations": n}``."""
        return {"effects_gib": dict(self.effects_gib), "configurations": self.configurations}


@dataclass(frozen=True, kw_only=True)
class ParamImportance:
    """optuna's importance of the settings for one objective, with a bootstrap interval.

    Attributes:
        importance: The median importance by setting over the resamples (each resample's sum to 1).
        interval: The 5th and 95th percentiles by setting.
        trials: The complete trials it is computed over.
    """

    importance: Mapping[str, float]
    interval: Mapping[str, tuple[float, float]]
    trials: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"importance": {param: x}, "interval": {param: [p5, p95]}, "trials": n}``."""
        return {
            "importance": dict(self.importance),
            "interval": {k: list(v) for k, v in self.interval.items()},
            "trials": self.trials,
        }


@dataclass(frozen=True, kw_only=True)
class NotShown:
    """An objective's importance that is not shown, and why.

    Attributes:
        reason: One line: why (too few complete trials, nothing varies, the model's shape is unknown).
    """

    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"not_shown": reason}``."""
        return {"not_shown": self.reason}


@dataclass(frozen=True, kw_only=True)
class MemoryPrediction:
    """The preflight's predictions against the measured peaks of the complete trials.

    Attributes:
        trials: One row per complete trial with a measured peak (:func:`sweeper.study._calibration.prediction_errors`).
        median_error: The median absolute error of the memory model's predictions (a fraction of the measured peak),
            None without a prediction.
        median_corrected_error: The same after the study's correction, over the trials that had one, or None.
        corrected_trials: The trials that had a correction.
        calibration: The study's stored correction by memory kind (``memory_calibration``), or None.
    """

    trials: tuple[PredictionError, ...]
    median_error: float | None
    median_corrected_error: float | None
    corrected_trials: int
    calibration: Mapping[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"trials": [row], "median_error", "median_corrected_error", "corrected_trials",
        "calibration"}``."""
        return {
            "trials": [r.to_dict() for r in self.trials],
            "median_error": self.median_error,
            "median_corrected_error": self.median_corrected_error,
            "corrected_trials": self.corrected_trials,
            "calibration": self.calibration,
        }
