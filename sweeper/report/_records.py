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
from typing import Any, TypeAlias

from sweeper.report._analysis_records import MemoryEffects, MemoryPrediction, NotShown, ParamImportance
from sweeper.stability import StabilityFigures
from sweeper.study import Confirmation


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


#: What explains one objective (:func:`sweeper.report._importance.importance_data`, by objective name).
ImportancePart: TypeAlias = MemoryEffects | ParamImportance | NotShown


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
        stale: One line per stale RUNNING trial (:func:`sweeper.storage._recovery.stale_running`).
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
