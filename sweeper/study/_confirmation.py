"""A trial's confirmation: its long run (``sweep confirm``) as stored on the study, and the attributes it is stored
under."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from sweeper.storage import StudyAttr
from sweeper.trial import TrialResult, TrialStatus

#: Statuses of a long run that say something about the configuration: it held, or it failed by NaN, divergence or
#: memory. A ``timeout``, ``crash`` or ``error`` is the attempt's failure (data missing, a folder not writable, the
#: machine), never the configuration's.
OUTCOME_STATUSES = ("complete", "nan", "diverged", "oom")


@dataclass(frozen=True, kw_only=True)
class Confirmation:
    """The long run of a trial's configuration.

    Attributes:
        steps: Optimizer steps it was asked to run.
        status: How it ended: ``complete``, ``nan``, ``diverged``, ``oom``, ``timeout``, ``crash`` or ``error``.
        reason: One line: what happened.
        fail_step: The step it failed at, else None.
        steps_done: Optimizer steps finished.
        instability: Its instability over the whole long run (:mod:`sweeper.stability`), None when not measured.
        peak_memory_gib: Its peak memory (same kind as the trial's).
        probe_loss_start: The probe loss before its first step.
        probe_loss_end: The probe loss at its last probe (None where non-finite).
        wall_time_s: Seconds it took.
        artifact_id: Id of its trace in the study's artifact store, or None.
        predicted_max_lr: The short trial's ``predicted_max_lr``, None when it has none (an old study).
        predicted_to_hold: Whether that prediction said this run holds (the learning rate at most the low end of
            its 95% interval) or fails (above the high end); None when the rate lies inside the interval (a tie).
        margin_held: Whether the long run agreed with the prediction (it completed when predicted to hold, failed
            when predicted not to); None when not judged.
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps`` of the long run; None
            in a confirmation stored before it was recorded (those ran the trial's own).
        as_exported: It ran the configuration ``sweep export`` writes (``sweep confirm --as-exported``: the
            export's ``gradient_accumulation_steps``), not the trial's.
    """

    steps: int
    status: str
    reason: str = ""
    fail_step: int | None = None
    steps_done: int = 0
    instability: float | None = None
    peak_memory_gib: float | None = None
    probe_loss_start: float | None = None
    probe_loss_end: float | None = None
    wall_time_s: float | None = None
    artifact_id: str | None = None
    predicted_max_lr: float | None = None
    predicted_to_hold: bool | None = None
    margin_held: bool | None = None
    effective_batch_size: int | None = None
    as_exported: bool = False

    @classmethod
    def of(
        cls,
        result: TrialResult,
        *,
        steps: int,
        artifact_id: str | None = None,
        predicted_max_lr: float | None = None,
        predicted_to_hold: bool | None = None,
        margin_held: bool | None = None,
        effective_batch_size: int | None = None,
        as_exported: bool = False,
    ) -> Confirmation:
        """The confirmation of a long run of ``steps`` steps that ended with ``result``: how it ended, its constant
        phase (steps, instability, the probe's first and last loss), its peak memory and wall time; the rest as
        given (what the short trial's margin predicted of it, :func:`sweeper.sweep._confirm.confirm_trials`)."""
        probe = result.constant.probe_loss_trace
        return cls(
            steps=steps,
            status=result.status,
            reason=result.reason,
            fail_step=result.fail_step,
            steps_done=result.constant.steps_done,
            instability=result.constant.instability,
            peak_memory_gib=result.memory.peak_memory_gib,
            probe_loss_start=probe[0] if probe else None,
            probe_loss_end=probe[-1] if probe else None,
            wall_time_s=result.provenance.wall_time_s,
            artifact_id=artifact_id,
            predicted_max_lr=predicted_max_lr,
            predicted_to_hold=predicted_to_hold,
            margin_held=margin_held,
            effective_batch_size=effective_batch_size,
            as_exported=as_exported,
        )

    @property
    def is_outcome(self) -> bool:
        """It says something about the configuration (:data:`OUTCOME_STATUSES`), not only that the attempt failed."""
        return self.status in OUTCOME_STATUSES

    @property
    def passed(self) -> bool:
        """The long run completed."""
        return self.status == TrialStatus.COMPLETE

    @property
    def left_open(self) -> bool:
        """Its short trial's ``predicted_max_lr`` made no prediction of it (the learning rate lay inside the
        prediction's 95% interval), although the run ended with an outcome about the edge (complete, NaN or
        diverged) that a prediction could have been checked against."""
        return (
            self.predicted_to_hold is None
            and self.predicted_max_lr is not None
            and self.status in (TrialStatus.COMPLETE, TrialStatus.NAN, TrialStatus.DIVERGED)
        )

    @property
    def label(self) -> str:
        """``300 ok`` or ``diverged@120`` / ``nan@57`` / ``oom`` ...: for tables."""
        if self.passed:
            return f"{self.steps} ok"
        return f"{self.status}@{self.fail_step}" if self.fail_step is not None else self.status

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Confirmation:
        """Inverse of :meth:`to_dict`; unknown keys (a newer version's) are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def confirmations_in(study_attrs: Mapping[str, Any]) -> dict[int, Confirmation]:
    """Every confirmation in a study's user attributes that is an outcome of the configuration
    (:data:`OUTCOME_STATUSES`), by trial number. One that ended in a run failure (a study written before attempts
    were kept apart recorded a missing data file as ``error@0``) is not one: it neither blocks an export nor a
    rerun."""
    out = {}
    for key, value in study_attrs.items():
        if key.startswith(StudyAttr.CONFIRMATION) and isinstance(value, Mapping):
            try:
                found = Confirmation.from_dict(value)
            except (TypeError, ValueError):
                continue
            if found.is_outcome:
                out[int(key.removeprefix(StudyAttr.CONFIRMATION))] = found
    return out
