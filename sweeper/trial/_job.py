"""The protocol between the sweep and a trial process, both ways (shared by both sides of the process boundary;
imports neither torch nor optuna).

Sweep to trial process: a :class:`TrialJob` per trial, one JSON object per line on the process's stdin, naming the
trial's files and how it measures (:class:`StressSettings`, :class:`ProbeSettings`): a warm process takes them per
job. Trial process to sweep, on the control pipe (``SWEEPER_CONTROL_FD``): any number of
:class:`TrialProgress` lines while the trial runs, then one :class:`TrialDone` line once its result file is written.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, get_args

from sweeper.errors import ExperimentalWarning
from sweeper.stability import STRESS_GROWTH, STRESS_STEPS

#: The experimental instruments a job may name (:attr:`Measures.experimental`).
EXPERIMENTAL_MEASURES = ("critical_lr",)


@dataclass(frozen=True)
class StressSettings:
    """The stress phase a trial runs after its constant phase (an LR range test, :mod:`sweeper.stability`): stress
    step ``j`` (1-based) trains at ``learning_rate * growth**j``, up to ``steps`` steps; its cap, the margin of a
    trial that holds to the last step, is ``growth**steps``.

    Attributes:
        steps: Stress steps at most (>= 1; default :data:`sweeper.stability.STRESS_STEPS`).
        growth: The learning rate's factor per stress step (> 1; default :data:`sweeper.stability.STRESS_GROWTH`).

    Raises:
        ValueError: ``steps`` below 1 or ``growth`` not above 1.
    """

    steps: int = STRESS_STEPS
    growth: float = STRESS_GROWTH

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"stress steps must be an integer >= 1, but got {self.steps!r}")
        if not isinstance(self.growth, (int, float)) or not math.isfinite(self.growth) or self.growth <= 1:
            raise ValueError(f"stress growth must be a finite number > 1, but got {self.growth!r}")

    @property
    def cap(self) -> float:
        """``growth**steps``: the ``stability_margin`` of a trial that holds to the last stress step."""
        return float(self.growth**self.steps)


@dataclass(frozen=True)
class ProbeSettings:
    """The probe a trial evaluates while it trains (:mod:`sweeper.stability`).

    Attributes:
        interval_steps: Optimizer steps between two probes (>= 1), or None for
            :func:`sweeper.stability.probe_interval_steps` of the trial's batch (the default).

    Raises:
        ValueError: ``interval_steps`` below 1.
    """

    interval_steps: int | None = None

    def __post_init__(self) -> None:
        n = self.interval_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"probe interval must be an integer >= 1 or None, but got {n!r}")


#: The stress phase and the probe a trial runs unless its job says otherwise.
DEFAULT_STRESS = StressSettings()
DEFAULT_PROBE = ProbeSettings()


@dataclass(frozen=True)
class Measures:
    """What a trial measures besides its training, declared once: the job carries it to the trial process, and the
    trial's context (:class:`sweeper.trial._child.context.TrialContext`) hands it to the recipe.

    Attributes:
        stress: The stress phase to run after the constant phase, or None for none (a constant-rate run only: a
            confirmation, the validity benchmark's long runs). It needs the probe: without one there is none.
        probe: The probe, or None for none (a diagnostic: the tests compare training with and without it; the trial
            then has no instability, projected failing step, learning progress or stress phase).
        worst_case: Measure the worst-case step after step 1 (:class:`sweeper.trial._child.instruments.worst_case.
            WorstCase`); False is a diagnostic (the tests compare training with and without it).
        worst_case_samples: The dataset indices of the whole file's worst step, a row at a time, the longest first
            (:meth:`sweeper.data.FileLengths.worst_step`), when ``dataset.max_samples`` sampled fewer rows than the
            file the exports train: the worst-case step is built from these samples of the file instead of the
            trial's own rows. Empty: the trial's own rows.
        experimental: The experimental instruments to run, by name (:data:`EXPERIMENTAL_MEASURES`: ``critical_lr``,
            the critical learning rate's line searches, :mod:`sweeper.stability.experimental`; it needs the probe's
            rows). None by default; naming one warns :class:`sweeper.errors.ExperimentalWarning`: the critical rate
            costs 13-37% of the constant phase and predicted the long run worse than the margin (docs/validity.md),
            and its figures are stored under ``experimental``, outside the stable stored attributes.

    Raises:
        ValueError: ``experimental`` names none of :data:`EXPERIMENTAL_MEASURES`.
    """

    stress: StressSettings | None = DEFAULT_STRESS
    probe: ProbeSettings | None = DEFAULT_PROBE
    worst_case: bool = True
    worst_case_samples: Sequence[Sequence[int]] = ()  # held as tuples (__post_init__)
    experimental: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # any sequences of sequences (a list read from JSON, sweeper.data.FileLengths.worst_step's) as tuples
        object.__setattr__(self, "worst_case_samples", tuple(tuple(int(i) for i in r) for r in self.worst_case_samples))
        object.__setattr__(self, "experimental", tuple(self.experimental))
        unknown = sorted(set(self.experimental) - set(EXPERIMENTAL_MEASURES))
        if unknown:
            raise ValueError(f"experimental measures must be among {list(EXPERIMENTAL_MEASURES)}, but got {unknown}")
        if self.experimental:
            warnings.warn(
                f"{', '.join(self.experimental)}: experimental, no interface promise; its figures are stored under "
                "'experimental', outside the stable stored attributes",
                ExperimentalWarning,
                stacklevel=3,
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measures:
        """Inverse of ``dataclasses.asdict``.

        Raises:
            ValueError: Settings out of range. TypeError: Keys missing or unknown.
        """
        stress, probe = data.get("stress"), data.get("probe")
        with warnings.catch_warnings():  # the job's sender was warned; the trial process's log needs no copy
            warnings.simplefilter("ignore", ExperimentalWarning)
            return cls(
                stress=StressSettings(**stress) if stress is not None else None,
                probe=ProbeSettings(**probe) if probe is not None else None,
                worst_case=data.get("worst_case", True),
                worst_case_samples=data.get("worst_case_samples", ()),
                experimental=tuple(str(name) for name in data.get("experimental", ())),
            )


#: What a trial measures unless its job says otherwise: today's stress phase, probe and worst-case step.
DEFAULT_MEASURES = Measures()


@dataclass(frozen=True)
class TrialJob:
    """One trial for a trial process to run.

    Attributes:
        config_path: ``config.json``: ``{"config": TrialConfig.to_dict(), "model_path": str}``.
        result_path: Where the process writes the :class:`~sweeper.trial._result.TrialResult` as JSON.
        log_path: ``worker.log``: the process's stdout and stderr while it runs this trial.
        trial_dir: The trial's folder (the trainer's output, ``nan_batch.jsonl``).
        measures: Its stress phase, probe and worst-case step (:class:`Measures`).
    """

    config_path: str
    result_path: str
    log_path: str
    trial_dir: str
    measures: Measures = DEFAULT_MEASURES

    def to_line(self) -> str:
        """The job as one JSON line, newline included."""
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def from_line(cls, line: str) -> TrialJob:
        """Inverse of :meth:`to_line` (extra keys are an error: the two sides are one version).

        Raises:
            ValueError: Not JSON, or settings out of range. TypeError: Keys missing or unknown.
        """
        data = json.loads(line)
        if isinstance(data.get("measures"), dict):
            data["measures"] = Measures.from_dict(data["measures"])
        return cls(**data)


#: What a running trial is doing: loading (reading the data, loading or reusing the 4-bit model, attaching LoRA),
#: its constant phase (``train``), or its stress phase (``stress``).
ProgressPhase = Literal["load", "train", "stress"]
PROGRESS_PHASES: tuple[str, ...] = get_args(ProgressPhase)


def _optional(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        raise ValueError(f"progress field {key!r} must be {kind.__name__}, but got {value!r}")
    return kind(value)


@dataclass(frozen=True)
class TrialProgress:
    """What a running trial is doing, as its trial process reports it on the control pipe: a line
    ``{"progress": {"phase": ..., "step": ..., ...}}`` (fields that are None are left out), at most a few a second.

    Attributes:
        phase: ``load``, ``train`` (the constant phase) or ``stress`` (the stress phase).
        step: Optimizer steps of the phase done (1-based, the stress phase's counted from its start), or None.
        of: Steps of the phase (``max_steps``; the stress phase's at most), or None.
        loss: The last step's training loss (finite), or None.
        peak_memory_gib: Peak memory of the trial so far in GiB (as ``peak_memory_gib`` of the result), or None.
    """

    phase: ProgressPhase
    step: int | None = None
    of: int | None = None
    loss: float | None = None
    peak_memory_gib: float | None = None

    def to_line(self) -> bytes:
        """The report as one JSON line, newline included (about 100 bytes: one atomic pipe write)."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return (json.dumps({"progress": fields}) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> TrialProgress | None:
        """Inverse of :meth:`to_line`; None for a line that is not a progress line (not a JSON object with a
        ``progress`` key: the :class:`TrialDone` line, or anything else). Unknown fields are ignored.

        Raises:
            ValueError: A progress line whose fields are not as :meth:`to_line` writes them (an unknown phase, a
                step that is not an integer, a non-finite loss).
        """
        try:
            data = json.loads(line)
        except ValueError:
            return None
        if not isinstance(data, dict) or "progress" not in data:
            return None
        fields = data["progress"]
        if not isinstance(fields, dict) or fields.get("phase") not in PROGRESS_PHASES:
            raise ValueError(f"not a progress report: {fields!r}")
        loss = _optional(fields, "loss", float)
        if loss is not None and not math.isfinite(loss):
            raise ValueError(f"progress loss must be finite, but got {loss!r}")
        return cls(
            phase=fields["phase"],
            step=_optional(fields, "step", int),
            of=_optional(fields, "of", int),
            loss=loss,
            peak_memory_gib=_optional(fields, "peak_memory_gib", float),
        )


@dataclass(frozen=True)
class TrialDone:
    """The trial process's last line for a trial, written after its result file: ``{"reusable": bool}``.

    Attributes:
        reusable: Whether the process can take another trial (:attr:`sweeper.trial._child.warm.WarmState.reusable`).
    """

    reusable: bool

    def to_line(self) -> bytes:
        """The line, newline included."""
        return (json.dumps({"reusable": self.reusable}) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes) -> TrialDone:
        """Inverse of :meth:`to_line`. Any line ends the trial: one that does not say ``"reusable": true`` (garbled,
        or not JSON) is not reusable, so its process is replaced."""
        try:
            data = json.loads(line)
        except ValueError:
            return cls(reusable=False)
        return cls(reusable=isinstance(data, dict) and data.get("reusable") is True)
