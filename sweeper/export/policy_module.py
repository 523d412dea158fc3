"""The QLoRA configuration sweeper measured, frozen as a policy: the production run's memory-moving and
stability-moving settings, and the envelope the study measured around them (the ``policy`` export, issues 58 and 67).

``sweep export --format policy`` copies this file as it stands, with the study's values as the one literal
``VALUES`` (between its two marker lines), beside its guard (the same name with ``_test``) and the production config
reader the guard uses (with ``_read``). Imports only the standard library; ``bnb_config()`` and ``lora_config()``
import transformers, peft and torch when called. Here it holds an example policy (the demo study's safe pick) so that
it imports, is linted and type-checked like the rest of sweeper.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Envelope:
    """What the study measured around this configuration.

    Attributes:
        peak_memory_gib: The trial's measured peak (GiB) under ``memory_limit_gib`` on ``device``.
        memory_limit_gib: The cap the trials ran under (GiB).
        device: Where the trials ran (``cpu``, or the card's name).
        largest_fit_max_seq_length: The largest ``max_seq_length`` a trial ran within the cap among the trials at
            least as large in memory as this one but for their length (the dominance rule: the same dtype,
            optimizer, packing and model; batch, r and targets no smaller; checkpointing and double quant no more on).
        largest_fit_row_tokens: The longest rows those trials' worst-case steps measured (tokens a row; the data's
            longest rows, at most ``max_seq_length``): a production run whose rows are longer has not been measured.
        fit_peak_memory_gib: The peak of the trial that ran ``largest_fit_row_tokens`` (GiB).
        oom_above: The smallest shape measured out of memory above them, ``(per_device_train_batch_size,
            max_seq_length, peak_memory_gib)``, or None.
        predicted_max_lr: The edge: the rate where runs of ``horizon_steps`` fail about half the time.
        safe_learning_rate: The largest constant rate whose chance of diverging within ``horizon_steps`` has its
            upper end at 5%, or None when not measured.
        horizon_steps: The run length the chance is of (sweep export --horizon, else the study's confirm_steps).
        measured_effective_batch_size: The effective batch the trial ran.
        confirmed_effective_batch_size: The effective batch its long confirmation ran, or None.
    """

    peak_memory_gib: float | None
    memory_limit_gib: float
    device: str | None
    largest_fit_max_seq_length: int
    largest_fit_row_tokens: int | None
    fit_peak_memory_gib: float | None
    oom_above: tuple[int, int, float | None] | None
    predicted_max_lr: float | None
    safe_learning_rate: float | None
    horizon_steps: int
    measured_effective_batch_size: int
    confirmed_effective_batch_size: int | None


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The configuration: 4-bit loading, LoRA, the batch and the collation, as the trial ran them (the effective
    batch as exported), with its :class:`Envelope`, the environment its run starts with and where it came from.
    ``model_aliases``: other names of the measured model (the study's own spelling, its local conversion)."""

    model: str
    load_in_4bit: bool
    bnb_4bit_quant_type: str
    bnb_4bit_use_double_quant: bool
    bnb_4bit_compute_dtype: str
    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: tuple[str, ...]
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    optim: str
    gradient_checkpointing: bool
    max_grad_norm: float
    max_seq_length: int
    packing: bool
    attn_implementation: str
    study: str
    trial: int
    sweeper_version: str | None
    envelope: Envelope
    model_aliases: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, values: dict[str, Any]) -> Policy:
        """The policy of :data:`VALUES`'s form (``envelope`` a dict of :class:`Envelope`'s fields)."""
        envelope = dict(values["envelope"])
        oom = envelope.get("oom_above")
        envelope["oom_above"] = tuple(oom) if oom is not None else None
        return cls(
            **{
                **values,
                "target_modules": tuple(values["target_modules"]),
                "model_aliases": tuple(values.get("model_aliases", ())),
                "envelope": Envelope(**envelope),
            }
        )

    @property
    def mixed_precision(self) -> str | None:
        """The Trainer's autocast the trial ran: ``bf16``, ``fp16``, or None (float32)."""
        return {"bfloat16": "bf16", "float16": "fp16"}.get(self.bnb_4bit_compute_dtype)

    def effective_batch(self) -> int:
        """per_device_train_batch_size x gradient_accumulation_steps (one device)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def bnb_config(self) -> Any:
        """transformers.BitsAndBytesConfig of the trial's 4-bit loading."""
        import torch
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=self.load_in_4bit,
            bnb_4bit_quant_type=self.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=self.bnb_4bit_use_double_quant,
            bnb_4bit_compute_dtype=getattr(torch, self.bnb_4bit_compute_dtype),
        )

    def lora_config(self) -> Any:
        """peft.LoraConfig of the trial's adapter."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.lora_alpha,  # type: ignore[arg-type]  # peft types it int; a ratio * r may be fractional
            lora_dropout=self.lora_dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )

    def training_arguments(self) -> dict[str, Any]:
        """Keyword arguments of transformers.TrainingArguments (or TRL's SFTConfig) for the measured settings; add
        output_dir and the run's length."""
        return {
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "optim": self.optim,
            "gradient_checkpointing": self.gradient_checkpointing,
            "max_grad_norm": self.max_grad_norm,
            "bf16": self.bnb_4bit_compute_dtype == "bfloat16",
            "fp16": self.bnb_4bit_compute_dtype == "float16",
        }

    def as_flat(self) -> dict[str, Any]:
        """The policy's settings by their standard names, its envelope as a dict (what the guard reads)."""
        return asdict(self)


# The values sweeper measured: `sweep export --format policy` writes the study's between these two lines.
# sweeper: values begin
VALUES: dict[str, Any] = {
    "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "model_aliases": ("builtin:smollm2-135m-instruct",),
    "load_in_4bit": True,
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True,
    "bnb_4bit_compute_dtype": "float32",
    "r": 4,
    "lora_alpha": 64,
    "lora_dropout": 0.05,
    "target_modules": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 16,
    "learning_rate": 0.002,
    "optim": "paged_adamw_8bit",
    "gradient_checkpointing": True,
    "max_grad_norm": 1.0,
    "max_seq_length": 64,
    "packing": False,
    "attn_implementation": "sdpa",
    "study": "demo",
    "trial": 5,
    "sweeper_version": None,
    "environment": {},
    "envelope": {
        "peak_memory_gib": 0.882,
        "memory_limit_gib": 1.6,
        "device": "cpu",
        "largest_fit_max_seq_length": 64,
        "largest_fit_row_tokens": 64,
        "fit_peak_memory_gib": 0.882,
        "oom_above": None,
        "predicted_max_lr": None,
        "safe_learning_rate": None,
        "horizon_steps": 60,
        "measured_effective_batch_size": 1,
        "confirmed_effective_batch_size": 1,
    },
}
# sweeper: values end

#: The policy of :data:`VALUES`.
POLICY = Policy.of(VALUES)
