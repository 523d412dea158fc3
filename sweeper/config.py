"""The typed, frozen settings of a study and of one trial: what ``space.yaml`` is parsed into, and what the worker
receives as JSON.

Pure: no torch, no optuna. Field names are the field's own (peft, bitsandbytes, transformers spellings).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ComputeDtype = Literal["bfloat16", "float16", "float32"]
QuantType = Literal["nf4", "fp4"]

#: Optimizers a trial may use: names of ``transformers.TrainingArguments.optim`` that make sense for QLoRA.
#: ``tests/test_space.py`` checks each is still a valid ``transformers.training_args.OptimizerNames`` value.
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
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
DATA_FORMATS = ("auto", "text", "prompt_completion", "alpaca", "chat")


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
    """

    name: str = "sweep"
    n_trials: int = 12
    timeout_s: float | None = None
    sampler: Literal["tpe", "random", "nsgaii"] = "tpe"
    seed: int | None = 0
    storage: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The ``model`` section.

    Attributes:
        name_or_path: ``builtin:smollm2-135m-instruct``, a local checkpoint directory, a ``.gguf`` file, or a hub id.
        attn_implementation: ``sdpa`` (default), ``eager`` or ``flash_attention_2`` (the last needs CUDA).
        trust_remote_code: Run the checkpoint's own Python code; off unless asked for.
    """

    name_or_path: str = "builtin:smollm2-135m-instruct"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    trust_remote_code: bool = False


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """The ``dataset`` section.

    Attributes:
        path: ``builtin:pydoc-topics``, a local ``.jsonl``/``.json``/``.csv``/``.parquet`` file, or a hub id.
        format: ``auto`` (detected from the columns), ``text``, ``prompt_completion``, ``alpaca`` or ``chat``.
        max_samples: At most this many samples, taken after a seeded shuffle.
        seed: Shuffle seed; every trial of a study sees the same samples in the same order.
        split: Split of a hub dataset or of a local file loaded through ``datasets``.
    """

    path: str = "builtin:pydoc-topics"
    format: Literal["auto", "text", "prompt_completion", "alpaca", "chat"] = "auto"
    max_samples: int = 512
    seed: int = 0
    split: str = "train"


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
    """Everything one trial needs, after the sampler chose its searched values. Sent to the worker as JSON.

    Attributes:
        r: LoRA rank, ``>= 1``.
        lora_alpha_ratio: ``lora_alpha / r``; peft scales the adapter's output by ``lora_alpha / r``.
        bnb_4bit_compute_dtype: dtype of the 4-bit layers' matmuls; also selects Trainer mixed precision
            (bfloat16 -> ``bf16``, float16 -> ``fp16``, float32 -> none).
        bnb_4bit_use_double_quant: Quantize the quantization constants too (QLoRA: 0.37 bits/param saved).
        bnb_4bit_quant_type: ``nf4`` or ``fp4``.
        per_device_train_batch_size: Rows per micro-batch.
        gradient_accumulation_steps: Micro-batches per optimizer step.
        max_seq_length: Every row is padded or truncated to this many tokens, so each step is the worst case.
        learning_rate: Peak learning rate.
        max_steps: Optimizer steps of the short run.
        warmup_steps: Linear warmup steps.
        weight_decay: AdamW weight decay.
        optim: ``TrainingArguments.optim`` name.
        gradient_checkpointing: Recompute activations in backward (non-reentrant).
        max_grad_norm: Clip threshold; 0 disables clipping (the pre-clip norm is recorded either way).
        lora_dropout: Dropout on the adapter's input, in ``[0, 1)``.
        seed: Seed of the Trainer and of LoRA's initialisation.
        target_modules: Module names that get adapters.
        memory_limit_gib: The card to fit, in GiB: a real cap in the worker.
        trial_timeout_s: Seconds before the worker is killed (status ``timeout``).
        target_effective_batch_size: Kept by export through ``gradient_accumulation_steps``.
        preflight_margin: A trial whose predicted peak exceeds ``memory_limit_gib`` by more than this fraction is
            pruned as ``predicted_oom`` without running (``sweeper.preflight``).
        max_retries: How often a configuration whose trial crashed or timed out is run again (those may go
            differently another time; ``nan`` and ``oom`` are results and never retried).
        model: The model section.
        dataset: The dataset section.
    """

    r: int = 16
    lora_alpha_ratio: float = 2.0
    bnb_4bit_compute_dtype: ComputeDtype = "bfloat16"
    bnb_4bit_use_double_quant: bool = True
    bnb_4bit_quant_type: QuantType = "nf4"
    per_device_train_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    max_seq_length: int = 512
    learning_rate: float = 2.0e-4
    max_steps: int = 30
    warmup_steps: int = 0
    weight_decay: float = 0.0
    optim: str = "paged_adamw_8bit"
    gradient_checkpointing: bool = True
    max_grad_norm: float = 1.0
    lora_dropout: float = 0.05
    seed: int = 0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    memory_limit_gib: float = 24.0
    trial_timeout_s: float = 1200.0
    target_effective_batch_size: int = 16
    preflight_margin: float = 0.10
    max_retries: int = 1
    model: ModelSpec = field(default_factory=ModelSpec)
    dataset: DatasetSpec = field(default_factory=DatasetSpec)

    @property
    def lora_alpha(self) -> float:
        """``lora_alpha_ratio * r``, as an int when it is whole (peft types it as int)."""
        alpha = self.lora_alpha_ratio * self.r
        return int(alpha) if float(alpha).is_integer() else alpha

    @property
    def effective_batch_size(self) -> int:
        """Rows per optimizer step on one device: ``per_device_train_batch_size * gradient_accumulation_steps``."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples become lists, nested specs become dicts)."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data["model"] = ModelSpec(**data.get("model", {}))
        data["dataset"] = DatasetSpec(**data.get("dataset", {}))
        data["target_modules"] = tuple(data.get("target_modules", ()))
        return cls(**data)
