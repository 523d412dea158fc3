"""What one trial measured (:class:`TrialResult`), and the statuses it may end with: the record the trial process
writes as JSON and the sweep stores on the Optuna trial as user attributes (``docs/contract.md``).

Shared by both sides of the process boundary; imports neither torch nor optuna.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

Phase = Literal["load", "forward", "backward", "optimizer"]


class TrialStatus(str, enum.Enum):
    """How a trial ended (its ``status`` user attribute), or that it has not yet: the one list of statuses, which
    every status set of the sweep and of the trial process derives from.

    ``COMPLETE`` trials have both objectives. ``NAN``, ``DIVERGED``, ``OOM``, ``PREDICTED_OOM`` and ``DOMINATED_OOM``
    are results about the configuration: the trial is PRUNED and infeasible for the sampler. ``TIMEOUT``, ``CRASH``
    and ``ERROR`` are failures of the run (FAIL), retried where they may go differently. ``RUNNING`` and
    ``WAITING`` have not ended; ``UNKNOWN`` is a finished trial without a status sweeper knows (a study edited by
    hand, or a newer version's status). A result carries one of the first nine.

    A ``str`` enum: it compares equal to, formats and serializes (JSON, Optuna user attributes) as its value.
    """

    COMPLETE = "complete"
    NAN = "nan"
    DIVERGED = "diverged"
    OOM = "oom"
    PREDICTED_OOM = "predicted_oom"
    DOMINATED_OOM = "dominated_oom"
    TIMEOUT = "timeout"
    CRASH = "crash"
    ERROR = "error"
    RUNNING = "running"
    WAITING = "waiting"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def pruned(self) -> bool:
        """A result about the configuration (PRUNED, infeasible): NaN, divergence or out of memory, measured or
        predicted."""
        return self in (
            TrialStatus.NAN,
            TrialStatus.DIVERGED,
            TrialStatus.OOM,
            TrialStatus.PREDICTED_OOM,
            TrialStatus.DOMINATED_OOM,
        )

    @property
    def failed(self) -> bool:
        """A failure of the run, not of the configuration (FAIL): timeout, crash or error."""
        return self in (TrialStatus.TIMEOUT, TrialStatus.CRASH, TrialStatus.ERROR)

    @property
    def retried(self) -> bool:
        """Its configuration is run again (up to ``max_retries``): a crash or a timeout may go differently another
        time; a NaN or an OOM is a result and is never retried."""
        return self in (TrialStatus.CRASH, TrialStatus.TIMEOUT)

    @property
    def fits(self) -> bool | None:
        """Whether the configuration's memory fit the cap, as measured: True for ``complete``, ``nan`` and ``diverged``
        (they ran steps within it), False for ``oom``, None when the trial measured nothing about it."""
        if self in (TrialStatus.COMPLETE, TrialStatus.NAN, TrialStatus.DIVERGED):
            return True
        return False if self is TrialStatus.OOM else None

    @property
    def optuna_state(self) -> str:
        """The name of the ``optuna.trial.TrialState`` a trial of this status is told (or is in): ``COMPLETE``,
        ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING`` (``UNKNOWN``: ``FAIL``, the state of a trial that ended
        without a result sweeper wrote). A name, so that this module imports no optuna (the trial process
        imports it)."""
        if self is TrialStatus.COMPLETE:
            return "COMPLETE"
        if self.pruned:
            return "PRUNED"
        if self in (TrialStatus.RUNNING, TrialStatus.WAITING):
            return self.name
        return "FAIL"


#: Statuses whose trial is PRUNED (a result about the configuration); the other results but ``complete`` are FAIL.
PRUNED_STATUSES = frozenset(s for s in TrialStatus if s.pruned)
FAIL_STATUSES = frozenset(s for s in TrialStatus if s.failed)


@dataclass(kw_only=True)
class TrialResult:
    """What one trial measured. Stored on the optuna trial as user attributes (``docs/contract.md``).

    Attributes:
        status: ``complete``; PRUNED: ``nan``, ``diverged`` (the probe loss rose to
            :data:`sweeper.stability.DIVERGED_RATIO` times its start and stayed), ``oom``, ``predicted_oom``,
            ``dominated_oom``; FAIL: ``timeout``, ``crash``, ``error``.
        reason: One line: what happened, for people.
        fail_step: 1-based optimizer step being run when it failed (0 during load), else None.
        fail_phase: ``load``, ``forward``, ``backward`` or ``optimizer`` for failures inside the trial process, else
            None.
        peak_memory_gib: Peak memory of the trial process in GiB (see ``memory_kind``); known for OOM trials too.
            On the CPU, the peak after the model was loaded (see :mod:`sweeper.trial._child.memory`).
        load_peak_memory_gib: Peak memory in GiB while loading, quantizing and attaching LoRA.
        memory_kind: ``cuda_max_reserved`` or ``cpu_peak_rss``.
        instability: :func:`sweeper.stability.compute_instability` of the trace, higher = closer to divergence.
        instability_components: Its terms, by name.
        loss_trace: Raw training loss per optimizer step; None where non-finite (the failing step of a NaN trial).
        grad_norm_trace: Gradient norm before clipping per optimizer step; None where non-finite.
        max_activation_trace: Largest |output| of the 4-bit layers per step (for fp16/bf16 compute).
        skipped_steps: 1-based steps the fp16 loss scaler skipped.
        steps_done: Optimizer steps finished.
        wall_time_s: Seconds from handing the trial to its trial process (starting it, for a cold trial) to its
            result, as the parent saw it.
        import_time_s: Seconds the trial process spent importing torch/transformers/peft/bitsandbytes.
        load_time_s: Seconds to read the data, load and quantize the model and attach LoRA.
        train_time_s: Seconds inside ``Trainer.train``.
        setup_time_s: Seconds the trial process spent before training started: imports (paid by the first trial of
            a process only), reading the data, loading or reusing the 4-bit model, attaching LoRA.
        warm: Whether the trial ran in a trial process that had already run another trial (imports paid).
        model_reused: Whether it also kept that trial's 4-bit base model (same model-level settings).
        tokens_per_s: Non-padding tokens trained per second of ``train_time_s``.
        quantized_linear_count: ``bitsandbytes.nn.Linear4bit`` modules found after loading.
        lora_alpha: ``lora_alpha_ratio * r``.
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps``.
        device: ``cpu`` or ``cuda:<i> (<name>)``.
        versions: torch, transformers, peft, bitsandbytes, optuna, CUDA.
        nan_cause: After a NaN: ``data``, ``precision`` or ``optimization`` (:mod:`sweeper.trial._child.diagnosis`),
            or None when the replay could not decide.
        nan_samples: After a NaN: dataset indices to blame (the faulty rows for ``data``, else the failing step's).
        nan_module: After a ``precision`` NaN: the first module whose output overflowed.
        supervised_tokens_trace: Tokens the loss was computed on, per optimizer step (the failing step included).
        min_supervised_tokens: Its minimum; 0 means a step had nothing to learn from and its loss was 0/0.
        longest_sample_tokens: Tokens (before truncation) of the longest sample the trial trained on.
        longest_sample_index: Its dataset index.
        truncated_sample_fraction: Share of the samples trained on that ``max_seq_length`` cut, 0-1.
        predicted_peak_gib: The memory model's prediction for this trial (:mod:`sweeper.memory`), in the same
            kind as ``peak_memory_gib`` (CUDA reserved, or CPU resident set), set by the sweep before it runs.
        probe_steps: Optimizer steps at which the probe was evaluated (0: before the first step).
        probe_loss_trace: The probe's loss at each (:mod:`sweeper.stability`), None where non-finite.
        probe_max_activation_trace: Largest |activation| of the 4-bit layers during each probe (fp16/bf16 compute).
        probe_time_s: Seconds spent evaluating the probe (inside ``train_time_s``).
        probe_time_share: ``probe_time_s`` over the rest of ``train_time_s``: the probe's cost as a share of training.
        projected_fail_step: The step at which the rising probe loss would reach the divergence ratio, extrapolated
            (:func:`sweeper.stability.projected_fail_step`); None when it is not rising.
        lr_ceiling: The learning rate at which the stress phase (an LR range test after the constant phase,
            :data:`sweeper.stability.STRESS_GROWTH`) diverged; None when it reached its cap or did not run.
        stability_margin: ``lr_ceiling / learning_rate`` (> 1; the cap, :data:`sweeper.stability.STRESS_CAP`, when
            ``margin_capped``); None when not measured (a trial that did not complete its constant phase).
        margin_capped: The stress phase reached the cap without diverging: the margin is a lower bound.
        predicted_max_lr: The largest constant learning rate a 300-step run is predicted to hold at:
            ``lr_ceiling * LONG_RUN_FACTOR`` (:data:`sweeper.stability.LONG_RUN_FACTOR`, measured by
            ``benchmarks/validity.py``); a lower bound when capped.
        learning_progress: The probe loss's relative drop over the constant phase (:func:`sweeper.stability.
            learning_progress`); about 0 for a run that learns nothing.
        stress_stop: How the stress phase ended: ``diverged``, ``nan``, ``overflow``, ``cap``, ``oom``, ``error``;
            None when it did not run.
        stress_steps: Stress steps finished.
        stress_lr_trace, stress_loss_trace, stress_probe_loss_trace: Per stress step: its learning rate, training
            loss and the probe loss after it (None where non-finite).
        stress_time_s: Seconds the stress phase took (not inside ``train_time_s``).
        stress_time_share: ``stress_time_s / train_time_s``: its cost over the constant phase's.
        stress_peak_memory_gib: Peak memory in GiB over both phases (``peak_memory_gib`` is the constant phase's).
    """

    status: TrialStatus
    reason: str = ""
    fail_step: int | None = None
    fail_phase: Phase | None = None
    peak_memory_gib: float | None = None
    load_peak_memory_gib: float | None = None
    memory_kind: str | None = None
    instability: float | None = None
    instability_components: dict[str, float] = field(default_factory=dict)
    loss_trace: list[float | None] = field(default_factory=list)
    grad_norm_trace: list[float | None] = field(default_factory=list)
    max_activation_trace: list[float | None] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    steps_done: int = 0
    wall_time_s: float | None = None
    import_time_s: float | None = None
    load_time_s: float | None = None
    train_time_s: float | None = None
    setup_time_s: float | None = None
    warm: bool | None = None
    model_reused: bool | None = None
    tokens_per_s: float | None = None
    quantized_linear_count: int | None = None
    lora_alpha: float | None = None
    effective_batch_size: int | None = None
    device: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    nan_cause: Literal["data", "precision", "optimization"] | None = None
    nan_samples: list[int] = field(default_factory=list)
    nan_module: str | None = None
    supervised_tokens_trace: list[int] = field(default_factory=list)
    min_supervised_tokens: int | None = None
    longest_sample_tokens: int | None = None
    longest_sample_index: int | None = None
    truncated_sample_fraction: float | None = None
    predicted_peak_gib: float | None = None
    probe_steps: list[int] = field(default_factory=list)
    probe_loss_trace: list[float | None] = field(default_factory=list)
    probe_max_activation_trace: list[float | None] = field(default_factory=list)
    probe_time_s: float | None = None
    probe_time_share: float | None = None
    projected_fail_step: int | None = None
    lr_ceiling: float | None = None
    stability_margin: float | None = None
    margin_capped: bool | None = None
    predicted_max_lr: float | None = None
    learning_progress: float | None = None
    stress_stop: str | None = None
    stress_steps: int | None = None
    stress_lr_trace: list[float] = field(default_factory=list)
    stress_loss_trace: list[float | None] = field(default_factory=list)
    stress_probe_loss_trace: list[float | None] = field(default_factory=list)
    stress_time_s: float | None = None
    stress_time_share: float | None = None
    stress_peak_memory_gib: float | None = None

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)  # a value read back from JSON or a user attribute

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (the status as its value)."""
        out = asdict(self)
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (results of newer workers)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
