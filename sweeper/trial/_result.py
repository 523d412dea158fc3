"""What one trial measured (:class:`TrialResult`), and the statuses it may end with: the record the trial process
writes as JSON and the sweep stores on the Optuna trial as user attributes (``docs/contract.md``).

Shared by both sides of the process boundary; imports neither torch nor optuna.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from sweeper.trial._status import TrialStatus

Phase = Literal["load", "forward", "backward", "optimizer"]


#: Field metadata key: the field's place in the stored flat dict (:meth:`TrialResult.to_dict`), 0 first.
_AT = "stored_at"
#: Field metadata key: the field's stored name (the user attribute, ``docs/contract.md``) where it is not its own.
_NAME = "stored_name"


def _stored(
    at: int, *, name: str | None = None, default: Any = None, factory: Any = None, required: bool = False
) -> Any:
    """A field stored flat as a user attribute: its place ``at`` in :meth:`TrialResult.to_dict`'s dict and, where
    it differs from the field's name, its stored ``name``: the one declaration of both. Its default is ``default``,
    or ``factory()``, or none when ``required``."""
    metadata = {_AT: at} if name is None else {_AT: at, _NAME: name}
    if required:
        return field(metadata=metadata)
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(kw_only=True)
class MemoryReading:
    """What a trial's memory measured, and what the memory model predicted of it, in GiB.

    Attributes:
        peak_memory_gib: The peak of the steps the user's run takes (see ``memory_kind``): the larger of the
            training steps' peak and the worst-case step's (one micro-batch of the data's longest rows, as the
            trial's collation builds it: ``worst_case_shape``); the probe, the stress phase and loading are measured
            apart (``phase_peak_memory_gib``). Known for OOM trials too (the peak reached before the failure). On
            the CPU, the peak after the model was loaded (see :mod:`sweeper.trial._child.memory`).
        load_peak_memory_gib: Peak memory while loading, quantizing and attaching LoRA.
        memory_kind: ``cuda_max_reserved`` or ``cpu_peak_rss``.
        predicted_peak_gib: The memory model's prediction for this trial (:mod:`sweeper.memory`), in the same kind
            as ``peak_memory_gib`` (CUDA reserved, or CPU resident set), set by the sweep before it runs.
        stress_peak_memory_gib: Peak memory of the stress phase's steps; None without a stress phase.
        phase_peak_memory_gib: Peak memory of each phase measured, by name (``load``, ``train``, ``worst_case``,
            ``probe``, ``stress``: :data:`sweeper.trial._child.memory.MEMORY_PHASES`), each read apart from the
            others (the allocator's cache emptied and the peak statistics reset between them).
        worst_case_shape: ``[rows, tokens]`` of the worst-case step measured (None: it did not run).
    """

    peak_memory_gib: float | None = _stored(4)
    load_peak_memory_gib: float | None = _stored(5)
    memory_kind: str | None = _stored(6)
    predicted_peak_gib: float | None = _stored(35)
    stress_peak_memory_gib: float | None = _stored(54)
    phase_peak_memory_gib: dict[str, float] = _stored(61, factory=dict)
    worst_case_shape: list[int] | None = _stored(62)


@dataclass(kw_only=True)
class ConstantPhase:
    """What the constant phase (``max_steps`` optimizer steps at the trial's learning rate) recorded: its traces,
    its probe (:mod:`sweeper.stability`), its cost, and the stability read from them.

    Attributes:
        instability: :func:`sweeper.stability.compute_instability` of the trace, higher = closer to divergence.
        instability_components: Its terms, by name.
        loss_trace: Raw training loss per optimizer step; None where non-finite (the failing step of a NaN trial).
        grad_norm_trace: Gradient norm before clipping per optimizer step; None where non-finite.
        max_activation_trace: Largest |output| of the 4-bit layers per step (for fp16/bf16 compute).
        skipped_steps: 1-based steps the fp16 loss scaler skipped.
        steps_done: Optimizer steps finished.
        train_time_s: Seconds inside ``Trainer.train``, the probe's included, the worst-case step's not.
        worst_case_time_s: Seconds the worst-case step took (one forward and backward of the data's longest rows,
            undone; its memory phase's changes included); None where it did not run.
        tokens_per_s: Non-padding tokens trained per second of ``train_time_s``.
        data_token_share: The share of the tokens the constant phase's steps processed that are the data's own
            (the rest is padding), in ``[0, 1]``.
        probe_steps: Optimizer steps at which the probe was evaluated (0: before the first step).
        probe_loss_trace: The probe's loss at each (:mod:`sweeper.stability`), None where non-finite.
        probe_max_activation_trace: Largest |activation| of the 4-bit layers during each probe (fp16/bf16 compute).
        probe_time_s: Seconds spent evaluating the probe (inside ``train_time_s``).
        probe_time_share: ``probe_time_s`` over the rest of ``train_time_s``: the probe's cost as a share of training.
        projected_fail_step: The step at which the rising probe loss would reach the divergence ratio, extrapolated
            (:func:`sweeper.stability.projected_fail_step`); None when it is not rising.
        learning_progress: The probe loss's relative drop over the phase (:func:`sweeper.stability.
            learning_progress`); about 0 for a run that learns nothing.
        update_ratio_trace: At each probe, the LoRA update's size over the base weights',
            ``sqrt(sum ||scaling * B A||_F^2) / sqrt(sum ||W||_F^2)`` over the adapted layers
            (:func:`sweeper.trial._child.instrumented.update_to_weight_ratio`); 0 before the first step (B starts
            at 0). A candidate early sign of divergence: failed LoRA solutions are high-norm (Kim et al. 2025).
    """

    instability: float | None = _stored(7)
    instability_components: dict[str, float] = _stored(8, factory=dict)
    loss_trace: list[float | None] = _stored(9, factory=list)
    grad_norm_trace: list[float | None] = _stored(10, factory=list)
    max_activation_trace: list[float | None] = _stored(11, factory=list)
    skipped_steps: list[int] = _stored(12, factory=list)
    steps_done: int = _stored(13, default=0)
    train_time_s: float | None = _stored(17)
    tokens_per_s: float | None = _stored(21)
    worst_case_time_s: float | None = _stored(65)
    data_token_share: float | None = _stored(63)
    probe_steps: list[int] = _stored(36, factory=list)
    probe_loss_trace: list[float | None] = _stored(37, factory=list)
    probe_max_activation_trace: list[float | None] = _stored(38, factory=list)
    probe_time_s: float | None = _stored(39)
    probe_time_share: float | None = _stored(40)
    projected_fail_step: int | None = _stored(41)
    learning_progress: float | None = _stored(46)
    update_ratio_trace: list[float | None] = _stored(55, factory=list)


@dataclass(kw_only=True)
class CriticalLr:
    """The critical learning rate (:mod:`sweeper.stability._critical`, after Kalra et al., arXiv 2601.16979): at a
    few points of the constant phase, the smallest multiple of the trial's learning rate at which a step along the
    optimizer's own next update (computed, not applied) raises a probe row's loss. Empty (all None) where no line
    search ran: a trial that ended before its first point, one without a probe, or one whose search could not run
    (``line_search_skipped`` says why).

    Attributes:
        critical_lr_multiple: The median reading over every point and row, x the trial's learning rate.
        critical_lr_multiple_low, critical_lr_multiple_high: The last point's readings' spread, widened to the
            search's resolution (``sqrt(2)``) each side.
        critical_lr_slope_per_step: The trend of the reading's logarithm per optimizer step (least squares);
            negative: the critical rate falls (progressive sharpening).
        critical_lr_projected_step: The optimizer step at which the trend meets the trial's own rate, None when it
            does not within 20 times the constant phase; ``_low``/``_high`` its 95% interval (``_high`` None: beyond
            that horizon).
        critical_lr_readings: ``[step, row, multiple, censored]`` per reading (``censored``: the search's range
            ended before the bracket closed, so the multiple is a bound).
        line_search_time_s: Seconds the line searches took (outside ``train_time_s``).
        line_search_time_share: That over ``train_time_s``.
        line_search_forwards: Forward passes they took.
        line_search_skipped: Why a line search did not run (out of memory under the cap, a non-finite gradient), None
            when every point ran.
        critical_lr_step_multiple, critical_lr_step_readings: The same, read on the mean loss of the step's own
            micro-batches (the batches the update was computed on) instead of the probe rows: the median and
            ``[step, micro-batch, multiple, censored]`` per reading.
    """

    critical_lr_multiple: float | None = _stored(66)
    critical_lr_multiple_low: float | None = _stored(67)
    critical_lr_multiple_high: float | None = _stored(68)
    critical_lr_slope_per_step: float | None = _stored(69)
    critical_lr_projected_step: int | None = _stored(70)
    critical_lr_projected_step_low: int | None = _stored(71)
    critical_lr_projected_step_high: int | None = _stored(72)
    critical_lr_readings: list[list[Any]] = _stored(73, factory=list)
    line_search_time_s: float | None = _stored(74)
    line_search_time_share: float | None = _stored(75)
    line_search_forwards: int | None = _stored(76)
    line_search_skipped: str | None = _stored(77)
    critical_lr_step_multiple: float | None = _stored(78)
    critical_lr_step_readings: list[list[Any]] = _stored(79, factory=list)


@dataclass(kw_only=True)
class StressOutcome:
    """What the stress phase measured: an LR range test after the constant phase
    (:data:`sweeper.stability.STRESS_GROWTH` per step), which gives the stability margin
    (:func:`sweeper.stability.margin_of`). Empty (all None) when it did not run: a trial that did not complete its
    constant phase, or one run without it. Stored as ``stress_*`` where the field's own name is not stored.

    Attributes:
        lr_ceiling: The learning rate at which the stress phase diverged; None when it reached its cap or did not
            run.
        stability_margin: ``lr_ceiling / learning_rate`` (> 1; the cap, :data:`sweeper.stability._margin.STRESS_CAP`,
        when
            ``margin_capped``); None when not measured.
        margin_capped: The stress phase reached the cap without diverging: the margin is a lower bound.
        predicted_max_lr: The largest constant learning rate a 300-step run is predicted to hold at:
            ``lr_ceiling * LONG_RUN_FACTOR`` (:data:`sweeper.stability._margin.LONG_RUN_FACTOR`, measured by
            ``benchmarks/validity.py``); a lower bound when capped.
        stop: How the stress phase ended (``stress_stop``): ``diverged``, ``nan``, ``overflow``, ``cap``, ``oom``,
            ``error``; None when it did not run.
        steps: Stress steps finished (``stress_steps``).
        lr_trace, loss_trace, probe_loss_trace: Per stress step (``stress_lr_trace``, ``stress_loss_trace``,
            ``stress_probe_loss_trace``): its learning rate, training loss and the probe loss after it (None where
            non-finite).
        time_s: Seconds the stress phase took (``stress_time_s``; not inside ``train_time_s``).
        time_share: ``time_s / train_time_s`` (``stress_time_share``): its cost over the constant phase's.
        stability_margin_low, stability_margin_high: The margin's interval from the short trial's seed noise
            (:func:`sweeper.stability.margin_interval`); ``high`` is None when capped (unbounded above).
        predicted_max_lr_low, predicted_max_lr_high: ``predicted_max_lr``'s 95% interval from its calibration's
            spread (:func:`sweeper.stability.predicted_max_lr`); ``high`` is None when capped.
        predicted_max_lr_source: Which calibration factor made ``predicted_max_lr``: ``uncalibrated: factor from
            SmolLM2-135M (...)``, or, in a study ``sweep calibrate`` measured, ``calibrated on this study's model
            (n edges, spread x)``.
        predicted_max_lr_calibrated: That factor was the study's own (``sweep calibrate``); False or None (a trial
            stored before it was recorded): the built-in factor.
    """

    lr_ceiling: float | None = _stored(42)
    stability_margin: float | None = _stored(43)
    margin_capped: bool | None = _stored(44)
    predicted_max_lr: float | None = _stored(45)
    stop: str | None = _stored(47, name="stress_stop")
    steps: int | None = _stored(48, name="stress_steps")
    lr_trace: list[float] = _stored(49, name="stress_lr_trace", factory=list)
    loss_trace: list[float | None] = _stored(50, name="stress_loss_trace", factory=list)
    probe_loss_trace: list[float | None] = _stored(51, name="stress_probe_loss_trace", factory=list)
    time_s: float | None = _stored(52, name="stress_time_s")
    time_share: float | None = _stored(53, name="stress_time_share")
    stability_margin_low: float | None = _stored(56)
    stability_margin_high: float | None = _stored(57)
    predicted_max_lr_low: float | None = _stored(58)
    predicted_max_lr_high: float | None = _stored(59)
    predicted_max_lr_source: str | None = _stored(60)
    predicted_max_lr_calibrated: bool | None = _stored(64)


@dataclass(kw_only=True)
class NanFindings:
    """What the replay after a NaN found (:mod:`sweeper.trial._child.diagnosis`); empty for any other status.

    Attributes:
        cause: ``data``, ``precision`` or ``optimization`` (``nan_cause``), or None when the replay could not decide.
        samples: Dataset indices to blame (``nan_samples``): the faulty rows for ``data``, else the failing step's.
        module: After a ``precision`` NaN: the first module whose output overflowed (``nan_module``).
    """

    cause: Literal["data", "precision", "optimization"] | None = _stored(27, name="nan_cause")
    samples: list[int] = _stored(28, name="nan_samples", factory=list)
    module: str | None = _stored(29, name="nan_module")


@dataclass(kw_only=True)
class DataReading:
    """What the samples a trial trained on were like (:class:`sweeper.trial._child.measurements.Measurements`).

    Attributes:
        supervised_tokens_trace: Tokens the loss was computed on, per optimizer step (the failing step included).
        min_supervised_tokens: Its minimum; 0 means a step had nothing to learn from and its loss was 0/0.
        longest_sample_tokens: Tokens (before truncation) of the longest sample the trial trained on.
        longest_sample_index: Its dataset index.
        truncated_sample_fraction: Share of the samples trained on that ``max_seq_length`` cut, 0-1.
    """

    supervised_tokens_trace: list[int] = _stored(30, factory=list)
    min_supervised_tokens: int | None = _stored(31)
    longest_sample_tokens: int | None = _stored(32)
    longest_sample_index: int | None = _stored(33)
    truncated_sample_fraction: float | None = _stored(34)


@dataclass(kw_only=True)
class Provenance:
    """How and where a trial ran: its timings outside training, its process, the settings derived from its
    configuration, the machine and the library versions.

    Attributes:
        wall_time_s: Seconds from handing the trial to its trial process (starting it, for a cold trial) to its
            result, as the parent saw it.
        import_time_s: Seconds the trial process spent importing torch/transformers/peft/bitsandbytes.
        load_time_s: Seconds to read the data, load and quantize the model and attach LoRA.
        setup_time_s: Seconds the trial process spent before training started: imports (paid by the first trial of
            a process only), reading the data, loading or reusing the 4-bit model, attaching LoRA.
        warm: Whether the trial ran in a trial process that had already run another trial (imports paid).
        model_reused: Whether it also kept that trial's 4-bit base model (same model-level settings).
        quantized_linear_count: ``bitsandbytes.nn.Linear4bit`` modules found after loading.
        lora_alpha: ``lora_alpha_ratio * r``.
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps``.
        device: ``cpu`` or ``cuda:<i> (<name>)``.
        versions: torch, transformers, peft, bitsandbytes, optuna, CUDA.
    """

    wall_time_s: float | None = _stored(14)
    import_time_s: float | None = _stored(15)
    load_time_s: float | None = _stored(16)
    setup_time_s: float | None = _stored(18)
    warm: bool | None = _stored(19)
    model_reused: bool | None = _stored(20)
    quantized_linear_count: int | None = _stored(22)
    lora_alpha: float | None = _stored(23)
    effective_batch_size: int | None = _stored(24)
    device: str | None = _stored(25)
    versions: dict[str, str | None] = _stored(26, factory=dict)


@dataclass(kw_only=True)
class TrialResult:
    """What one trial measured: how it ended, and its measurements grouped by meaning. Stored on the optuna trial
    as flat user attributes (``docs/contract.md``, :meth:`to_dict`): each part's fields under their stored names.

    Attributes:
        status: ``complete``; PRUNED: ``nan``, ``diverged`` (the probe loss rose to
            :data:`sweeper.stability._instability.DIVERGED_RATIO` times its start and stayed), ``oom``,
            ``predicted_oom``, ``dominated_oom``; FAIL: ``timeout``, ``crash``, ``error``.
        reason: One line: what happened, for people.
        fail_step: 1-based optimizer step being run when it failed (0 during load), else None.
        fail_phase: ``load``, ``forward``, ``backward`` or ``optimizer`` for failures inside the trial process, else
            None.
        memory: Its memory, measured and predicted (:class:`MemoryReading`).
        constant: Its constant phase: traces, probe, instability (:class:`ConstantPhase`).
        stress: Its stress phase and stability margin (:class:`StressOutcome`).
        critical: Its critical learning rate, read by line searches in the constant phase (:class:`CriticalLr`).
        nan: After a NaN, the diagnosis (:class:`NanFindings`).
        data: The samples it trained on (:class:`DataReading`).
        provenance: Timings, process, derived settings, device and versions (:class:`Provenance`).
    """

    status: TrialStatus = _stored(0, required=True)
    reason: str = _stored(1, default="")
    fail_step: int | None = _stored(2)
    fail_phase: Phase | None = _stored(3)
    memory: MemoryReading = field(default_factory=MemoryReading)
    constant: ConstantPhase = field(default_factory=ConstantPhase)
    stress: StressOutcome = field(default_factory=StressOutcome)
    critical: CriticalLr = field(default_factory=CriticalLr)
    nan: NanFindings = field(default_factory=NanFindings)
    data: DataReading = field(default_factory=DataReading)
    provenance: Provenance = field(default_factory=Provenance)

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)  # a value read back from JSON or a user attribute

    def to_dict(self) -> dict[str, Any]:
        """The flat dict stored as user attributes and written as JSON: every field under its stored name, in the
        stored order (``docs/contract.md``), the status as its value; lists and dicts are copies."""
        out: dict[str, Any] = {}
        for slot in _LAYOUT:
            owner = self if slot.part is None else getattr(self, slot.part)
            out[slot.stored] = copy.deepcopy(getattr(owner, slot.attr))
        out["status"] = self.status.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """Inverse of :meth:`to_dict`: a flat dict of stored names; a missing key takes the field's default (an
        older study's), unknown keys are ignored (results of newer workers).

        Raises:
            TypeError: ``data`` has no ``status``.
            ValueError: Its ``status`` is none of :class:`TrialStatus`.
        """
        if "status" not in data:
            raise TypeError("a TrialResult needs its status")
        result = cls(status=data["status"])
        result.update(data, strict=False)
        return result

    def update(self, values: Mapping[str, Any], *, strict: bool = True) -> None:
        """Set fields by their stored names (``peak_memory_gib``, ``stress_stop``, ...) from a flat mapping.

        Raises:
            KeyError: With ``strict``, a key is no stored name (a renamed field).
        """
        for key, value in values.items():
            slot = _BY_STORED.get(key)
            if slot is None:
                if strict:
                    raise KeyError(f"{key} is no stored TrialResult field")
                continue
            setattr(self if slot.part is None else getattr(self, slot.part), slot.attr, value)
        self.status = TrialStatus(self.status)

    @staticmethod
    def stored_names() -> tuple[str, ...]:
        """The stored names of every field, in the stored order (the keys of :meth:`to_dict`)."""
        return tuple(slot.stored for slot in _LAYOUT)


@dataclass(frozen=True)
class _Slot:
    """Where one stored attribute lives: the part (None: the result itself), the field, its stored name and place."""

    part: str | None
    attr: str
    stored: str
    at: int


def _layout() -> tuple[_Slot, ...]:
    """Every stored field of :class:`TrialResult` and its parts, in stored order, read from the field metadata.

    Raises:
        TypeError: Two fields share a place or a stored name, or the places are not 0..n-1 (a declaration error).
    """
    slots = []
    for top in fields(TrialResult):
        if _AT in top.metadata:
            slots.append(_Slot(None, top.name, top.metadata.get(_NAME, top.name), top.metadata[_AT]))
            continue
        part_type = top.default_factory
        for f in fields(part_type):  # type: ignore[arg-type]
            slots.append(_Slot(top.name, f.name, f.metadata.get(_NAME, f.name), f.metadata[_AT]))
    slots.sort(key=lambda s: s.at)
    if [s.at for s in slots] != list(range(len(slots))) or len({s.stored for s in slots}) != len(slots):
        raise TypeError("TrialResult's stored fields need distinct names and places 0..n-1")
    return tuple(slots)


_LAYOUT = _layout()
_BY_STORED = {slot.stored: slot for slot in _LAYOUT}
