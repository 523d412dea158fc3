"""The one reader of production training configs (issue 67): an axolotl YAML, a LLaMA-Factory YAML, a TRL
``--config`` YAML, a JSON of keyword arguments (``SFTConfig``/``TrainingArguments``/``BitsAndBytesConfig``/
``LoraConfig`` or a script's arguments, flat or nested as the ``json`` export writes them, string values included), a
peft ``adapter_config.json``, or the ``policy`` export's own fields, each read into the settings sweeper measures by
their standard names (:data:`SETTINGS`).

Each tool's keys are declared once here (:data:`TOOL_KEYS`): which setting a key sets and how its value translates,
the tool's default for a setting its file leaves out (at the versions the export tests pin: axolotl 0.21.0,
LLaMA-Factory 0.9.5, TRL 1.14.1 with transformers 5), and the keys that move memory or numerics which no trial
expresses, with the way they move the peak (:data:`NOT_MEASURED`). ``sweep init --from`` reads a file through it,
``sweep export --onto`` writes the measured values back under the file's own keys (:attr:`Reading.keys`), and the
``policy`` export's guard carries this file as it stands (its ``_read.py``), so that the guard reads a production
file exactly as ``sweep init --from`` does. Nothing a file says is dropped: every key is in :attr:`Reading.lines`,
carried, translated, a tool default, or not carried with its reason.

Standard library only (PyYAML imported to read a YAML file), so that the guard's copy runs without sweeper.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The settings a production config is read into, by sweeper's names (peft, bitsandbytes, transformers spellings):
#: what the trial measured, and what moves its memory or its stability.
SETTINGS = (
    "model",
    "load_in_4bit",
    "load_in_8bit",
    "bnb_4bit_quant_type",
    "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype",
    "mixed_precision",
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "optim",
    "gradient_checkpointing",
    "max_grad_norm",
    "warmup_steps",
    "weight_decay",
    "max_seq_length",
    "packing",
    "pad_to_max_length",
    "attn_implementation",
    "dataset",
    "seed",
)

#: What ``all-linear`` (peft's, axolotl's ``lora_target_linear``, LLaMA-Factory's ``all``) means for the decoders of
#: Llama, Mistral, Qwen and Gemma: their linear layers (peft leaves the output layer out).
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: The Trainer's mixed precision each 4-bit compute dtype runs under (float32: none), as the trials ran it.
PRECISION_OF_DTYPE = {"bfloat16": "bf16", "float16": "fp16"}

#: The formats :func:`read_production` reads, for the one line that names them.
FORMATS = (
    "an axolotl, LLaMA-Factory or TRL --config .yaml, a .json of keyword arguments (SFTConfig, TrainingArguments, "
    "BitsAndBytesConfig, LoraConfig: flat, or nested as sweep's json export writes them), or a peft "
    "adapter_config.json"
)


#: LLaMA-Factory's precision when a file sets neither ``bf16`` nor ``fp16``: chosen at run time from the GPU and the
#: checkpoint's dtype (``extras/misc.py: infer_optim_dtype``), bfloat16 or float16, so never the measured one for sure.
INFERRED_PRECISION = "chosen by the GPU and the checkpoint (bf16 or fp16)"


class ProductionConfigError(ValueError):
    """A production config that cannot be read: the one line names the file, the key and the fix."""


# -- values ---------------------------------------------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1", "y", "t", "1.0"}
_FALSE = {"false", "no", "off", "0", "none", "null", "", "n", "f", "0.0"}


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise TypeError(f"{value!r} is not true or false")


def _int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{value!r} is not a whole number")
    if isinstance(value, str):
        value = value.strip()
        number = float(value)
    else:
        number = float(value)
    if not number.is_integer():
        raise TypeError(f"{value!r} is not a whole number")
    return int(number)


def _float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{value!r} is not a number")
    return float(value.strip() if isinstance(value, str) else value)


def _alpha(value: Any) -> float | int:
    number = _float(value)
    return int(number) if number.is_integer() else number


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        raise TypeError(f"{value!r} is not a name")
    return str(value).strip()


def _dtype(value: Any) -> str:
    """A dtype name as ``torch.bfloat16``, ``bfloat16``, ``bf16`` or ``auto`` is written: its torch name."""
    name = _text(value).removeprefix("torch.").lower()
    names = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    return names.get(name, name)


def _checkpointing(value: Any) -> bool:
    """``gradient_checkpointing`` as a switch; axolotl's ``offload`` is on (with its activations offloaded)."""
    return True if value == "offload" else _bool(value)


def _modules(value: Any) -> tuple[str, ...] | str:
    """Target modules as a list, a comma-separated string, or peft's and the tools' ``all-linear``/``all``; a
    string with a regular expression's characters (peft and axolotl match it as one) as ``re:PATTERN``."""
    if isinstance(value, str) and re.search(r"[\\^$*+?()\[\]|]", value):
        return "re:" + value
    if isinstance(value, str):
        names = [n.strip() for n in value.split(",") if n.strip()]
        if len(names) == 1 and names[0].lower() in ("all", "all-linear", "all_linear"):
            return "all-linear"
        return tuple(names)
    if isinstance(value, list | tuple) and all(isinstance(n, str) for n in value):
        return tuple(value)
    raise TypeError(f"{value!r} is not a list of module names")


def _dataset(value: Any) -> str:
    """The first dataset's path or name: axolotl's ``datasets`` list of entries, or a name."""
    if isinstance(value, list) and value:
        value = value[0]
    if isinstance(value, dict):
        return _text(value.get("path") or value.get("name") or value.get("data_files") or "")
    return _text(value).split(",")[0]


# -- the tools' keys ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolKey:
    """How one key of a tool's config sets a setting of :data:`SETTINGS`.

    Attributes:
        key: The tool's key; a dotted path for a nested one (``bnb_config_kwargs.bnb_4bit_quant_type``).
        setting: The setting it sets.
        convert: The value's translation (``_bool``, ``_int``...; a function of the value).
        how: What a translation does, said as ``from -> to`` in ``sweep init --from``'s table ("" when the value
            carries over as it is).
    """

    key: str
    setting: str
    convert: Callable[[Any], Any]
    how: str = ""


@dataclass(frozen=True)
class Tool:
    """One production config format: its keys (:class:`ToolKey`, in the order a file usually has them), its
    defaults for the settings a file leaves out, and the rules that derive a setting from several keys.

    Attributes:
        name: ``axolotl``, ``llama-factory``, ``trl``, ``json`` or ``policy``.
        keys: The tool's keys by their name.
        defaults: Each setting's value when the file sets none of its keys: the tool's default at the pinned
            version, with where it was read.
        default_source: Where :attr:`defaults` were read (a version and file).
    """

    name: str
    keys: dict[str, ToolKey]
    defaults: dict[str, Any]
    default_source: str

    def key_of(self, setting: str) -> str | None:
        """The tool's first key for ``setting`` (None when it has none)."""
        return next((k.key for k in self.keys.values() if k.setting == setting), None)


def _keys(*entries: tuple) -> dict[str, ToolKey]:
    return {e[0]: ToolKey(*e) for e in entries}


_AXOLOTL = Tool(
    name="axolotl",
    keys=_keys(
        ("base_model", "model", _text),
        ("load_in_4bit", "load_in_4bit", _bool),
        ("load_in_8bit", "load_in_8bit", _bool),
        ("bnb_config_kwargs.bnb_4bit_quant_type", "bnb_4bit_quant_type", _text),
        ("bnb_config_kwargs.bnb_4bit_use_double_quant", "bnb_4bit_use_double_quant", _bool),
        ("bnb_config_kwargs.bnb_4bit_compute_dtype", "bnb_4bit_compute_dtype", _dtype),
        ("lora_r", "r", _int),
        ("lora_alpha", "lora_alpha", _alpha),
        ("lora_dropout", "lora_dropout", _float),
        ("lora_target_modules", "target_modules", _modules),
        ("lora_target_linear", "target_modules", lambda v: "all-linear" if _bool(v) else None, "true -> all-linear"),
        ("micro_batch_size", "per_device_train_batch_size", _int, "micro_batch_size -> per_device_train_batch_size"),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", _int),
        ("learning_rate", "learning_rate", _float),
        ("optimizer", "optim", _text, "optimizer -> optim"),
        ("gradient_checkpointing", "gradient_checkpointing", _checkpointing),
        ("max_grad_norm", "max_grad_norm", _float),
        ("warmup_steps", "warmup_steps", _int),
        ("weight_decay", "weight_decay", _float),
        ("sequence_len", "max_seq_length", _int, "sequence_len -> max_seq_length"),
        ("sample_packing", "packing", _bool, "sample_packing -> packing"),
        ("pad_to_sequence_len", "pad_to_max_length", _bool, "every row padded to sequence_len"),
        ("attn_implementation", "attn_implementation", _text),
        (
            "flash_attention",
            "attn_implementation",
            lambda v: "flash_attention_2" if _bool(v) else None,
            "true -> attn_implementation flash_attention_2",
        ),
        ("sdp_attention", "attn_implementation", lambda v: "sdpa" if _bool(v) else None, "true -> sdpa"),
        ("datasets", "dataset", _dataset, "the first entry's path"),
        ("seed", "seed", _int),
    ),
    defaults={
        "load_in_4bit": False,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 1,
        "optim": "adamw_torch_fused",
        "gradient_checkpointing": False,
        "max_grad_norm": 1.0,
        "weight_decay": 0.0,
        "lora_dropout": 0.0,
        "max_seq_length": 512,
        "packing": False,
        "pad_to_max_length": False,
        "mixed_precision": "bf16",
        "attn_implementation": "sdpa",
    },
    default_source="axolotl's defaults (utils/schemas/training.py, config.py, peft.py; loaders/model.py builds nf4 "
    "with double quant; bf16: auto is bf16 on a card with it), read at v0.18.0, unchanged to its main",
)

_LLAMA_FACTORY = Tool(
    name="llama-factory",
    keys=_keys(
        ("model_name_or_path", "model", _text),
        ("quantization_bit", "load_in_4bit", lambda v: _int(v) == 4, "4 -> load_in_4bit"),
        ("quantization_type", "bnb_4bit_quant_type", _text, "quantization_type -> bnb_4bit_quant_type"),
        ("double_quantization", "bnb_4bit_use_double_quant", _bool, "double_quantization -> bnb_4bit_use_double_quant"),
        ("lora_rank", "r", _int, "lora_rank -> r"),
        ("lora_alpha", "lora_alpha", _alpha),
        ("lora_dropout", "lora_dropout", _float),
        ("lora_target", "target_modules", _modules, "comma-separated -> a list (all -> all-linear)"),
        ("per_device_train_batch_size", "per_device_train_batch_size", _int),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", _int),
        ("learning_rate", "learning_rate", _float),
        ("optim", "optim", _text),
        (
            "disable_gradient_checkpointing",
            "gradient_checkpointing",
            lambda v: not _bool(v),
            "disable_gradient_checkpointing -> not gradient_checkpointing",
        ),
        ("max_grad_norm", "max_grad_norm", _float),
        ("warmup_steps", "warmup_steps", _int),
        ("weight_decay", "weight_decay", _float),
        ("cutoff_len", "max_seq_length", _int, "cutoff_len -> max_seq_length"),
        ("packing", "packing", _bool),
        (
            "flash_attn",
            "attn_implementation",
            lambda v: {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager"}.get(_text(v)),
            "fa2/sdpa/disabled -> attn_implementation",
        ),
        ("dataset", "dataset", _dataset),
        ("seed", "seed", _int),
    ),
    defaults={
        "load_in_4bit": False,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "r": 8,
        "lora_dropout": 0.0,
        "target_modules": "all-linear",
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "learning_rate": 5e-5,
        "optim": "adamw_torch_fused",
        "gradient_checkpointing": True,
        "max_grad_norm": 1.0,
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_seq_length": 2048,
        "packing": False,
        "pad_to_max_length": False,
        "mixed_precision": INFERRED_PRECISION,
        "attn_implementation": "sdpa",
        "seed": 42,
    },
    default_source="LLaMA-Factory 0.9.5's defaults (hparams/model_args.py, finetuning_args.py, data_args.py; "
    "transformers 5's TrainingArguments: adamw_torch_fused with torch >= 2.8)",
)

_TRL = Tool(
    name="trl",
    keys=_keys(
        ("model_name_or_path", "model", _text),
        ("load_in_4bit", "load_in_4bit", _bool),
        ("load_in_8bit", "load_in_8bit", _bool),
        ("bnb_4bit_quant_type", "bnb_4bit_quant_type", _text),
        (
            "use_bnb_nested_quant",
            "bnb_4bit_use_double_quant",
            _bool,
            "use_bnb_nested_quant -> bnb_4bit_use_double_quant",
        ),
        ("dtype", "bnb_4bit_compute_dtype", _dtype, "the model's dtype, which TRL passes as bnb_4bit_compute_dtype"),
        ("lora_r", "r", _int, "lora_r -> r"),
        ("lora_alpha", "lora_alpha", _alpha),
        ("lora_dropout", "lora_dropout", _float),
        ("lora_target_modules", "target_modules", _modules),
        ("per_device_train_batch_size", "per_device_train_batch_size", _int),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", _int),
        ("learning_rate", "learning_rate", _float),
        ("optim", "optim", _text),
        ("gradient_checkpointing", "gradient_checkpointing", _checkpointing),
        ("max_grad_norm", "max_grad_norm", _float),
        ("warmup_steps", "warmup_steps", _int),
        ("weight_decay", "weight_decay", _float),
        ("max_length", "max_seq_length", lambda v: None if v is None else _int(v), "max_length -> max_seq_length"),
        ("packing", "packing", _bool),
        ("attn_implementation", "attn_implementation", _text),
        ("activation_checkpointing", "gradient_checkpointing", _bool, "transformers 5's name, over the old one"),
        ("dataset_name", "dataset", _dataset),
        ("seed", "seed", _int),
    ),
    defaults={
        "load_in_4bit": False,
        "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": False,
        "bnb_4bit_compute_dtype": "float32",
        "r": 16,
        "lora_alpha": 32,
        "lora_dropout": 0.05,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "learning_rate": 2e-5,
        "optim": "adamw_torch_fused",
        "gradient_checkpointing": True,
        "max_grad_norm": 1.0,
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "max_seq_length": 1024,
        "packing": False,
        "pad_to_max_length": False,
        "mixed_precision": "bf16",
        "attn_implementation": "sdpa",
        "seed": 42,
    },
    default_source="TRL's defaults (trainer/model_config.py: dtype float32, which its get_quantization_config passes "
    "as bnb_4bit_compute_dtype; sft_config.py, base_config.py: bf16 and gradient_checkpointing on) read at v1.9.0, "
    "and transformers 5's TrainingArguments (adamw_torch_fused with torch >= 2.8)",
)

# The JSON of keyword arguments: the objects' own names (BitsAndBytesConfig, LoraConfig, TrainingArguments/SFTConfig,
# a script's arguments), read flat; the json export's nesting is flattened first.
_JSON = Tool(
    name="json",
    keys=_keys(
        ("model", "model", _text),
        ("model_name_or_path", "model", _text),
        ("base_model_name_or_path", "model", _text),
        ("load_in_4bit", "load_in_4bit", _bool),
        ("load_in_8bit", "load_in_8bit", _bool),
        ("use_4bit_quantization", "load_in_4bit", _bool, "use_4bit_quantization -> load_in_4bit"),
        ("bits", "load_in_4bit", lambda v: _int(v) == 4, "4 -> load_in_4bit"),
        ("bnb_4bit_quant_type", "bnb_4bit_quant_type", _text),
        ("bnb_4bit_use_double_quant", "bnb_4bit_use_double_quant", _bool),
        ("use_nested_quant", "bnb_4bit_use_double_quant", _bool, "use_nested_quant -> bnb_4bit_use_double_quant"),
        (
            "use_bnb_nested_quant",
            "bnb_4bit_use_double_quant",
            _bool,
            "use_bnb_nested_quant -> bnb_4bit_use_double_quant",
        ),
        ("double_quant", "bnb_4bit_use_double_quant", _bool, "double_quant -> bnb_4bit_use_double_quant"),
        ("bnb_4bit_compute_dtype", "bnb_4bit_compute_dtype", _dtype),
        ("r", "r", _int),
        ("lora_r", "r", _int, "lora_r -> r"),
        ("lora_alpha", "lora_alpha", _alpha),
        ("lora_dropout", "lora_dropout", _float),
        ("target_modules", "target_modules", _modules),
        ("lora_target_modules", "target_modules", _modules),
        ("per_device_train_batch_size", "per_device_train_batch_size", _int),
        ("gradient_accumulation_steps", "gradient_accumulation_steps", _int),
        ("learning_rate", "learning_rate", _float),
        ("optim", "optim", _text),
        ("gradient_checkpointing", "gradient_checkpointing", _checkpointing),
        ("activation_checkpointing", "gradient_checkpointing", _bool, "transformers 5's name, over the old one"),
        ("max_grad_norm", "max_grad_norm", _float),
        ("warmup_steps", "warmup_steps", _int),
        ("weight_decay", "weight_decay", _float),
        ("max_seq_length", "max_seq_length", lambda v: None if v is None else _int(v)),
        ("max_length", "max_seq_length", lambda v: None if v is None else _int(v), "max_length -> max_seq_length"),
        ("max_seq_len", "max_seq_length", _int, "max_seq_len -> max_seq_length"),
        ("model_max_length", "max_seq_length", _int, "model_max_length -> max_seq_length"),
        ("source_max_len", "max_seq_length", _int, "source_max_len -> max_seq_length (the prompt's part)"),
        ("packing", "packing", _bool),
        ("collation.packing", "packing", _bool),
        ("attn_implementation", "attn_implementation", _text),
        ("collation.attn_implementation", "attn_implementation", _text),
        ("dataset_name", "dataset", _dataset),
        ("dataset", "dataset", _dataset),
        ("seed", "seed", _int),
    ),
    defaults={
        "load_in_8bit": False,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "optim": "adamw_torch_fused",
        "gradient_checkpointing": False,
        "max_grad_norm": 1.0,
        "warmup_steps": 0,
        "weight_decay": 0.0,
        "lora_dropout": 0.0,
        "packing": False,
        "pad_to_max_length": False,
        "mixed_precision": None,
        "attn_implementation": "sdpa",
    },
    default_source="transformers 5 TrainingArguments, peft LoraConfig, bitsandbytes' BitsAndBytesConfig",
)

TOOL_KEYS: dict[str, Tool] = {t.name: t for t in (_AXOLOTL, _LLAMA_FACTORY, _TRL, _JSON)}

_KERNELS = "axolotl's fused LoRA kernels: memory and numerics other than peft's layers the trials ran"

#: Keys that move the peak memory or the numerics which no trial expresses, by tool: each a reason, and which way
#: the run's peak differs from the one measured.
NOT_MEASURED: dict[str, str] = {
    "lora_modules_to_save": "trains embed_tokens/lm_head in full (with their optimizer state): the run's peak is "
    "HIGHER than measured (about 3.5 GiB at Llama-3-8B's 128k vocabulary)",
    "modules_to_save": "trains whole modules in full: the run's peak is HIGHER than measured",
    "additional_target": "trains whole modules in full: the run's peak is HIGHER than measured",
    "load_in_8bit": "8-bit weights, not the 4-bit the trials measured: the run's peak is HIGHER",
    "plugins": "cut-cross-entropy and Liger fuse the loss and the logits: the run's peak is LOWER than measured, "
    "with other numerics",
    "cut_cross_entropy": "fuses the loss and the logits: the run's peak is LOWER than measured",
    "liger_kernel": "Liger kernels fuse the loss and norms: the run's peak is LOWER than measured",
    "use_liger_kernel": "Liger kernels fuse the loss and norms: the run's peak is LOWER than measured",
    "enable_liger_kernel": "Liger kernels fuse the loss and norms: the run's peak is LOWER than measured",
    "activation_offloading": "activations held on the CPU: the run's peak is LOWER than measured, its steps slower",
    "deepspeed": "ZeRO shards over several cards: the trials measured one card",
    "fsdp": "shards over several cards: the trials measured one card",
    "fsdp_config": "shards over several cards: the trials measured one card",
    "neat_packing": "packing without cross-attention (packing's memory: every row full)",
    "peft_use_dora": "DoRA's magnitude vectors and their backward: the run's peak is HIGHER than measured",
    "use_dora": "DoRA's magnitude vectors and their backward: the run's peak is HIGHER than measured",
    "lora_use_dora": "DoRA's magnitude vectors and their backward: the run's peak is HIGHER than measured",
    "use_rslora": "rank-stabilised scaling lora_alpha/sqrt(r): the adapter's step differs from the measured one",
    "use_unsloth": "unsloth's kernels: the run's peak is LOWER than measured, with other numerics",
    "unsloth": "unsloth's kernels: the run's peak is LOWER than measured, with other numerics",
    "layers_to_transform": "adapters on some layers only: the run's peak is LOWER than measured",
    "peft_use_rslora": "rank-stabilised scaling lora_alpha/sqrt(r): the adapter's step differs from the measured one",
    "loraplus_lr_ratio": "LoRA+ trains B at a higher rate than A: the adapter's step differs from the measured one",
    "lora_qkv_kernel": _KERNELS,
    "lora_mlp_kernel": _KERNELS,
    "lora_o_kernel": _KERNELS,
    "lora_embedding_kernel": _KERNELS,
    "padding_free": "rows concatenated without padding: the run's peak differs from the padded rows measured",
    "rank_pattern": "another rank for some modules: the adapter differs from the measured one",
    "alpha_pattern": "another lora_alpha for some modules: the adapter's step differs from the measured one",
    "pure_bf16": "the whole model in bf16 (no float32 master weights): other numerics than measured",
    "rl": "preference training (DPO, ORPO, ...): not the supervised fine-tuning the trials measured",
    "bnb_config_kwargs.llm_int8_skip_modules": "modules left unquantized: the run's peak is HIGHER than measured",
    "llm_int8_skip_modules": "modules left unquantized: the run's peak is HIGHER than measured",
    "unfrozen_parameters": "trains the matched parameters in full: the run's peak is HIGHER than measured",
}

#: Keys of a run's length and schedule: not carried into a short trial, each with what stands for it.
SCHEDULE: dict[str, str] = {
    "warmup_ratio": "a share of the long run's steps: the trials probe the peak rate at a constant rate after "
    "training.warmup_steps (set it to the warmup you want the trials to run)",
    "lr_scheduler": "the trials hold the peak rate constant to probe it; a schedule lowers it later in the run",
    "lr_scheduler_type": "the trials hold the peak rate constant to probe it; a schedule lowers it later in the run",
    "num_epochs": "the run's length in epochs: give it in steps for the chance of diverging (sweep export --horizon "
    "STEPS; else the study's confirm_steps)",
    "num_train_epochs": "the run's length in epochs: give it in steps for the chance of diverging (sweep export "
    "--horizon STEPS; else the study's confirm_steps)",
    "max_steps": "the run's length: sweep export --onto gives the chance of diverging for it (else --horizon STEPS, "
    "else the study's confirm_steps)",
}

#: Keys that change what the trials did not measure: noted (a warning in the guard), never a failure, each with why;
#: and the keys a tool ignores (:data:`IGNORED_BY_TOOL`) are noted the same way.
NOTED: dict[str, str] = {
    "per_device_eval_batch_size": "evaluation, which the trials do not run: an eval batch larger than the training "
    "batch may raise the run's peak during evaluation",
    "eval_batch_size": "evaluation, which the trials do not run: an eval batch larger than the training batch may "
    "raise the run's peak during evaluation",
    "torch_compile": "a compiled model: other kernels, memory and speed than the trials ran",
}

#: What a ``tf32`` key changes: only a float32 compute dtype's matmuls (TF32 on Ampere and newer cards).
TF32 = "TF32 matmuls change only float32 compute (the trials ran float32 matmuls in full float32)"

#: Keys a tool ignores though files carry them, each with what the tool does instead.
IGNORED_BY_TOOL: dict[str, dict[str, str]] = {
    "trl": {
        "torch_dtype": "TRL 1.x reads dtype, not torch_dtype (its parser drops unknown keys): the model loads and the "
        "4-bit layers compute in dtype's default, float32; write dtype instead",
        "max_seq_length": "TRL 1.x reads max_length, not max_seq_length (its parser drops unknown keys): rows are cut "
        "at max_length (default 1024); write max_length instead",
    },
}

#: Keys of a run's bookkeeping that change neither the memory nor the stability sweeper measures.
_BOOKKEEPING = re.compile(
    r"^(output_dir|logging_.*|report_to|run_name|wandb_.*|hub_.*|push_to_hub.*|save_.*|eval_.*|evals_.*|"
    r"do_train|do_eval|do_predict|overwrite_.*|plot_loss|"
    r"dataset_dir|dataset_prepared_path|val_set_size|template|chat_template|finetuning_type|adapter|"
    r"strict|special_tokens|tokenizer_.*|model_type|trust_remote_code|preprocessing_num_workers|"
    r"dataloader_.*|ddp_.*|resume_from_checkpoint|trust_remote_code|dataset_num_proc|dataset_text_field|"
    r"early_stopping_patience|debug|deepspeed_config|xformers_attention|group_by_length|"
    r"train_on_inputs|saves_per_epoch|evals_per_epoch|bnb_config_kwargs|lora_fan_in_fan_out|"
    r"local_rank|max_samples|overwrite_cache|use_peft|bf16|fp16|bf16_full_eval|fp16_full_eval|"
    r"task_type|bias|inference_mode|base_model_config|"
    r"auto_mapping|revision|peft_type|sweeper_sha256|provenance|notes|environment|effective_batch_size|"
    r"target_effective_batch_size|training_args|bnb_config|lora_config|collation|dataset_kwargs|"
    r"eot_tokens|model_revision|log_level|"
    r"init_lora_weights|fan_in_fan_out|lora_bias|peft_version|base_model_ignore_patterns|"
    r"gradient_checkpointing_kwargs|is_llama_derived_model|tokenizer_type|lora_model_dir)$"
)


# -- reading --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyLine:
    """One key of the user's file and what became of it.

    Attributes:
        key: The file's key (dotted for a nested one).
        value: Its value as written.
        status: ``carried`` (the same name and value), ``translated`` (another name or form), ``default`` (not in
            the file: the tool's default stands for it), ``not carried`` (no trial expresses it, or it changes
            nothing sweeper measures) or ``unread`` (a key sweeper does not know).
        setting: The setting it sets (None when not carried).
        note: The translation (``from -> to``), or why it is not carried.
    """

    key: str
    value: Any
    status: str
    setting: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Reading:
    """A production config, read.

    Attributes:
        path: The file.
        tool: The format it was read as (:data:`TOOL_KEYS`'s names, or ``policy``).
        settings: Each setting of :data:`SETTINGS` the file sets or its tool defaults, by sweeper's name.
        keys: The file's key for each setting it sets (a setting left at its tool's default has none): what a
            message names and what ``--onto`` writes.
        lines: Every key of the file and what became of it (:class:`KeyLine`), then each default that stands for a
            key the file leaves out.
        not_measured: The file's keys that move memory or numerics and that no trial expresses, each with its
            reason (:data:`NOT_MEASURED`): the guard fails on them.
        noted: The file's keys to know of that the guard only warns of: a key its tool ignores
            (:data:`IGNORED_BY_TOOL`), evaluation (:data:`NOTED`), a JSON boolean written as a string.
        adapter: The file is a peft ``adapter_config.json`` (it names its ``peft_type``): a trained adapter's record,
            read by ``init --from``, never written onto.
    """

    path: str
    tool: str
    settings: dict[str, Any]
    keys: dict[str, str]
    lines: list[KeyLine] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)
    noted: dict[str, str] = field(default_factory=dict)
    adapter: bool = False

    def key(self, setting: str) -> str:
        """The file's key for ``setting``, or the tool's key for it when the file leaves it out (``micro_batch_size``
        for ``per_device_train_batch_size`` in axolotl), or the setting's own name."""
        if setting in self.keys:
            return self.keys[setting]
        tool = TOOL_KEYS.get(self.tool)
        return (tool.key_of(setting) if tool else None) or setting

    def defaulted(self, setting: str) -> bool:
        """Whether ``setting`` is its tool's default (the file does not set it)."""
        return setting in self.settings and setting not in self.keys


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``, one level of nesting for the keys a tool nests
    (``bnb_config_kwargs``, ``collation``); other values as they are."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key in ("bnb_config_kwargs", "collation") and not prefix:
            out[name] = value
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def detect_tool(config: Mapping[str, Any], suffix: str) -> str:
    """Which format ``config`` (the parsed file) is: ``policy`` (the policy's own fields), ``json`` (keyword
    arguments), ``llama-factory``, ``axolotl`` or ``trl``; ``space`` for a sweeper space file. A YAML is
    LLaMA-Factory's when it has one of its own keys (``stage``, ``finetuning_type``, ``quantization_bit``,
    ``cutoff_len``, ``lora_rank``, ``lora_target``, ``template``), axolotl's with ``base_model`` or one of its own
    (``micro_batch_size``, ``sequence_len``, ``adapter``, ``sample_packing``), TRL's otherwise."""
    if "envelope" in config and "study" in config:
        return "policy"
    if "search" in config or ("training" in config and "study" in config):
        return "space"
    if suffix == ".json":
        return "json"
    if {"stage", "finetuning_type", "quantization_bit", "cutoff_len", "lora_rank", "lora_target", "template"} & set(
        config
    ):
        return "llama-factory"
    if {"base_model", "micro_batch_size", "sequence_len", "adapter", "sample_packing"} & set(config):
        return "axolotl"
    return "trl"


def _json_flat(config: Mapping[str, Any], lines: list[KeyLine] | None = None) -> dict[str, Any]:
    """A JSON of keyword arguments, flat: the json export's ``bnb_config``, ``lora_config`` and ``training_args``
    merged into the top level (their keys are the objects' own, and win: a top-level key they also set is said in
    ``lines`` as not carried, never dropped)."""
    flat = dict(config)
    for nest in ("bnb_config", "lora_config", "training_args"):
        inner = config.get(nest)
        if isinstance(inner, dict):
            for key, value in inner.items():
                if key in config and lines is not None:
                    why = f"{nest}.{key} sets it (the object's own keyword)"
                    lines.append(KeyLine(key, config[key], "not carried", None, why))
                flat[key] = value
    if isinstance(config.get("collation"), dict):
        flat.update({f"collation.{k}": v for k, v in config["collation"].items()})
    return flat


def _on(value: Any) -> bool:
    """A flag's value as pydantic and TRL's parser read it: ``true``, ``yes``, ``on``, ``1``... (and axolotl's
    ``auto``) are on."""
    return value is True or (value is not None and str(value).strip().lower() in _TRUE | {"auto"})


def _mixed_precision(raw: Mapping[str, Any], tool: Tool) -> tuple[str | None, str | None]:
    """The autocast precision the file's ``bf16``/``fp16`` flags choose (``bf16``, ``fp16`` or None for float32),
    and the key that chose it (None: the tool's default). axolotl's ``bf16: auto`` is bf16 on a card with it;
    LLaMA-Factory with neither flag on chooses from the GPU and the checkpoint (:data:`INFERRED_PRECISION`)."""
    bf16, fp16 = raw.get("bf16"), raw.get("fp16")
    if _on(bf16):
        return "bf16", "bf16"
    if _on(fp16):
        return "fp16", "fp16"
    said = "bf16" if bf16 is not None else "fp16" if fp16 is not None else None
    if tool.name == "llama-factory":
        return INFERRED_PRECISION, said
    if said is not None:
        return None, said
    return tool.defaults.get("mixed_precision"), None


def read_config(config: Any, path: str, suffix: str) -> Reading:
    """Read a parsed production config (see :func:`read_production`)."""
    if not isinstance(config, dict) or not config:
        raise ProductionConfigError(f"{path}: not a config of keys (an empty file, or a list); give {FORMATS}")
    tool_name = detect_tool(config, suffix)
    if tool_name == "space":
        raise ProductionConfigError(
            f"{path}: this is a sweeper space (study/search/training sections), not a production config; give {FORMATS}"
        )
    if tool_name == "policy":
        return _read_policy(config, path)
    tool = TOOL_KEYS[tool_name]
    lines: list[KeyLine] = []
    raw = _json_flat(config, lines) if tool_name == "json" else _flatten(config)
    settings: dict[str, Any] = {}
    keys: dict[str, str] = {}
    not_measured: dict[str, str] = {}
    noted: dict[str, str] = {}
    for key, value in raw.items():
        spec = tool.keys.get(key)
        if spec is not None:
            try:
                converted = spec.convert(value) if value is not None or spec.setting == "max_seq_length" else None
            except (TypeError, ValueError) as exc:
                raise ProductionConfigError(f"{path}: {key}: {exc}; write it as {_example(spec)}") from None
            if converted is None and spec.setting == "max_seq_length" and value is None and spec.setting not in keys:
                # TRL's max_length: null truncates nothing: rows as long as the data's, no measured bound
                settings[spec.setting], keys[spec.setting] = None, key
                lines.append(KeyLine(key, value, "translated", spec.setting, "null: no truncation"))
                continue
            if converted is None:
                lines.append(KeyLine(key, value, "not carried", spec.setting, "unset (null or false)"))
                continue
            if tool_name == "json" and spec.convert in (_bool, _checkpointing) and isinstance(value, str):
                noted[key] = (
                    f"{value!r} is a string: TrainingArguments(**json) and HfArgumentParser.parse_json_file keep it, "
                    "and any non-empty string is true; write true or false"
                )
            if spec.setting in keys:
                if key == "activation_checkpointing":  # transformers 5: it overrides gradient_checkpointing
                    lines.append(KeyLine(keys[spec.setting], raw[keys[spec.setting]], "not carried", spec.setting,
                                         f"{key} overrides it"))  # fmt: skip
                    settings[spec.setting], keys[spec.setting] = converted, key
                    lines.append(KeyLine(key, value, "translated", spec.setting, spec.how))
                    continue
                if spec.setting == "target_modules" and converted == "all-linear":
                    # axolotl adds every linear layer to lora_target_modules: all-linear wins
                    settings[spec.setting], keys[spec.setting] = converted, key
                    lines.append(KeyLine(key, value, "translated", spec.setting, f"{spec.how}, over the list"))
                    continue
                if not (spec.setting == "target_modules" and settings[spec.setting] == "all-linear"):
                    why = f"{keys[spec.setting]} sets it first"
                    lines.append(KeyLine(key, value, "not carried", spec.setting, why))
                    continue
                why = f"{keys[spec.setting]} adds every linear layer"
                lines.append(KeyLine(key, value, "not carried", spec.setting, why))
                continue
            settings[spec.setting], keys[spec.setting] = converted, key
            same = key.split(".")[-1] == spec.setting and converted == value
            lines.append(KeyLine(key, value, "carried" if same else "translated", spec.setting, spec.how))
        elif key in IGNORED_BY_TOOL.get(tool.name, {}):
            lines.append(KeyLine(key, value, "not carried", None, IGNORED_BY_TOOL[tool.name][key]))
            noted[key] = IGNORED_BY_TOOL[tool.name][key]
        elif key in NOTED and value not in (None, False):
            lines.append(KeyLine(key, value, "not carried", None, NOTED[key]))
            noted[key] = NOTED[key]
        elif tool.name == "llama-factory" and key in ("stage", "quantization_method"):
            expected = {"stage": "sft", "quantization_method": "bnb"}[key]
            if str(value).lower() == expected:
                lines.append(KeyLine(key, value, "carried", None, f"{value}: what the trials ran"))
            else:
                why = {
                    "stage": f"stage {value}: not the supervised fine-tuning (sft) the trials measured"
                    + ("; pt packs rows by default" if value == "pt" else ""),
                    "quantization_method": f"{value}: not the bitsandbytes 4-bit weights the trials measured",
                }[key]
                lines.append(KeyLine(key, value, "not carried", None, why))
                not_measured[key] = why
        elif key == "fsdp_config" and not raw.get("fsdp"):
            lines.append(KeyLine(key, value, "not carried", None, "fsdp is off"))
        elif key in NOT_MEASURED and value not in (None, False, [], "", {}):
            not_measured[key] = NOT_MEASURED[key]
            lines.append(KeyLine(key, value, "not carried", None, NOT_MEASURED[key]))
        elif key in NOT_MEASURED:
            lines.append(KeyLine(key, value, "not carried", None, "off, as in the trials"))
        elif key in ("bf16", "fp16"):
            if tool_name == "json" and isinstance(value, str) and value:
                noted[key] = (
                    f"{value!r} is a string: TrainingArguments(**json) and HfArgumentParser.parse_json_file keep it, "
                    "and any non-empty string is true; write true or false"
                )
            continue  # read together below
        elif key == "tf32":
            lines.append(KeyLine(key, value, "not carried", None, TF32))
        elif key in SCHEDULE:
            lines.append(KeyLine(key, value, "not carried", None, SCHEDULE[key]))
        elif key.startswith(("bnb_config_kwargs.", "collation.")) or _BOOKKEEPING.match(key):
            if key in ("bnb_config_kwargs", "collation") and isinstance(value, dict):
                continue  # its keys are read one by one
            lines.append(KeyLine(key, value, "not carried", None, "moves neither memory nor stability as measured"))
        elif value is None or value == {} or value == [] or value == "":
            lines.append(KeyLine(key, value, "not carried", None, "unset (null or empty): the tool's default"))
        else:
            lines.append(KeyLine(key, value, "unread", None, "sweeper does not know this key"))
    precision, precision_key = _mixed_precision(raw, tool)
    settings["mixed_precision"] = precision
    if precision_key is not None:
        keys["mixed_precision"] = precision_key
    for flag in ("bf16", "fp16"):
        if flag in raw:
            lines.append(
                KeyLine(flag, raw[flag], "translated", "mixed_precision", f"{flag} -> mixed precision {precision}")
            )
    if tool_name == "llama-factory" and str(raw.get("stage", "sft")).lower() == "pt" and "packing" not in keys:
        settings["packing"] = True  # LLaMA-Factory packs pretraining rows unless told not to
    _derive(settings, keys, raw, tool, lines, not_measured)
    return Reading(
        path=path,
        tool=tool_name,
        settings=settings,
        keys=keys,
        lines=lines,
        not_measured=not_measured,
        noted=noted,
        adapter=tool_name == "json" and "peft_type" in config,
    )


def _derive(
    settings: dict[str, Any],
    keys: dict[str, str],
    raw: Mapping[str, Any],
    tool: Tool,
    lines: list[KeyLine],
    not_measured: dict[str, str],
) -> None:
    """The settings a tool derives from others, then its defaults for what the file leaves out."""
    if tool.name == "llama-factory":
        if raw.get("neat_packing") not in (None, False, "false"):
            settings["packing"], keys["packing"] = True, "neat_packing"
            settings["packing_across_samples"] = False
        elif settings.get("packing"):
            settings["packing_across_samples"] = True  # plain packing lets samples attend to each other
        if "lora_alpha" not in settings and "r" in settings:
            settings["lora_alpha"] = settings["r"] * 2  # LLaMA-Factory: lora_alpha defaults to lora_rank * 2
    if tool.name == "axolotl" and settings.get("packing") and "pad_to_max_length" not in settings:
        settings["pad_to_max_length"] = True  # axolotl turns pad_to_sequence_len on with sample_packing
    if raw.get("gradient_checkpointing") == "offload":
        not_measured["gradient_checkpointing"] = (
            "offload: checkpointed activations held on the CPU: the run's peak is LOWER than measured"
        )
    for setting, default in tool.defaults.items():
        if setting not in settings:
            settings[setting] = default
            lines.append(KeyLine(tool.key_of(setting) or setting, default, "default", setting, tool.default_source))
    if "lora_alpha" not in settings and tool.name == "llama-factory":
        settings["lora_alpha"] = settings.get("r", 8) * 2
    if settings.get("load_in_4bit") and "bnb_4bit_compute_dtype" not in settings:
        # axolotl, LLaMA-Factory and TRL's config compute the 4-bit layers in their mixed precision's dtype
        precision = settings.get("mixed_precision")
        dtypes = {"bf16": "bfloat16", "fp16": "float16", INFERRED_PRECISION: INFERRED_PRECISION}
        settings["bnb_4bit_compute_dtype"] = dtypes.get(precision or "", "float32")


def _example(spec: ToolKey) -> str:
    examples = {
        "_bool": "true or false",
        "_checkpointing": "true, false or offload",
        "_int": "a whole number",
        "_float": "a number",
        "_alpha": "a number",
        "_modules": "a list of module names, or all-linear",
        "_dtype": "bfloat16, float16 or float32",
    }
    return examples.get(getattr(spec.convert, "__name__", ""), "in its tool's documented form")


def _read_policy(config: Mapping[str, Any], path: str) -> Reading:
    """The ``policy`` export's own fields (``Policy.as_flat()`` with its envelope), by its own names."""
    settings = {k: v for k, v in config.items() if k in SETTINGS}
    settings.setdefault("mixed_precision", PRECISION_OF_DTYPE.get(config.get("bnb_4bit_compute_dtype", "")))
    settings.setdefault("load_in_8bit", False)
    settings.setdefault("pad_to_max_length", False)
    keys = {k: k for k in settings}
    return Reading(path=path, tool="policy", settings=settings, keys=keys)


def read_production(path: str | Path) -> Reading:
    """Read the production config at ``path`` (see the module's docstring for the formats).

    Raises:
        ProductionConfigError: The file does not exist, is of a kind this reader does not read (a ``.py``, a
            ``.toml``), does not parse, is not a mapping of keys, is a sweeper space, or a value has the wrong type
            (its key named).
    """
    p = Path(path)
    if not p.is_file():
        raise ProductionConfigError(f"{path}: no such file; give {FORMATS}")
    suffix = p.suffix.lower()
    if suffix == ".orig":  # the original sweep export --onto keeps: read as the file it was
        suffix = Path(p.stem).suffix.lower()
    if suffix == ".py":
        raise ProductionConfigError(
            f"{path}: a Python script is not read (its values are code); give the .json beside sweep's hf/trl export, "
            f"or {FORMATS}"
        )
    if suffix not in (".yaml", ".yml", ".json"):
        raise ProductionConfigError(f"{path}: a {suffix or 'suffix-less'} file is not read; give {FORMATS}")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        if suffix == ".json":
            config = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                raise ProductionConfigError(f"{path}: reading a YAML config needs PyYAML: pip install pyyaml") from None
            config = yaml.safe_load(text)
    except ProductionConfigError:
        raise
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError: one line with where it broke
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        kind = suffix[1:].upper()
        raise ProductionConfigError(f"{path}: does not parse as {kind} ({first}); give {FORMATS}") from None
    return read_config(config, str(path), suffix)


# -- writing a setting back under a tool's keys ----------------------------------------------------------------------


def written(tool: str, setting: str, value: Any, reading: Reading | None = None) -> dict[str, Any]:
    """The keys and values of ``tool``'s config that set ``setting`` to ``value``: what ``sweep export --onto``
    writes and what the guard's messages tell to write. A value of None means: remove the key (axolotl's
    ``lora_target_linear`` where the targets are written as a list). With ``reading``, a setting the file already
    sets is written under the file's own key (a JSON's ``max_length`` stays ``max_length``).

    Raises:
        ValueError: ``tool`` has no key for the setting at that value (LLaMA-Factory computes in bf16 or fp16 only:
            a float32 compute dtype).
    """
    if setting == "mixed_precision":
        if tool == "llama-factory" and value is None:
            raise ValueError("LLaMA-Factory has no key for float32 compute of a 4-bit model")
        return {"bf16": value == "bf16", "fp16": value == "fp16"}
    if tool == "llama-factory":
        special: dict[str, Callable[[Any], dict[str, Any]]] = {
            "load_in_4bit": lambda v: {"quantization_bit": 4 if v else None},
            "gradient_checkpointing": lambda v: {"disable_gradient_checkpointing": not v},
            "target_modules": lambda v: {"lora_target": ",".join(v)},
            "packing": lambda v: {"packing": v, "neat_packing": v},
            "bnb_4bit_compute_dtype": lambda v: {},  # set by bf16/fp16 (mixed_precision)
            "pad_to_max_length": lambda v: {},  # no key: its packing pads rows to cutoff_len, its padding to the batch
            "attn_implementation": lambda v: {
                "flash_attn": {"flash_attention_2": "fa2", "sdpa": "sdpa", "eager": "disabled"}.get(v, "auto")
            },
        }
        if setting in special:
            return special[setting](value)
    if tool == "axolotl":
        if setting == "target_modules":
            return {"lora_target_modules": list(value), "lora_target_linear": None}
        if setting == "bnb_4bit_compute_dtype":
            return {"bnb_config_kwargs.bnb_4bit_compute_dtype": value}
        if setting == "packing":
            return {"sample_packing": value}
        if setting == "pad_to_max_length":
            return {"pad_to_sequence_len": value}
        if setting == "attn_implementation":  # its older switches off, where the file has them
            return {"attn_implementation": value, "flash_attention": None, "sdp_attention": None}
    if tool == "trl" and setting == "bnb_4bit_compute_dtype":
        return {"dtype": value}
    if tool in ("trl", "json") and setting == "pad_to_max_length":
        return {}  # no key: TRL pads each batch to its longest row, or packs
    if setting == "target_modules":
        value = list(value)
    key = reading.keys.get(setting) if reading is not None else None
    if key is None:
        spec = TOOL_KEYS.get(tool)
        key = (spec.key_of(setting) if spec is not None else None) or setting
    return {key: value}


def as_file_says(tool: str, setting: str, value: Any) -> str:
    """``written(...)`` as a line of YAML-like text: ``micro_batch_size: 2``, ``bf16: true, fp16: false``."""

    def text(v: Any) -> str:
        if v is None:
            return "(removed)"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list | tuple):
            return "[" + ", ".join(map(str, v)) + "]"
        return str(v)

    try:
        pairs = written(tool, setting, value)
    except ValueError as exc:
        return str(exc)
    return ", ".join(f"{k}: {text(v)}" for k, v in pairs.items())
