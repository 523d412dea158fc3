"""The typed, frozen settings of a study and of one trial: what ``space.yaml`` is parsed into, and what the trial
process receives as JSON. This is the one schema: each field carries its default, its check and its memory role
(:class:`KeySpec`); the space parser, the memory model, the dominance rule and the exports derive from it.

Pure: no torch, no optuna. Field names are the field's own (peft, bitsandbytes, transformers spellings).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

ComputeDtype = Literal["bfloat16", "float16", "float32"]
QuantType = Literal["nf4", "fp4"]
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")
QUANT_TYPES = ("nf4", "fp4")

#: Optimizers a trial may use: names of ``transformers.TrainingArguments.optim`` that make sense for QLoRA.
#: ``tests/space/test_space.py`` checks each is still a valid ``transformers.training_args.OptimizerNames`` value.
OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_8bit",
    "adamw_bnb_8bit",
    "paged_adamw_8bit",
    "paged_adamw_32bit",
    "adafactor",
    "sgd",
    "lion_8bit",
    "lion_32bit",
    "paged_lion_8bit",
    "paged_lion_32bit",
)

SAMPLERS = ("tpe", "random", "nsgaii")
#: The most steps any run takes (``max_steps``, ``confirm_steps``, ``--steps``): a guard against a typo's billions.
MAX_STEPS = 10**7
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
DATA_FORMATS = ("auto", "text", "prompt_completion", "alpaca", "chat", "sharegpt")

#: How a trial key changes the trial's peak memory, all else equal (:attr:`KeySpec.memory`).
MemoryRole = Literal["grows", "shrinks", "same", "none"]


@dataclass(frozen=True, kw_only=True)
class KeySpec:
    """How one key of ``space.yaml`` is checked: attached to its dataclass field (``field(metadata={"check": ...})``)
    so that the field is the one place a setting, its default and its bounds are written.

    Attributes:
        kind: ``int``, ``float``, ``bool``, ``choice``, ``str``, ``name`` (a file-name-safe name), ``str_list`` or
            ``duration`` (seconds, written ``90s``/``20m``/``8h``).
        default: The field's default.
        low: Lower bound, inclusive unless ``low_open``.
        high: Upper bound, inclusive unless ``high_open``.
        choices: The values a ``choice`` key takes.
        searchable: A per-trial key that may be searched (else only fixed in ``training``).
        optional: ``null`` is a valid value.
        yaml_key: The key's name in ``space.yaml`` when it differs from the field's (``trial_timeout`` for
            ``trial_timeout_s``, whose value is a duration).
        policy: A key of run policy (how the sweep runs, retries, prunes or exports a trial), not of what it
            measures: :meth:`TrialConfig.measured` leaves it out, so a study resumed with another value reuses
            what it measured.
        memory: How the key changes a trial's peak memory, all else equal; every key of :class:`TrialConfig`
            declares one (``tests/memory/test_memory_roles.py`` fails on one that does not; the ``model`` and
            ``dataset`` sections each declare ``same`` as a whole, their own keys none). ``grows``: a larger value
            never needs less (a number; a list of names by inclusion). ``shrinks``: a larger value never needs more
            (a switch that saves memory when on: on never needs more than off). ``same``: memory depends on it in no
            order (trials are compared only at the same value). ``none``: memory does not depend on it. The dominance
            rule (:func:`sweeper.memory._dominance.at_least_as_large`) reads its keys from these roles, and the memory
            model's predictions are checked against them (a ``none`` key moves the predicted peak by exactly 0, a
            ``grows`` or ``shrinks`` key moves it only its way, but for the two small bitsandbytes steps noted at ``r``
            and ``bnb_4bit_use_double_quant``). A new key memory depends on declares ``same`` until real trials measure
            its order (``tests/sweep/test_preflight.py`` measures each of the rule's directions,
            :data:`sweeper.memory._dominance.DIRECTIONS`).
        example: A valid value as the one-line error for a bad one shows it (``str_list`` keys; default: a list of
            module names).
    """

    kind: Literal["int", "float", "bool", "choice", "str", "name", "str_list", "duration"]
    default: Any = None
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()
    searchable: bool = True
    optional: bool = False
    yaml_key: str | None = None
    policy: bool = False
    memory: MemoryRole | None = None
    example: str | None = None


def _key(default: Any, kind: str, **check: Any) -> Any:
    """A dataclass field with ``default`` and its :class:`KeySpec`."""
    return field(default=default, metadata={"check": KeySpec(kind=kind, default=default, **check)})  # type: ignore[arg-type]


def key_specs(cls: type) -> dict[str, KeySpec]:
    """The checked keys of a settings dataclass, by their ``space.yaml`` name, in field order."""
    out = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("check")
        if spec is not None:
            out[spec.yaml_key or f.name] = spec
    return out


def memory_roles(cls: type) -> dict[str, MemoryRole | None]:
    """The memory role (:attr:`KeySpec.memory`) of each field of a settings dataclass, by field name, in field order:
    a key's from its :class:`KeySpec`, a nested section's (``model``, ``dataset``) from its field's ``memory``
    metadata; None where the field declares none."""
    out: dict[str, MemoryRole | None] = {}
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("check")
        out[f.name] = spec.memory if spec is not None else f.metadata.get("memory")
    return out


def field_name(cls: type, yaml_key: str) -> str:
    """The dataclass field a ``space.yaml`` key sets (``trial_timeout`` -> ``trial_timeout_s``)."""
    for f in dataclasses.fields(cls):
        spec = f.metadata.get("check")
        if spec is not None and (spec.yaml_key or f.name) == yaml_key:
            return f.name
    raise KeyError(yaml_key)


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """The ``study`` section.

    Attributes:
        name: Study name; also the default storage ``sqlite:///studies/<name>.db`` and artifact folder.
        n_trials: Trials the study should hold when done, counted over the whole study (resumes count what exists).
        timeout_s: Wall-clock budget of one ``sweep run`` in seconds, or None for no limit.
        sampler: ``tpe`` (default; learns from PRUNED trials), ``random``, or ``nsgaii``.
        seed: Sampler seed, so that a study is reproducible; None for a random seed.
        storage: Optuna storage URL; None means ``sqlite:///studies/<name>.db``.
        confirm_steps: Steps of a confirmation run (``sweep confirm``); None for 10x the trial's ``max_steps``.
        confirm_top: At the end of ``sweep run``, confirm this many of the front's trials, the safe pick first (0:
            none).
        baseline: Run the space's first choices first (each searched key's first value, its other keys as fixed):
            ``sweep init --from`` puts the user's own settings first, so that the study measures them beside what it
            searches. Queued once, when the study is created.
        objectives: A new study's objectives, in order (registered names: ``peak_memory_gib`` first, then a
            stability objective, ``edge_proximity``, then optionally ``learning_progress``); None for the default
            two, ``peak_memory_gib`` and ``edge_proximity``. A study keeps the objectives it was created with.
    """

    name: str = _key("sweep", "name")
    n_trials: int = _key(12, "int", low=1, high=10**6)
    timeout_s: float | None = _key(None, "duration", optional=True, yaml_key="timeout")
    sampler: Literal["tpe", "random", "nsgaii"] = _key("tpe", "choice", choices=SAMPLERS)
    seed: int | None = _key(0, "int", low=0, high=2**32 - 1, optional=True)
    storage: str | None = _key(None, "str", optional=True)
    confirm_steps: int | None = _key(None, "int", low=1, high=MAX_STEPS, optional=True)
    confirm_top: int = _key(0, "int", low=0, high=100)
    baseline: bool = _key(False, "bool")
    objectives: tuple[str, ...] | None = _key(
        None, "str_list", optional=True, example="[peak_memory_gib, edge_proximity, learning_progress]"
    )


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The ``model`` section.

    Attributes:
        name_or_path: ``builtin:smollm2-135m-instruct``, a local checkpoint directory, a ``.gguf`` file, or a hub id.
        attn_implementation: ``sdpa`` (default), ``eager`` or ``flash_attention_2`` (the last needs CUDA).
        trust_remote_code: Run the checkpoint's own Python code; off unless asked for.
    """

    name_or_path: str = _key("builtin:smollm2-135m-instruct", "str")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = _key(
        "sdpa", "choice", choices=ATTN_IMPLEMENTATIONS
    )
    trust_remote_code: bool = _key(False, "bool")


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """The ``dataset`` section.

    Attributes:
        path: ``builtin:pydoc-topics``, a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a hub id.
        format: ``auto`` (detected from the columns), ``text``, ``prompt_completion``, ``alpaca``, ``chat`` or
            ``sharegpt``.
        max_samples: At most this many samples, taken after a seeded shuffle.
        seed: Shuffle seed; every trial of a study sees the same samples in the same order.
        split: Split of a hub dataset or of a local file loaded through ``datasets``.
    """

    path: str = _key("builtin:pydoc-topics", "str")
    format: Literal["auto", "text", "prompt_completion", "alpaca", "chat", "sharegpt"] = _key(
        "auto", "choice", choices=DATA_FORMATS
    )
    max_samples: int = _key(512, "int", low=1, high=10**9)
    seed: int = _key(0, "int", low=0, high=2**32 - 1)
    split: str = _key("train", "str")


@dataclass(frozen=True, kw_only=True)
class Categorical:
    """A categorical search dimension (a YAML list). ``choices`` keep the file's order; the first is the default."""

    choices: tuple


@dataclass(frozen=True, kw_only=True)
class Range:
    """A numeric range ``{low, high, log, step}``; ``log`` and ``step`` exclude each other, as in optuna.

    Attributes:
        low: Inclusive lower bound; ``> 0`` when ``log``.
        high: Inclusive upper bound, ``>= low``.
        log: Sample on a log scale.
        step: Grid step, or None for continuous (float) / 1 (int).
        is_int: The key takes integers (``r``, batch size, ...).
    """

    low: float
    high: float
    log: bool = False
    step: float | None = None
    is_int: bool = False


Dimension = Categorical | Range


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """Everything one trial needs, after the sampler chose its searched values. Sent to the trial process as JSON.

    Attributes:
        r: LoRA rank, ``>= 1``.
        lora_alpha_ratio: ``lora_alpha / r``; peft scales the adapter's output by ``lora_alpha / r``.
        bnb_4bit_compute_dtype: dtype of the 4-bit layers' matmuls; also selects Trainer mixed precision
            (bfloat16 -> ``bf16``, float16 -> ``fp16``, float32 -> none).
        bnb_4bit_use_double_quant: Quantize the quantization constants too (QLoRA: 0.37 bits/param saved).
        bnb_4bit_quant_type: ``nf4`` or ``fp4``.
        per_device_train_batch_size: Rows per micro-batch.
        gradient_accumulation_steps: Micro-batches per optimizer step.
        max_seq_length: Every sample is truncated to this many tokens; each micro-batch is padded to its longest
            row (``packing`` false) or samples are packed into rows of at most this many tokens (``packing`` true).
        packing: Pack consecutive samples into rows of ``max_seq_length`` tokens, as TRL's ``packing``, axolotl's
            ``sample_packing`` and LLaMA-Factory's ``neat_packing`` do: position ids restart at each sample and no
            token attends across samples (a block-diagonal causal mask); false (the default) pads each micro-batch
            to its longest row, as transformers' ``DataCollatorForSeq2Seq`` and TRL's collator do.
        learning_rate: Peak learning rate.
        max_steps: Optimizer steps of the short run.
        warmup_steps: Linear warmup steps.
        weight_decay: AdamW weight decay.
        optim: ``TrainingArguments.optim`` name.
        gradient_checkpointing: Recompute activations in backward (non-reentrant).
        expandable_segments: Run the trial under ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (the CUDA
            caching allocator grows segments in place instead of caching fixed blocks: an 8B QLoRA run went from
            16.39 to 10.83 GiB reserved, torchtune#1185); false is PyTorch's default. The trial process sets it
            before CUDA allocates anything, keeping the environment's other allocator options; nothing on the CPU.
        max_grad_norm: Clip threshold; 0 disables clipping (the pre-clip norm is recorded either way).
        lora_dropout: Dropout on the adapter's input, in ``[0, 1)``.
        seed: Seed of the Trainer and of LoRA's initialisation.
        target_modules: Module names that get adapters.
        memory_limit_gib: The card to fit, in GiB: a real cap in the trial process.
        trial_timeout_s: Seconds before the trial process is killed (status ``timeout``).
        target_effective_batch_size: Kept by export through ``gradient_accumulation_steps``.
        preflight_margin: A trial whose predicted peak exceeds ``memory_limit_gib`` by more than this fraction is
            pruned as ``predicted_oom`` without running (``sweeper.memory.preflight``).
        max_retries: How often a configuration whose trial crashed or timed out is run again (those may go
            differently another time; ``nan`` and ``oom`` are results and never retried).
        model: The model section.
        dataset: The dataset section.
    """

    # Defaults are the QLoRA paper's recipe (Dettmers et al. 2023, "QLoRA", sec. 3 and appendix B): nf4, double
    # quant, bf16 compute, paged AdamW 8-bit; max_grad_norm is 0.3 there, we keep transformers' 1.0 default.
    # memory= is each key's memory role (KeySpec.memory): the dominance rule compares two trials along the grows and
    # shrinks keys, at equal same keys, whatever their none keys.
    # r grows but for one step of bitsandbytes' 8-bit optimizers: a LoRA tensor that reaches 4096 elements switches
    # from 32-bit to 8-bit state, so r=8 needs 1.5 MiB less than r=7 at SmolLM2-135M's shape (hidden 576); far below
    # the 0.1 GiB identical trials vary by (tests/memory/test_memory_roles.py bounds it).
    r: int = _key(16, "int", low=1, high=4096, memory="grows")
    lora_alpha_ratio: float = _key(2.0, "float", low=0, low_open=True, high=1e6, memory="none")
    # Not ordered: at a 64k vocabulary a bf16 trial holds more than an fp32 one of the same shape (under autocast the
    # logits exist in bf16 and as their fp32 copy; in fp32 the upcast is the same tensor), while at SmolLM2's 49k
    # vocabulary and hidden 576 fp32 is larger (measured on the CPU, tests/sweep/test_preflight.py). The same logits
    # arithmetic holds under CUDA autocast, so no device orders the dtypes.
    bnb_4bit_compute_dtype: ComputeDtype = _key("bfloat16", "choice", choices=COMPUTE_DTYPES, memory="same")
    # Shrinks but on matrices under ~22k weights (the tests' tiny model), where its 256-entry float32 code per matrix
    # outweighs the 3 bytes it saves per 64 weights: 11 KiB there.
    bnb_4bit_use_double_quant: bool = _key(True, "bool", memory="shrinks")
    # nf4 and fp4 store the same bytes: packed 4-bit values, the absmax constants and a 16-entry code.
    bnb_4bit_quant_type: QuantType = _key("nf4", "choice", choices=QUANT_TYPES, memory="none")
    per_device_train_batch_size: int = _key(1, "int", low=1, high=65536, memory="grows")
    gradient_accumulation_steps: int = _key(1, "int", low=1, high=65536, memory="same")
    max_seq_length: int = _key(512, "int", low=8, high=2**20, memory="grows")
    # A packed row is at least as long as the longest sample it holds, so packing never needs less memory; not yet
    # an ordered direction of the dominance rule (none is, before real trials measure it): trials must agree on it.
    packing: bool = _key(False, "bool", memory="same")
    learning_rate: float = _key(2.0e-4, "float", low=0, low_open=True, high=1e3, memory="none")
    max_steps: int = _key(30, "int", low=1, high=MAX_STEPS, memory="none")
    warmup_steps: int = _key(0, "int", low=0, high=MAX_STEPS, memory="none")
    weight_decay: float = _key(0.0, "float", low=0, high=1e3, memory="none")
    optim: str = _key("paged_adamw_8bit", "choice", choices=OPTIMIZERS, memory="same")
    gradient_checkpointing: bool = _key(True, "bool", memory="shrinks")
    # Moves only CUDA's reserved peak (the allocator's cache), by an amount no trial has yet measured on a card the
    # memory model knows: trials must agree on it before one is compared with another. Nothing on the CPU.
    expandable_segments: bool = _key(False, "bool", memory="same")
    max_grad_norm: float = _key(1.0, "float", low=0, high=1e9, memory="none")
    lora_dropout: float = _key(0.05, "float", low=0, high=1, high_open=True, memory="same")
    seed: int = _key(0, "int", low=0, high=2**32 - 1, memory="none")
    target_modules: tuple[str, ...] = _key(
        ("q_proj", "k_proj", "v_proj", "o_proj"), "str_list", searchable=False, memory="grows"
    )
    # The cap itself: a trial that ran out of memory under one cap may fit under a higher one.
    memory_limit_gib: float = _key(24.0, "float", low=0, low_open=True, high=65536, searchable=False, memory="same")
    # Run policy: how the sweep runs, prunes, retries and exports the trial, not what it measures.
    trial_timeout_s: float = _key(
        1200.0, "duration", searchable=False, yaml_key="trial_timeout", policy=True, memory="none"
    )
    target_effective_batch_size: int = _key(
        16, "int", low=1, high=MAX_STEPS, searchable=False, policy=True, memory="none"
    )
    preflight_margin: float = _key(0.10, "float", low=0, high=100, searchable=False, policy=True, memory="none")
    max_retries: int = _key(1, "int", low=0, high=10, searchable=False, policy=True, memory="none")
    # Another model or data: no trial of one is compared with a trial of the other.
    model: ModelSpec = field(default_factory=ModelSpec, metadata={"memory": "same"})
    dataset: DatasetSpec = field(default_factory=DatasetSpec, metadata={"memory": "same"})

    @property
    def lora_alpha(self) -> float:
        """``lora_alpha_ratio * r``, as an int when it is whole (peft types it as int)."""
        alpha = self.lora_alpha_ratio * self.r
        return int(alpha) if float(alpha).is_integer() else alpha

    @property
    def effective_batch_size(self) -> int:
        """Rows per optimizer step on one device: ``per_device_train_batch_size * gradient_accumulation_steps``."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def training_arguments(self) -> dict[str, Any]:
        """The ``transformers.TrainingArguments`` keywords this config sets, in one place for the trial (which adds
        its run's own: output folder, steps, schedule, logging) and the export (which replaces the accumulation to
        keep ``target_effective_batch_size``): batch, accumulation, learning rate, optimizer, checkpointing, clipping,
        warmup, weight decay, mixed precision (``bf16``/``fp16`` from ``bnb_4bit_compute_dtype``: the compute dtype
        runs under autocast; float32 sets neither) and seed, in that order (the JSON export's ``training_args``)."""
        return {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "optim": self.optim,
            "gradient_checkpointing": self.gradient_checkpointing,
            "max_grad_norm": self.max_grad_norm,
            "warmup_steps": self.warmup_steps,
            "weight_decay": self.weight_decay,
            "bf16": self.bnb_4bit_compute_dtype == "bfloat16",
            "fp16": self.bnb_4bit_compute_dtype == "float16",
            "seed": self.seed,
        }

    def worst_case_length(self, longest_sample_tokens: int | None, data_tokens: int | None = None) -> int:
        """The tokens per row of this configuration's worst step on data whose longest tokenized sample has
        ``longest_sample_tokens`` tokens (None: unknown): ``min(max_seq_length, longest_sample_tokens)`` when each
        micro-batch is padded to its longest row; when samples are packed into full rows, ``max_seq_length``, or
        ``min(max_seq_length, data_tokens)`` given the data's tokens in all (a packed row holds at most the data:
        24 samples of 1,300 tokens in all do not fill a row of 524,288, issue 55)."""
        if self.packing:
            return max(1, min(self.max_seq_length, data_tokens)) if data_tokens else self.max_seq_length
        if longest_sample_tokens is None:
            return self.max_seq_length
        return max(1, min(self.max_seq_length, longest_sample_tokens))

    def as_trained(self, longest_sample_tokens: int | None, data_tokens: int | None = None) -> TrialConfig:
        """This configuration with ``max_seq_length`` at :meth:`worst_case_length`: the rows it trains on and the
        shape of its worst step on that data are the same (what the memory model predicts, and what two settings
        are compared by: ``max_seq_length`` 2048 and 4096 train the same rows on data no longer than 1,320
        tokens)."""
        return dataclasses.replace(self, max_seq_length=self.worst_case_length(longest_sample_tokens, data_tokens))

    def as_exported(self) -> TrialConfig:
        """This configuration with the ``gradient_accumulation_steps`` ``sweep export`` writes for it:
        ``ceil(target_effective_batch_size / per_device_train_batch_size)``, at least 1, so that the effective batch
        is ``target_effective_batch_size`` (or the next multiple of the batch above it). What ``sweep confirm
        --as-exported`` runs."""
        accumulation = max(1, -(-self.target_effective_batch_size // self.per_device_train_batch_size))
        return dataclasses.replace(self, gradient_accumulation_steps=accumulation)

    def measured(self) -> TrialConfig:
        """The settings that change what a trial measures: this config with each key of run policy
        (:data:`RUN_POLICY_KEYS`: timeout, retries, the preflight's margin, the export's effective batch) at its
        default. Two trials whose ``measured()`` are equal measure the same thing."""
        return dataclasses.replace(self, **{name: _DEFAULT_POLICY[name] for name in RUN_POLICY_KEYS})

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists, nested specs become dicts)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        """Inverse of :meth:`to_dict`; a key a stored config lacks (a study written by an older version) takes its
        default.

        Raises:
            TypeError: ``data`` names a key that is not a field.
        """
        data = dict(data)
        data["model"] = ModelSpec(**data.get("model", {}))
        data["dataset"] = DatasetSpec(**data.get("dataset", {}))
        data["target_modules"] = tuple(data.get("target_modules", ()))
        return cls(**data)


#: The fields of :class:`TrialConfig` that are run policy (:attr:`KeySpec.policy`), not hyperparameters.
RUN_POLICY_KEYS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(TrialConfig) if getattr(f.metadata.get("check"), "policy", False)
)
_DEFAULT_POLICY: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(TrialConfig) if f.name in RUN_POLICY_KEYS
}


def same_rows_lengths(max_seq_lengths: Sequence[int], longest_sample_tokens: int) -> list[int]:
    """The ``max_seq_length`` values that train the same rows on data whose longest tokenized sample has
    ``longest_sample_tokens`` tokens, ascending: those at or above it, whose padded rows
    (:meth:`TrialConfig.worst_case_length`) are the samples untruncated; ``[]`` when fewer than two are (the rule
    ``sweep run`` settles repeats by, as the report and ``sweep doctor`` say it)."""
    same = sorted({n for n in max_seq_lengths if n >= longest_sample_tokens})
    return same if len(same) >= 2 else []
