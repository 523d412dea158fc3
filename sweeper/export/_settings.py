"""What an export writes, gathered once from the trial's stored config (:class:`ExportSettings`), whatever the
format: the 4-bit, LoRA, training and collation settings, the notes on how the short trial differs from a production
run, and where the numbers come from (the header every format carries)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from importlib import metadata
from typing import Any

from sweeper.errors import StudyError
from sweeper.notation import round_figure, rounded
from sweeper.space import TrialConfig
from sweeper.stability import StabilityFigures
from sweeper.study import Confirmation, StoredTrial, StudySnapshot

#: Built-in models as the hub ids a production run would load.
HUB_IDS = {"builtin:smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass(frozen=True, kw_only=True)
class QuantizationSettings:
    """``BitsAndBytesConfig`` keyword arguments of the export, as the trial loaded its model.

    Attributes:
        load_in_4bit: Always True: the trials quantize to 4 bits.
        bnb_4bit_quant_type: ``nf4`` or ``fp4``.
        bnb_4bit_use_double_quant: Whether the quantization constants are quantized too.
        bnb_4bit_compute_dtype: The dtype name of the 4-bit layers' compute: ``bfloat16``, ``float16`` or
            ``float32``.
    """

    load_in_4bit: bool = True
    bnb_4bit_quant_type: str
    bnb_4bit_use_double_quant: bool
    bnb_4bit_compute_dtype: str

    def to_dict(self) -> dict[str, Any]:
        """The keyword arguments, in this order: the JSON export's ``bnb_config``."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    """``LoraConfig`` keyword arguments of the export.

    Attributes:
        r: LoRA rank.
        lora_alpha: ``lora_alpha_ratio * r`` as the trial ran it (an int when whole).
        lora_dropout: Dropout probability in [0, 1).
        target_modules: Module names LoRA adapts.
        bias: Always ``none``.
        task_type: Always ``CAUSAL_LM``.
    """

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: tuple[str, ...]
    bias: str = "none"
    task_type: str = "CAUSAL_LM"

    def to_dict(self) -> dict[str, Any]:
        """The keyword arguments, in this order (``target_modules`` as a list): the JSON export's ``lora_config``."""
        return {**asdict(self), "target_modules": list(self.target_modules)}


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """``TrainingArguments`` keyword arguments of the export (the trial's, but the accumulation).

    Attributes:
        per_device_train_batch_size: Rows a micro-batch.
        gradient_accumulation_steps: Set to keep ``target_effective_batch_size`` (not the short trial's).
        learning_rate: Peak learning rate.
        optim: ``TrainingArguments.optim`` name.
        gradient_checkpointing: Whether activations are recomputed in the backward pass.
        max_grad_norm: Gradient clipping norm.
        warmup_steps: Linear warmup steps.
        weight_decay: AdamW weight decay.
        bf16: Mixed precision in bfloat16 (the trial computed in bfloat16).
        fp16: Mixed precision in float16 (the trial computed in float16).
        seed: Random seed.
    """

    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    optim: str
    gradient_checkpointing: bool
    max_grad_norm: float
    warmup_steps: int
    weight_decay: float
    bf16: bool
    fp16: bool
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """The keyword arguments, in this order: the JSON export's ``training_args``."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CollationSettings:
    """How the trial built its micro-batches, which the exported run must repeat for the trial's peak memory and
    stability figures to hold.

    Attributes:
        packing: True: consecutive samples packed into rows of at most ``max_seq_length`` tokens, position ids
            restarting at each sample, no attention across samples (TRL's ``packing``, axolotl's ``sample_packing``,
            LLaMA-Factory's ``neat_packing``); False: one sample a row, each micro-batch padded to its longest row
            (transformers' ``DataCollatorForSeq2Seq``, TRL's collator without packing).
        attn_implementation: The attention the trial ran (``sdpa``, ``eager`` or ``flash_attention_2``): with
            packing, what keeps the samples of a row apart.
    """

    packing: bool
    attn_implementation: str

    def to_dict(self) -> dict[str, Any]:
        """These fields, in this order: the JSON export's ``collation``."""
        return asdict(self)

    def sentence(self, max_seq_length: int) -> str:
        """The header's line: the collation the trial measured, which the exported run must use."""
        if self.packing:
            how = (
                f"samples packed into rows of at most {max_seq_length} tokens, position ids restarting at each "
                "sample, no attention across samples"
            )
        else:
            how = "one sample a row, each micro-batch padded to its longest row (no packing)"
        return f"Collation: {how}, as the trial ran; train with it, or its memory and stability figures do not hold."


@dataclass(frozen=True, kw_only=True)
class Provenance:
    """Where an export's numbers come from: the header every format carries and the JSON export's ``provenance``.

    Attributes:
        study: Study name.
        trial: Trial number.
        peak_memory_gib: Measured peak memory in GiB (3 decimals), of the kind ``memory_kind``.
        memory_kind: ``cuda_max_reserved`` or ``cpu_peak_rss``.
        memory_limit_gib: The space's memory cap in GiB.
        instability: The trial's instability (4 decimals).
        stability: The stability margin, ``predicted_max_lr`` and headroom with their intervals, rounded as the
            header writes them (:func:`sweeper.notation.rounded`); flat in :meth:`to_dict`.
        measured_effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps`` of the short
            trial (and of its confirmation): the effective batch the stability figures were measured at, which the
            export's ``gradient_accumulation_steps`` may change.
        learning_progress: How far the probe loss fell (3 decimals).
        confirmation: The trial's long run, None when not confirmed.
        device: ``cpu`` or ``cuda:<i> (<name>)``.
        versions: ``(package, version)`` of the trial's libraries and the exporting sweeper, in order; a version is
            None when unknown.
        cuda_alloc_conf: The ``PYTORCH_CUDA_ALLOC_CONF`` the trial ran under (:attr:`sweeper.trial.Provenance.
            cuda_alloc_conf`: ``""`` unset, ``not applicable (cpu)``), None when not recorded (an older trial).
        cached_share: On CUDA, the share of the reserved peak the tensors did not hold (:meth:`sweeper.trial.
            MemoryReading.cached_share`, 2 decimals), None on the CPU and for older trials.
        exported: Local time of the export, ``%Y-%m-%d %H:%M:%S``.
    """

    study: str
    trial: int
    peak_memory_gib: float | None
    memory_kind: str | None
    memory_limit_gib: float
    instability: float | None
    stability: StabilityFigures
    measured_effective_batch_size: int
    learning_progress: float | None
    confirmation: Confirmation | None
    device: str | None
    versions: tuple[tuple[str, str | None], ...]
    exported: str
    cuda_alloc_conf: str | None = None
    cached_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON export's ``provenance``: these fields in order, ``stability`` flattened in its place,
        ``confirmation`` as stored, ``versions`` as ``{package: version}``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out.update(value.to_dict() if f.name == "stability" else {f.name: value})
        out["confirmation"] = self.confirmation.to_dict() if self.confirmation else None
        out["versions"] = dict(self.versions)
        return out


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """What the study measured around the exported configuration: the bounds a production config must stay inside
    for the trial's figures to hold (the ``policy`` export's guard, issues 58 and 67).

    The fits and the out-of-memory shapes are of the study's trials whose memory compares with this one's by the
    dominance rule (:func:`sweeper.memory.at_least_as_large`, each trial's length aside): a trial at least as large
    as the exported one that fit at a length says it fits there too; one no larger that ran out says the exported
    one runs out. A trial of another dtype, optimizer, packing or smaller r says nothing of this configuration.

    Attributes:
        largest_fit_max_seq_length: The largest ``max_seq_length`` such a trial ran within its cap (``complete`` or
            ``nan``: it ran a step), at least the trial's own.
        largest_fit_row_tokens: The longest rows those trials' worst-case steps measured (tokens a row,
            ``worst_case_shape``): the data's longest rows, so at most the configured length; None when no trial
            recorded its shape. A production run padding every row to a longer length was not measured.
        fit_peak_memory_gib: The peak of the trial that ran those rows (GiB), None when not measured.
        oom_above: The smallest measured out-of-memory shape above that length at this batch, or at a larger batch,
            as ``(per_device_train_batch_size, max_seq_length, peak_memory_gib or None)``; None when none ran out.
        safe_learning_rate: The trial's ``safe_learning_rate``: the largest constant rate whose chance of diverging
            within the study's horizon has its upper end at 5% (:class:`sweeper.stability._chance.DivergenceChance`);
            None when the trial has no measured margin.
    """

    largest_fit_max_seq_length: int
    largest_fit_row_tokens: int | None
    fit_peak_memory_gib: float | None
    oom_above: tuple[int, int, float | None] | None
    safe_learning_rate: float | None

    def to_dict(self) -> dict[str, Any]:
        """These fields, in this order."""
        return asdict(self)


def _row_tokens(t: StoredTrial) -> int | None:
    """The tokens a row of ``t``'s measured worst-case step (None when it recorded no shape)."""
    shape = t.result.memory.worst_case_shape
    return int(shape[1]) if shape is not None else None


def _envelope(study: StudySnapshot, trial: StoredTrial, c: TrialConfig) -> Envelope:
    """The :class:`Envelope` of ``trial`` in ``study``: the longest rows that fit among the trials at least as large
    as it but for their length, and the smallest that ran out among those no larger."""
    from sweeper.memory import at_least_as_large

    def shaped(config: TrialConfig) -> TrialConfig:
        return replace(config.measured(), max_seq_length=c.max_seq_length)

    own = shaped(c)
    fits = [
        (t.config.max_seq_length, _row_tokens(t), t.result.memory.peak_memory_gib)
        for t in study.measured
        if t.config is not None and t.status.fits and at_least_as_large(shaped(t.config), own)
    ]
    longest = max([c.max_seq_length, *(f[0] for f in fits)])
    rows = [f for f in fits if f[1] is not None]
    widest = max(rows, key=lambda f: (f[1], f[0])) if rows else None
    own_peak = trial.result.memory.peak_memory_gib
    ooms = sorted(
        (t.config.per_device_train_batch_size, t.config.max_seq_length, t.result.memory.peak_memory_gib)
        for t in study.measured
        if t.config is not None
        and t.status.fits is False
        and at_least_as_large(own, shaped(t.config))
        and t.config.max_seq_length > longest
    ) + sorted(
        (t.config.per_device_train_batch_size, t.config.max_seq_length, t.result.memory.peak_memory_gib)
        for t in study.measured
        if t.config is not None
        and t.status.fits is False
        and t.config.per_device_train_batch_size > c.per_device_train_batch_size
        and t.config.max_seq_length >= c.max_seq_length
        and at_least_as_large(shaped(t.config), own)
    )
    safe = trial.result.stress.safe_learning_rate if trial.result.stress is not None else None
    return Envelope(
        largest_fit_max_seq_length=longest,
        largest_fit_row_tokens=widest[1] if widest else _row_tokens(trial),
        fit_peak_memory_gib=round_figure(widest[2] if widest else own_peak, 3),
        oom_above=(ooms[0][0], ooms[0][1], round_figure(ooms[0][2], 3)) if ooms else None,
        safe_learning_rate=safe,
    )


@dataclass(frozen=True, kw_only=True)
class ExportSettings:
    """What an export writes, gathered from the trial's stored config.

    Attributes:
        model: Model to fine-tune (a built-in name becomes its hub id).
        quantization: ``BitsAndBytesConfig`` keyword arguments (``bnb_4bit_compute_dtype`` as a dtype name).
        lora: ``LoraConfig`` keyword arguments.
        training: ``TrainingArguments`` keyword arguments, ``gradient_accumulation_steps`` set to keep
            ``target_effective_batch_size``.
        max_seq_length: Tokens per row.
        collation: How the trial built its micro-batches (padded or packed rows).
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps`` of the export.
        target_effective_batch_size: What the space asked for.
        provenance: Study, trial, measured peak memory and its kind, instability, library versions.
        envelope: What the study measured around the configuration (:class:`Envelope`: the ``policy`` export's
            bounds); None for settings made without a study.
        notes: Comments every format carries (how the trial differs from a production run).
        environment: The environment variables the exported run starts with, as the trial ran
            (:func:`run_environment`: the CUDA allocator's options); empty for none.
        model_aliases: Other names of the measured model: the study's own spelling where ``model`` is its hub id
            (``builtin:...``), and the local conversion the trials loaded.
    """

    model: str
    quantization: QuantizationSettings
    lora: LoraSettings
    training: TrainingSettings
    max_seq_length: int
    collation: CollationSettings
    effective_batch_size: int
    target_effective_batch_size: int
    provenance: Provenance
    notes: list[str]
    envelope: Envelope | None = None
    environment: dict[str, str] = field(default_factory=dict)
    model_aliases: tuple[str, ...] = ()


def run_environment(cuda_alloc_conf: str | None, expandable_segments: bool) -> dict[str, str]:
    """The environment variables an exported run sets to run as its trial did: ``PYTORCH_CUDA_ALLOC_CONF`` as the
    trial recorded it on CUDA (``cuda_alloc_conf``, :attr:`sweeper.trial.Provenance.cuda_alloc_conf`; ``""``, the
    allocator's defaults, sets nothing); for a trial on the CPU or of an older version, which recorded no CUDA
    options, the trial's own ``expandable_segments`` (:attr:`sweeper.space.TrialConfig.expandable_segments`)."""
    from sweeper.devices import CUDA_ALLOC_CONF_VAR
    from sweeper.devices import cuda_alloc_conf as trial_conf
    from sweeper.trial import CUDA_ALLOC_CONF_NOT_APPLICABLE

    conf = cuda_alloc_conf
    if conf is None or conf == CUDA_ALLOC_CONF_NOT_APPLICABLE:
        conf = trial_conf(None, expandable_segments)
    return {CUDA_ALLOC_CONF_VAR: conf} if conf else {}


def settings_of(study: StudySnapshot, trial: StoredTrial) -> ExportSettings:
    """The export settings of a complete trial (see :class:`ExportSettings`) of ``study`` (a snapshot, or a study
    read once here).

    Raises:
        StudyError: The trial lacks the config sweeper stores (a study not made by ``sweep run``, or edited).
    """
    try:
        return _settings_of(study, trial)
    except (KeyError, TypeError, ValueError) as exc:
        raise StudyError(
            f"{study.name}: --trial: trial {trial.number} has no usable sweeper config "
            f"(missing or bad {exc}); export a trial that 'sweep run' measured"
        ) from None


def _settings_of(study: StudySnapshot, trial: StoredTrial) -> ExportSettings:
    """:func:`settings_of` without the translation of a missing or bad stored value into one line."""
    c = trial.config
    if c is None or trial.values is None:
        raise KeyError("config")
    accumulation = c.as_exported().gradient_accumulation_steps
    notes = (
        _batch_notes(c, accumulation)
        + [_confirmation_note(study, trial, c)]
        + _model_notes(study, c)
        + _data_notes(study, c)
    )
    provenance = _provenance(study, trial, c)
    training = _training(c, accumulation)
    name = c.model.name_or_path
    alpha = trial.lora_alpha  # a trial with a config has one
    if alpha is None:
        raise KeyError("lora_alpha")
    return ExportSettings(
        model=HUB_IDS.get(name, name),
        quantization=QuantizationSettings(
            bnb_4bit_quant_type=c.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=c.bnb_4bit_use_double_quant,
            bnb_4bit_compute_dtype=c.bnb_4bit_compute_dtype,
        ),
        lora=LoraSettings(r=c.r, lora_alpha=alpha, lora_dropout=c.lora_dropout, target_modules=tuple(c.target_modules)),
        training=training,
        max_seq_length=c.max_seq_length,
        collation=CollationSettings(packing=c.packing, attn_implementation=c.model.attn_implementation),
        effective_batch_size=c.as_exported().effective_batch_size,
        target_effective_batch_size=c.target_effective_batch_size,
        provenance=provenance,
        notes=notes,
        envelope=_envelope(study, trial, c),
        environment=run_environment(provenance.cuda_alloc_conf, c.expandable_segments),
        model_aliases=tuple(n for n in dict.fromkeys((name, study.model_path)) if n and n != HUB_IDS.get(name, name)),
    )


#: The note of an export without a dataset entry (``hf``, ``trl``, ``json``); the axolotl and LLaMA-Factory exports
#: write the trial's rows and replace it with :data:`RUN_LENGTH_NOTE`.
DATASET_NOTE = (
    "add your dataset, its chat template and the length of the run (steps or epochs): a trial does not choose them"
)
RUN_LENGTH_NOTE = "add the length of the run (steps or epochs): a trial does not choose it"


def _batch_notes(c: TrialConfig, accumulation: int) -> list[str]:
    """How the export's batch and schedule differ from the short trial's, and what a trial does not choose."""
    batch, target = c.per_device_train_batch_size, c.target_effective_batch_size
    notes = [
        f"gradient_accumulation_steps={accumulation} keeps target_effective_batch_size={target} at "
        f"per_device_train_batch_size={batch} (the short trial ran gradient_accumulation_steps="
        f"{c.gradient_accumulation_steps})",
        f"the trial ran {c.max_steps} steps at a constant learning rate after {c.warmup_steps} "
        "warmup steps, to probe the peak rate; choose the schedule of the real run yourself",
        "the trial supervised the assistant replies only (prompt tokens had label -100)",
        DATASET_NOTE,
    ]
    if batch * accumulation != target:
        notes.append(f"{target} is not a multiple of {batch}: the effective batch is {batch * accumulation}")
    return notes


def _confirmation_note(study: StudySnapshot, trial: StoredTrial, c: TrialConfig) -> str:
    """Whether a long run of the trial's configuration completed, or how to run one."""
    done = trial.confirmation
    if done is None:
        return (
            f"not confirmed at a long horizon: its instability comes from {c.max_steps} steps; run 'sweep confirm "
            f"{study.name} --trials {trial.number}' to run it "
            f"{study.confirm_steps or 10 * c.max_steps} steps first"
            + (
                " (with --as-exported, at this export's effective batch)"
                if c.as_exported().effective_batch_size != c.effective_batch_size
                else ""
            )
        )
    exported = c.as_exported().effective_batch_size
    ran = exported if done.as_exported else done.effective_batch_size or c.effective_batch_size
    batch = (
        "as exported"
        if ran == exported
        else f"at effective batch {ran}, not as exported ({exported}; 'sweep confirm --as-exported' runs it)"
    )
    return (
        f"confirmed: a {done.steps}-step run of this configuration completed {batch} (instability "
        f"{done.instability if done.instability is None else round(done.instability, 4)}, peak "
        f"{done.peak_memory_gib if done.peak_memory_gib is None else round(done.peak_memory_gib, 3)} GiB)"
    )


def _data_notes(study: StudySnapshot, c: TrialConfig) -> list[str]:
    """The dataset file's rows that keep no supervised token at the exported ``max_seq_length`` (the last ``sweep
    run`` read them, :attr:`StudySnapshot.untrained_rows`): the exported run trains every row, and a step of only such
    rows averages its loss over zero tokens, a NaN (issue 68)."""
    rows = study.untrained_rows.get(c.max_seq_length)
    if not rows:
        return []
    shown = ", ".join(map(str, rows[:8])) + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
    one = len(rows) == 1
    return [
        f"NaN RISK in the data: row{'' if one else 's'} {shown} of the dataset file keep{'s' if one else ''} "
        f"no supervised token at max_seq_length {c.max_seq_length} (the reply starts past the cut): a step of only "
        f"such rows averages its loss over zero tokens, a NaN; drop {'it' if len(rows) == 1 else 'them'} from the "
        f"file, or raise max_seq_length above {'its' if len(rows) == 1 else 'their'} reply's start (sweep doctor "
        f"DATA --max-seq-length {c.max_seq_length} names every row)"
    ]


def _model_notes(study: StudySnapshot, c: TrialConfig) -> list[str]:
    """Where the trials loaded a built-in or GGUF model from: its local conversion, which the export may point to."""
    name = c.model.name_or_path
    local = study.model_path
    if local and (name.startswith("builtin:") or name.lower().endswith(".gguf")):
        return [
            f"the trials loaded {name} from its local conversion {local}; point the model name there to "
            "train without the hub"
        ]
    return []


def _provenance(study: StudySnapshot, trial: StoredTrial, c: TrialConfig) -> Provenance:
    """Study, trial, what was measured where, and the library versions (:attr:`ExportSettings.provenance`)."""
    versions = trial.result.provenance.versions or {}
    peak = trial.result.memory.peak_memory_gib
    return Provenance(
        study=study.name,
        trial=trial.number,
        peak_memory_gib=round(peak, 3) if isinstance(peak, float) else peak,
        memory_kind=trial.result.memory.memory_kind,
        memory_limit_gib=c.memory_limit_gib,
        instability=round_figure(trial.result.constant.instability, 4),
        stability=rounded(StabilityFigures.of(trial.result.stress, trial.headroom)),
        measured_effective_batch_size=c.effective_batch_size,
        learning_progress=round_figure(trial.result.constant.learning_progress, 3),
        confirmation=trial.confirmation,
        device=trial.result.provenance.device,
        versions=tuple({**versions, "sweeper": _version("sweeper")}.items()),
        exported=time.strftime("%Y-%m-%d %H:%M:%S"),
        cuda_alloc_conf=trial.result.provenance.cuda_alloc_conf,
        cached_share=round_figure(trial.result.memory.cached_share(), 2),
    )


def _training(c: TrialConfig, accumulation: int) -> TrainingSettings:
    """The ``TrainingArguments`` keys of the export (:attr:`ExportSettings.training`): the trial's own
    (:meth:`TrialConfig.training_arguments`), but the accumulation."""
    return TrainingSettings(**{**c.training_arguments(), "gradient_accumulation_steps": accumulation})


def _version(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
