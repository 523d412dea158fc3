"""What one trial measured (:class:`TrialResult`), and the statuses it may end with: the record the trial process
writes as JSON and the sweep stores on the Optuna trial as user attributes (``docs/contract.md``).

Shared by both sides of the process boundary; imports neither torch nor optuna.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, ClassVar, Literal

from sweeper.trial._memory_phases import PhasePeakMemory, StepShape, step_shape_of
from sweeper.trial._status import TrialStatus
from sweeper.trial._stored_order import STORED_ORDER

#: The part of a trial a failure happened in (``fail_phase``): loading, or a step's forward, backward or optimizer
#: update. Not a memory phase (:class:`PhasePeakMemory`), a progress phase (:data:`sweeper.trial._job.ProgressPhase`)
#: or the constant and stress phases of training (:class:`ConstantPhase`, :class:`StressOutcome`).
FailPhase = Literal["load", "forward", "backward", "optimizer"]


#: Field metadata key: the field's stored name (the user attribute, ``docs/contract.md``) where it is not its own.
_NAME = "stored_name"
#: Field metadata keys: what turns the field's stored JSON value back into its type (a tuple stored as a list), and
#: its value into what is stored.
_READ = "read_stored"
_WRITE = "write_stored"

#: The one stored attribute that holds the experimental instruments' figures (:attr:`TrialResult.experimental`),
#: outside the stable stored order.
EXPERIMENTAL = "experimental"

#: ``cuda_alloc_conf`` of a CPU trial: the CUDA allocator's configuration moves nothing there.
CUDA_ALLOC_CONF_NOT_APPLICABLE = "not applicable (cpu)"


def _stored(
    *,
    name: str | None = None,
    default: Any = None,
    factory: Any = None,
    required: bool = False,
    read: Any = None,
    write: Any = None,
) -> Any:
    """A field stored flat as a user attribute, under its own name or ``name`` (its place: :data:`STORED_ORDER`).
    Its default is ``default``, or ``factory()``, or none when ``required``; ``read`` turns a stored value (not None)
    back into the field's type, ``write`` the field's value (not None) into what is stored (JSON)."""
    metadata: dict[str, Any] = {_NAME: name} if name is not None else {}
    if read is not None:
        metadata[_READ] = read
    if write is not None:
        metadata[_WRITE] = write
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
        phase_peak_memory_gib: Peak memory of each phase measured (:class:`PhasePeakMemory`: ``load``, ``train``,
            ``worst_case``, ``probe``, ``stress``), each read apart from the others (the allocator's cache emptied
            and the peak statistics reset between them); stored as a dict of the measured phases.
        worst_case_shape: ``(rows, tokens)`` of the worst-case step measured (None: it did not run; stored as a
            list).
        peak_allocated_gib: On CUDA, the largest ``max_memory_allocated`` of the phases ``peak_memory_gib`` is the
            maximum of: what the tensors held, where ``peak_memory_gib`` is what the caching allocator reserved (the
            difference is its cache and fragmentation, :meth:`cached_share`); None on the CPU and for trials of older
            versions.
    """

    peak_memory_gib: float | None = _stored()
    load_peak_memory_gib: float | None = _stored()
    memory_kind: str | None = _stored()
    predicted_peak_gib: float | None = _stored()
    stress_peak_memory_gib: float | None = _stored()
    phase_peak_memory_gib: PhasePeakMemory = _stored(factory=PhasePeakMemory, read=PhasePeakMemory.of, write=dict)
    worst_case_shape: StepShape | None = _stored(read=step_shape_of, write=list)
    peak_allocated_gib: float | None = _stored()

    #: The cached share of the reserved peak (:meth:`cached_share`) above which the views say so and name the
    #: allocator setting that returns it (issue 57: SkyRL#1768 saw a run OOM with about 20 GiB reserved but
    #: unallocated until ``expandable_segments:True`` was set).
    CACHED_SHARE_SAID: ClassVar[float] = 0.10

    def cached_share(self) -> float | None:
        """On CUDA, the share of the reserved peak that the tensors did not hold at their own peak: ``1 -
        peak_allocated_gib / peak_memory_gib``, 0 to 1; None where either is unknown (the CPU, older trials)."""
        if self.memory_kind != "cuda_max_reserved" or not self.peak_memory_gib or self.peak_allocated_gib is None:
            return None
        return max(0.0, 1.0 - self.peak_allocated_gib / self.peak_memory_gib)

    @classmethod
    def cache_worth_saying(cls, share: float | None, cuda_alloc_conf: str | None) -> bool:
        """Whether a view says the cached ``share`` (:meth:`cached_share`) and names ``expandable_segments:True``:
        the share is over :attr:`CACHED_SHARE_SAID` and the trial did not already run with that setting."""
        expandable = "expandable_segments:true" in (cuda_alloc_conf or "").lower()
        return share is not None and share > cls.CACHED_SHARE_SAID and not expandable


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
            (:func:`sweeper.trial._child.instruments.probe.update_to_weight_ratio`); 0 before the first step (B starts
            at 0). A candidate early sign of divergence: failed LoRA solutions are high-norm (Kim et al. 2025).
    """

    instability: float | None = _stored()
    instability_components: dict[str, float] = _stored(factory=dict)
    loss_trace: list[float | None] = _stored(factory=list)
    grad_norm_trace: list[float | None] = _stored(factory=list)
    max_activation_trace: list[float | None] = _stored(factory=list)
    skipped_steps: list[int] = _stored(factory=list)
    steps_done: int = _stored(default=0)
    train_time_s: float | None = _stored()
    tokens_per_s: float | None = _stored()
    worst_case_time_s: float | None = _stored()
    data_token_share: float | None = _stored()
    probe_steps: list[int] = _stored(factory=list)
    probe_loss_trace: list[float | None] = _stored(factory=list)
    probe_max_activation_trace: list[float | None] = _stored(factory=list)
    probe_time_s: float | None = _stored()
    probe_time_share: float | None = _stored()
    projected_fail_step: int | None = _stored()
    learning_progress: float | None = _stored()
    update_ratio_trace: list[float | None] = _stored(factory=list)


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
        predicted_max_lr: The edge: the constant learning rate at which a run of ``horizon_steps`` steps diverges
            about half the time (:class:`sweeper.stability._chance.DivergenceChance`), or, in a study ``sweep
            calibrate`` measured, ``lr_ceiling`` times the study's own factor; a lower bound when capped.
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
        predicted_max_lr_low, predicted_max_lr_high: ``predicted_max_lr``'s 95% interval; ``high`` is None when
            capped.
        predicted_max_lr_source: What made ``predicted_max_lr``: the chance model's source (``fitted on
            SmolLM2-135M's stored 200-step runs ...``), or, in a study ``sweep calibrate`` measured, ``calibrated on
            this study's model (n edges, spread x)``; a study stored before issue 66: ``uncalibrated: factor ...``.
        predicted_max_lr_calibrated: That factor was the study's own (``sweep calibrate``); False or None (a trial
            stored before it was recorded): the built-in factor.
        horizon_steps: The run length the chance is for: ``study.confirm_steps``, else 400 (a trial process
            stores it at 400; the views give it at the study's).
        p_diverge, p_diverge_low, p_diverge_high: The chance that a constant-rate run of ``horizon_steps`` steps at
            the trial's rate diverges, with its 95% interval (:class:`sweeper.stability._chance.DivergenceChance`);
            an upper bound when capped.
        stability_call: ``safe``, ``undecided`` or ``likely fails`` from that chance (pre-registered thresholds,
            docs/validity.md); a trial that itself failed is ``fails`` in every view.
        safe_learning_rate: The largest rate whose chance's upper end is 5% at ``horizon_steps``.
    """

    lr_ceiling: float | None = _stored()
    stability_margin: float | None = _stored()
    margin_capped: bool | None = _stored()
    predicted_max_lr: float | None = _stored()
    stop: str | None = _stored(name="stress_stop")
    steps: int | None = _stored(name="stress_steps")
    lr_trace: list[float] = _stored(name="stress_lr_trace", factory=list)
    loss_trace: list[float | None] = _stored(name="stress_loss_trace", factory=list)
    probe_loss_trace: list[float | None] = _stored(name="stress_probe_loss_trace", factory=list)
    time_s: float | None = _stored(name="stress_time_s")
    time_share: float | None = _stored(name="stress_time_share")
    stability_margin_low: float | None = _stored()
    stability_margin_high: float | None = _stored()
    predicted_max_lr_low: float | None = _stored()
    predicted_max_lr_high: float | None = _stored()
    predicted_max_lr_source: str | None = _stored()
    predicted_max_lr_calibrated: bool | None = _stored()
    horizon_steps: int | None = _stored()
    p_diverge: float | None = _stored()
    p_diverge_low: float | None = _stored()
    p_diverge_high: float | None = _stored()
    stability_call: str | None = _stored()
    safe_learning_rate: float | None = _stored()


@dataclass(kw_only=True)
class NanFindings:
    """What the replay after a NaN found (:mod:`sweeper.trial._child.diagnosis`); empty for any other status.

    Attributes:
        cause: ``data``, ``precision`` or ``optimization`` (``nan_cause``), or None when the replay could not decide.
        samples: Dataset indices to blame (``nan_samples``): the faulty rows for ``data``, else the failing step's.
        module: After a ``precision`` NaN: the first module whose output overflowed (``nan_module``).
    """

    cause: Literal["data", "precision", "optimization"] | None = _stored(name="nan_cause")
    samples: list[int] = _stored(name="nan_samples", factory=list)
    module: str | None = _stored(name="nan_module")


@dataclass(kw_only=True)
class DataReading:
    """What the samples a trial trained on were like (:class:`sweeper.trial._child.measurements.Measurements`).

    Attributes:
        supervised_tokens_trace: Tokens the loss was computed on, per optimizer step (the failing step included).
        min_supervised_tokens: Its minimum; 0 means a step had nothing to learn from and its loss was 0/0.
        longest_sample_tokens: Tokens (before truncation) of the longest sample the trial trained on.
        longest_sample_index: Its dataset index.
        truncated_sample_fraction: Share of the samples trained on that ``max_seq_length`` cut, 0-1.
        worst_case_rows: The dataset indices of the rows the worst-case step trained (the data's longest), empty
            when it did not run.
        worst_case_supervised_tokens: The tokens its loss was computed on; 0 is a step of rows whose replies lie
            past ``max_seq_length``, a NaN in a run that trains them in a step alone (issue 68); None when it did
            not run.
    """

    supervised_tokens_trace: list[int] = _stored(factory=list)
    min_supervised_tokens: int | None = _stored()
    longest_sample_tokens: int | None = _stored()
    longest_sample_index: int | None = _stored()
    truncated_sample_fraction: float | None = _stored()
    worst_case_rows: list[int] = _stored(factory=list)
    worst_case_supervised_tokens: int | None = _stored()


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
        cuda_alloc_conf: The ``PYTORCH_CUDA_ALLOC_CONF`` the trial process ran under on CUDA (``""``: unset, PyTorch's
            default), which moves ``max_memory_reserved`` (``expandable_segments:True`` took an 8B QLoRA run from
            16.39 to 10.83 GiB reserved, torchtune#1185); :data:`CUDA_ALLOC_CONF_NOT_APPLICABLE` on the CPU, where
            it moves nothing; None for a trial of an older version.
    """

    wall_time_s: float | None = _stored()
    import_time_s: float | None = _stored()
    load_time_s: float | None = _stored()
    setup_time_s: float | None = _stored()
    warm: bool | None = _stored()
    model_reused: bool | None = _stored()
    quantized_linear_count: int | None = _stored()
    lora_alpha: float | None = _stored()
    effective_batch_size: int | None = _stored()
    device: str | None = _stored()
    versions: dict[str, str | None] = _stored(factory=dict)
    cuda_alloc_conf: str | None = _stored()


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
        nan: After a NaN, the diagnosis (:class:`NanFindings`).
        data: The samples it trained on (:class:`DataReading`).
        provenance: Timings, process, derived settings, device and versions (:class:`Provenance`).
        experimental: What experimental instruments measured, by instrument name (``critical_lr``:
            :mod:`sweeper.stability.experimental`): outside the stable stored attributes and docs/contract.md,
            stored under the one attribute :data:`EXPERIMENTAL` only when an instrument wrote something; no
            promise of its keys until promoted.
    """

    status: TrialStatus = _stored(required=True)
    reason: str = _stored(default="")
    fail_step: int | None = _stored()
    fail_phase: FailPhase | None = _stored()
    memory: MemoryReading = field(default_factory=MemoryReading)
    constant: ConstantPhase = field(default_factory=ConstantPhase)
    stress: StressOutcome = field(default_factory=StressOutcome)
    nan: NanFindings = field(default_factory=NanFindings)
    data: DataReading = field(default_factory=DataReading)
    provenance: Provenance = field(default_factory=Provenance)
    experimental: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)  # a value read back from JSON or a user attribute

    def to_dict(self) -> dict[str, Any]:
        """The flat dict stored as user attributes and written as JSON: every field under its stored name, in the
        stored order (``docs/contract.md``), the status as its value, then :data:`EXPERIMENTAL` when an experimental
        instrument wrote something; lists and dicts are copies."""
        out: dict[str, Any] = {}
        for slot in _LAYOUT:
            owner = self if slot.part is None else getattr(self, slot.part)
            value = getattr(owner, slot.attr)
            out[slot.stored] = (
                slot.write(value) if slot.write is not None and value is not None else copy.deepcopy(value)
            )
        out["status"] = self.status.value
        if self.experimental:
            out[EXPERIMENTAL] = copy.deepcopy(self.experimental)
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
        result.update({k: v for k, v in data.items() if k != EXPERIMENTAL}, strict=False)
        experimental = data.get(EXPERIMENTAL)
        if isinstance(experimental, Mapping):
            result.experimental = {str(k): dict(v) for k, v in experimental.items() if isinstance(v, Mapping)}
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
            if slot.read is not None and value is not None:
                value = slot.read(value)
            setattr(self if slot.part is None else getattr(self, slot.part), slot.attr, value)
        self.status = TrialStatus(self.status)

    @staticmethod
    def stored_names() -> tuple[str, ...]:
        """The stored names of every field, in the stored order (the keys of :meth:`to_dict`)."""
        return tuple(slot.stored for slot in _LAYOUT)


@dataclass(frozen=True)
class _Slot:
    """Where one stored attribute lives: the part (None: the result itself), the field and its stored name."""

    part: str | None
    attr: str
    stored: str
    read: Any = None
    write: Any = None


def _layout() -> tuple[_Slot, ...]:
    """Every stored field of :class:`TrialResult` and its parts, in :data:`STORED_ORDER`.

    Raises:
        TypeError: A field's stored name is missing from :data:`STORED_ORDER`, a name there is no field's, or two
            fields share a name (a declaration error).
    """
    slots = []
    for top in fields(TrialResult):
        if top.name == EXPERIMENTAL:
            continue  # stored under one attribute of its own, outside the stable order (TrialResult.to_dict)
        part_type = top.default_factory
        if not is_dataclass(part_type):
            meta = top.metadata
            slots.append(_Slot(None, top.name, meta.get(_NAME, top.name), meta.get(_READ), meta.get(_WRITE)))
            continue
        for f in fields(part_type):
            meta = f.metadata
            slots.append(_Slot(top.name, f.name, meta.get(_NAME, f.name), meta.get(_READ), meta.get(_WRITE)))
    stored = [s.stored for s in slots]
    if sorted(stored) != sorted(STORED_ORDER) or len(set(stored)) != len(stored):
        unlisted, unstored = sorted(set(stored) - set(STORED_ORDER)), sorted(set(STORED_ORDER) - set(stored))
        raise TypeError(
            f"TrialResult's stored fields and STORED_ORDER differ: not in the list {unlisted}, no field's {unstored}, "
            f"stored twice {len(stored) - len(set(stored))}"
        )
    return tuple(sorted(slots, key=lambda s: STORED_ORDER.index(s.stored)))


_LAYOUT = _layout()
_BY_STORED = {slot.stored: slot for slot in _LAYOUT}
