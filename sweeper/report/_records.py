"""The report's records: one frozen dataclass per table and figure (optuna's ``_ParetoFrontInfo`` shape).

:mod:`sweeper.report._data` builds them from a study; :mod:`sweeper.report._figures`, :mod:`._console` and
:mod:`._dashboard` read their attributes. Those that ``sweep report --json`` prints (:class:`Report` and its parts)
serialise with ``to_dict()``: the keys, their order and the values of that JSON are a user contract
(``docs/contract.md``) and are made here only.

No torch, no plotly: plain values (GiB, fractions, trial numbers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from sweeper.stability import StabilityFigures
from sweeper.study import Confirmation, PredictionError


def phase_peaks_text(
    phases: Mapping[str, float], shape: Sequence[int] | None, *, digits: int, with_load: bool
) -> str | None:
    """The judged phases, then those measured apart: ``training steps 1.481, worst-case step (2 x 256) 1.344;
    measured apart: probe 1.001, stress 1.386, loading 1.188`` (GiB, ``digits`` decimals; loading only
    ``with_load``); None for no phases (a trial of an older version)."""
    if not phases:
        return None
    worst = f"worst-case step ({shape[0]} x {shape[1]})" if shape else "worst-case step"
    judged = [("training steps", phases.get("train")), (worst, phases.get("worst_case"))]
    apart = [("probe", phases.get("probe")), ("stress", phases.get("stress"))]
    if with_load:
        apart.append(("loading", phases.get("load")))
    text = ", ".join(f"{name} {gib:.{digits}f}" for name, gib in judged if gib is not None)
    others = ", ".join(f"{name} {gib:.{digits}f}" for name, gib in apart if gib is not None)
    return text + (f"; measured apart: {others}" if others else "")


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One measured trial as the report shows it (a point of the front figure, a row of ``--json``'s ``trials``).

    Attributes:
        number: The trial's number.
        state: Optuna's state name (``COMPLETE``, ``PRUNED``, ``FAIL``).
        status: The stored status (``complete``, ``oom``, ``nan`` ...), None when the trial stored none.
        label: The status with its NaN cause (``nan/data``), as the console shows it.
        nan_cause: ``data``, ``precision``, ``optimization``, ``unknown``, or None.
        nan_samples: The samples of the failing step (indices into the dataset), [] when none.
        reason: One line: why it ended so.
        params: Its settings (:func:`sweeper.report._data.trial_params`), in the report's order.
        peak_memory_gib: Its measured peak (GiB; an OOM's is the memory at the failure), None when unknown.
        memory_kind: What the peak measures (``cpu_peak_rss``, ``cuda_max_reserved``), or None.
        phase_peak_memory_gib: The peak of each phase the trial measured apart (``load``, ``train``, ``worst_case``,
            ``probe``, ``stress``; GiB), empty for a trial of an older version.
        worst_case_shape: ``(rows, tokens)`` of its worst-case step, or None.
        predicted_peak_gib: The memory model's prediction before it ran (GiB), or None.
        instability: Its instability, None unless it completed.
        stability: Its stability margin, ``predicted_max_lr`` and headroom with their intervals
            (:class:`sweeper.stability.StabilityFigures`), flat in ``to_dict``; the margin and headroom None unless it
            completed.
        learning_progress: The probe loss's relative drop at its learning rate (a fraction), or None.
        fail_step: The step it failed at, or None.
        steps_done: Optimizer steps it finished.
        on_front: On the study's Pareto front.
        confirmation: Its long run (``sweep confirm``), or None.
        objective_values: The value of each objective the other fields do not already show (a registered third
            objective, :func:`sweeper.report._data.extra_objectives`), by name; None unless it completed.
    """

    number: int
    state: str
    status: str | None
    label: str
    nan_cause: str | None
    nan_samples: tuple[int, ...]
    reason: str
    params: Mapping[str, Any]
    peak_memory_gib: float | None
    memory_kind: str | None
    predicted_peak_gib: float | None
    instability: float | None
    stability: StabilityFigures
    learning_progress: float | None
    fail_step: int | None
    steps_done: int
    on_front: bool
    confirmation: Confirmation | None
    objective_values: Mapping[str, float | None] = field(default_factory=dict)
    phase_peak_memory_gib: Mapping[str, float] = field(default_factory=dict)
    worst_case_shape: tuple[int, int] | None = None

    def phases_line(self) -> str | None:
        """``training steps 1.48, worst-case step (2 x 256) 1.34; measured apart: probe 1.00, stress 1.39`` (GiB),
        None when the trial recorded no phases (:func:`phase_peaks_text`)."""
        return phase_peaks_text(self.phase_peak_memory_gib, self.worst_case_shape, digits=2, with_load=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the fields in order, ``stability`` flattened in its place, ``objective_values`` next (one key
        per objective), then the phase peaks and the worst-case shape."""
        return {
            "number": self.number,
            "state": self.state,
            "status": self.status,
            "label": self.label,
            "nan_cause": self.nan_cause,
            "nan_samples": list(self.nan_samples),
            "reason": self.reason,
            "params": dict(self.params),
            "peak_memory_gib": self.peak_memory_gib,
            "memory_kind": self.memory_kind,
            "predicted_peak_gib": self.predicted_peak_gib,
            "instability": self.instability,
            **self.stability.to_dict(),
            "learning_progress": self.learning_progress,
            "fail_step": self.fail_step,
            "steps_done": self.steps_done,
            "on_front": self.on_front,
            "confirmation": self.confirmation.to_dict() if self.confirmation else None,
            **self.objective_values,
            "phase_peak_memory_gib": dict(self.phase_peak_memory_gib),
            "worst_case_shape": list(self.worst_case_shape) if self.worst_case_shape else None,
        }


@dataclass(frozen=True, kw_only=True)
class FrontData:
    """The front figure's data: every measured trial of the study's current setup.

    Attributes:
        objectives: The study's objective names in order (``peak_memory_gib``, ``edge_proximity``; ``instability``
            second in a study written before the margin; then any other).
        memory_kind: The trials' memory kind when they share one, else None.
        memory_limit_gib: The largest memory cap among the trials' configs (GiB), or None.
        picks: The trial each ``sweep export --pick`` chooses, by pick name.
        points: One record per trial.
        cards: The devices the study's sweeps ran on, by name: ``(device, total_memory_gib)``.
    """

    objectives: tuple[str, ...]
    memory_kind: str | None
    memory_limit_gib: float | None
    picks: Mapping[str, int]
    points: tuple[TrialRecord, ...]
    cards: Mapping[str, tuple[str, float]] = field(default_factory=dict)

    @property
    def knee(self) -> int | None:
        """The number of the front's knee (``sweep export --pick knee``), None without a pick."""
        return self.picks.get("knee")

    @property
    def ranks_by_margin(self) -> bool:
        """The study ranks by the stability margin (``edge_proximity``), not a pre-margin study's instability."""
        return "edge_proximity" in self.objectives


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


#: Which trials a curve belongs to: the front's, a NaN trial's, a diverged trial's.
CurveKind: TypeAlias = Literal["front", "nan", "diverged"]


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


#: What explains one objective (:func:`sweeper.report._importance.importance_data`, by objective name).
ImportancePart: TypeAlias = MemoryEffects | ParamImportance | NotShown


@dataclass(frozen=True, kw_only=True)
class MemoryPrediction:
    """The preflight's predictions against the measured peaks of the complete trials.

    Attributes:
        trials: One row per complete trial with a measured peak (:func:`sweeper.study.prediction_errors`).
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


@dataclass(frozen=True, kw_only=True)
class FrontRow:
    """One trial of the Pareto front as ``sweep report --json`` lists it (and the HTML report's front table).

    Attributes:
        number: The trial's number.
        params: Its settings (:func:`sweeper.report._data.trial_params`).
        objective_values: Its value of each of the study's objectives, by name, in the study's order.
        peak_memory_gib: Its measured peak (GiB): the memory objective's value.
        stability: Its stability margin, ``predicted_max_lr`` and headroom with their intervals
            (:class:`sweeper.stability.StabilityFigures`), flat in ``to_dict``.
        learning_progress: The probe loss's relative drop at its learning rate, or None.
        instability: Its instability, or None.
        confirmation: Its long run (``sweep confirm``), or None.
        tied_with: The other trials shown with the front (its trials and the picks off it) whose stability interval
            overlaps this one's: their difference in stability is within the noise.
    """

    number: int
    params: Mapping[str, Any]
    objective_values: Mapping[str, float]
    peak_memory_gib: float
    stability: StabilityFigures
    learning_progress: float | None
    instability: float | None
    confirmation: Confirmation | None
    tied_with: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``confirmation``, ``number``, ``params``, one key per objective, then the measurements (a
        pre-margin study's ``instability`` objective keeps its place, with the measured value)."""
        return {
            "confirmation": self.confirmation.to_dict() if self.confirmation else None,
            "number": self.number,
            "params": dict(self.params),
            **self.objective_values,
            **self.stability.to_dict(),
            "learning_progress": self.learning_progress,
            "instability": self.instability,
            "tied_with": list(self.tied_with),
        }


@dataclass(frozen=True, kw_only=True)
class Report:
    """What a study says, as ``sweep report --json`` prints it (:meth:`to_dict`) and the HTML report shows it.

    Attributes:
        study: The study's name.
        directions: ``minimize``/``maximize`` per objective.
        objectives: The objective names, in order.
        front: The Pareto front of the current setup, by peak memory.
        trials: Every measured trial.
        status_counts: Trials by status, stale RUNNING ones as ``stale``
            (:func:`sweeper.report._data.counts_with_stale`).
        stale: One line per stale RUNNING trial (:func:`sweeper.study.stale_running`).
        nan_causes: NaN trial numbers by cause.
        largest_max_seq_length_by_batch: The largest ``max_seq_length`` that fit per batch size (None: none fit).
        importance: What explains each objective, by objective name.
        picks: The trial each ``sweep export --pick`` chooses, by pick name.
        pick_lines: Each pick's line, by pick name: the trial, what it chose among and what the user should know
            (``safe #3, among the front's 5 trials; ...``: :attr:`sweeper.study.picks.PickOutcome.line`).
        memory_prediction: The preflight's predictions against the measured peaks.
        other_setups: The line on trials of other setups (:func:`sweeper.report._front_text.other_setups_line`), or
            None.
        cards: The devices the study's sweeps ran on, by name: ``{"device", "total_memory_gib"}`` (what
            :attr:`sweeper.study.StudySnapshot.cards` holds; empty for a study of an older version).
    """

    study: str
    directions: tuple[str, ...]
    objectives: tuple[str, ...]
    front: tuple[FrontRow, ...]
    trials: tuple[TrialRecord, ...]
    status_counts: Mapping[str, int]
    stale: tuple[str, ...]
    nan_causes: Mapping[str, tuple[int, ...]]
    largest_max_seq_length_by_batch: Mapping[int, int | None]
    importance: Mapping[str, ImportancePart]
    picks: Mapping[str, int]
    pick_lines: Mapping[str, str]
    memory_prediction: MemoryPrediction
    other_setups: str | None
    cards: Mapping[str, tuple[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``sweep report --json``: ``{"study", "directions", "objectives", "front", "trials", "status_counts",
        "stale", "nan_causes", "largest_max_seq_length_by_batch", "importance", "picks", "pick_lines",
        "memory_prediction", "other_setups", "cards"}`` (``docs/contract.md``); batch sizes as string keys."""
        return {
            "study": self.study,
            "directions": list(self.directions),
            "objectives": list(self.objectives),
            "front": [f.to_dict() for f in self.front],
            "trials": [t.to_dict() for t in self.trials],
            "status_counts": dict(self.status_counts),
            "stale": list(self.stale),
            "nan_causes": {cause: list(numbers) for cause, numbers in self.nan_causes.items()},
            "largest_max_seq_length_by_batch": {str(b): s for b, s in self.largest_max_seq_length_by_batch.items()},
            "importance": {name: part.to_dict() for name, part in self.importance.items()},
            "picks": dict(self.picks),
            "pick_lines": dict(self.pick_lines),
            "memory_prediction": self.memory_prediction.to_dict(),
            "other_setups": self.other_setups,
            "cards": {name: {"device": d, "total_memory_gib": gib} for name, (d, gib) in self.cards.items()},
        }
