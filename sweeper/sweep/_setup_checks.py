"""Setup errors that would fail every trial the same way, found once before the first trial (``sweep run`` and
``sweep trial`` exit 2 with one line each), and the space that cannot fit at all.

- a LoRA target module that matches no module of the model (peft's rule for a list of names,
  ``peft.tuners.tuners_utils.check_target_module_exists``: a module matches a target when its name equals it or ends
  with ``"." + target``); the module names are read from the checkpoint's safetensors headers or its index json
  (:mod:`sweeper.checkpoint`), no weights and no torch;
- a model folder without weights;
- ``attn_implementation: flash_attention_2`` without the ``flash_attn`` package (or without a GPU);
- a checkpoint whose own ``quantization_config`` (``config.json``) overrides the searched quantization:
  transformers uses the checkpoint's and ignores the one passed to ``from_pretrained``
  (``transformers.quantizers.auto.AutoHfQuantizer.merge_quantization_configs``);
- a space of which no configuration is predicted to fit ``memory_limit_gib`` (:func:`sweeper.memory.nothing_fits`,
  called by :func:`sweeper.sweep._plan.plan_sweep`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sweeper.checkpoint import (
    INDEX_FILES,
    local_dir,
    module_names,
    read_config,
    read_weight_map,
    safetensors_names,
    short_names,
    unmatched_targets,
    weight_files,
)
from sweeper.devices import cuda_visible
from sweeper.space import SearchSpace, yaml_value

#: The searched quantization keys and, for a bitsandbytes 4-bit ``quantization_config``, its key and default there
#: (``transformers.BitsAndBytesConfig``).
_QUANT_KEYS = {
    "bnb_4bit_quant_type": ("bnb_4bit_quant_type", "fp4"),
    "bnb_4bit_use_double_quant": ("bnb_4bit_use_double_quant", False),
    "bnb_4bit_compute_dtype": ("bnb_4bit_compute_dtype", "float32"),
}


def check_target_modules(space: SearchSpace, model_path: str) -> list[str]:
    """One problem line per ``training.target_modules`` entry that matches no module of the model (nothing when the
    module names cannot be read here)."""
    modules = module_names(model_path)
    if modules is None:
        return []
    targets = list(space.base.target_modules)
    missing = unmatched_targets(targets, modules)
    if not missing:
        return []
    names = ", ".join(repr(t) for t in missing)
    return [
        f"{space.path}: training.target_modules: {names} match{'es' if len(missing) == 1 else ''} no module of "
        f"{space.model.name_or_path} (peft matches a module whose name is the target or ends with '.' + target), so "
        f"LoRA would not adapt {'it' if len(missing) == 1 else 'them'}; the model's modules: "
        f"{', '.join(short_names(modules))}; fix the name{'s' if len(missing) > 1 else ''}"
    ]


def check_weights(space: SearchSpace, model_path: str) -> list[str]:
    """A problem line when a local checkpoint folder has no weight files, a safetensors file whose header cannot be
    read (truncated, not safetensors), or an index that names shards that are not there."""
    folder = Path(model_path)
    if not folder.is_dir():
        return []
    for index in INDEX_FILES:
        if (folder / index).is_file():
            try:
                shards = set(read_weight_map(folder / index).values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return [
                    f"{folder / index}: model.name_or_path: unreadable index of a sharded checkpoint; save the model "
                    "again with save_pretrained"
                ]
            absent = sorted(s for s in shards if not (folder / s).is_file())
            if absent:
                return [
                    f"{folder / index}: model.name_or_path: {len(absent)} of {len(shards)} weight shards are missing "
                    f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); every trial would fail to load "
                    "the model; download or copy the missing files"
                ]
            return []
    files = weight_files(folder)
    for f in files:
        if f.suffix != ".safetensors":
            continue
        try:
            safetensors_names(f)
        except (OSError, ValueError) as exc:
            return [
                f"{f}: model.name_or_path: not a readable safetensors file ({exc}); every trial would fail to load "
                "it; copy or download the file again"
            ]
    if files:
        return []
    return [
        f"{folder}: model.name_or_path: no weights in this folder (no *.safetensors or pytorch_model*.bin), only "
        f"{', '.join(sorted(p.name for p in folder.iterdir())[:5]) or 'nothing'}; every trial would fail to load "
        "it; give the folder that save_pretrained wrote with its weights ('sweep estimate' needs only config.json)"
    ]


def check_attention(space: SearchSpace) -> list[str]:
    """A problem line for ``flash_attention_2`` without the ``flash_attn`` package or without a GPU, or with packed
    rows at a ``per_device_train_batch_size`` above 1: transformers (5.25, ``modeling_flash_attention_utils.
    _is_packed_sequence``) reads position ids as packed sequences only for a batch of one row, so at batch 2 or more
    each packed row's samples would attend to each other (LLaMA-Factory 0.9.5 asserts batch 1 for the same reason);
    sdpa and eager build the block-diagonal mask at any batch (``tests/trial/test_collation.py``)."""
    if space.model.attn_implementation != "flash_attention_2":
        return []
    batch = max(space.values_of("per_device_train_batch_size"))
    if True in space.values_of("packing") and batch > 1:
        return [
            f"{space.path}: model.attn_implementation: flash_attention_2 with packing: true treats a micro-batch as "
            f"packed samples only at per_device_train_batch_size 1 (transformers reads packed position ids only for "
            f"one row), so at batch {batch} each row's samples would attend to each other; search "
            "per_device_train_batch_size [1] with packing (gradient_accumulation_steps for the effective batch), or "
            "use sdpa"
        ]
    if importlib.util.find_spec("flash_attn") is None:
        return [
            f"{space.path}: model.attn_implementation: flash_attention_2 needs the flash-attn package, which is not "
            "installed here; install it (pip install flash-attn, on a CUDA machine) or use sdpa"
        ]
    if not cuda_visible():
        return [
            f"{space.path}: model.attn_implementation: flash_attention_2 runs only on a CUDA GPU and none is visible "
            "here; use sdpa"
        ]
    return []


def _forced_values(quantization: Mapping[str, Any]) -> dict[str, Any] | None:
    """What a bitsandbytes 4-bit ``quantization_config`` forces on the searched keys; None for any other method."""
    method = str(quantization.get("quant_method", "")).lower()
    if method != "bitsandbytes" or not quantization.get("load_in_4bit"):
        return None
    forced = {}
    for key, (stored, default) in _QUANT_KEYS.items():
        value = quantization.get(stored, default)
        if key == "bnb_4bit_compute_dtype":
            value = str(value).removeprefix("torch.")
        forced[key] = value
    return forced


def check_quantization_config(space: SearchSpace, model_path: str) -> list[str]:
    """A problem line when the checkpoint's ``config.json`` carries a ``quantization_config``: a bitsandbytes 4-bit
    one whose values differ from a searched or fixed quantization key (those keys cannot take effect), or any other
    method (the trials' 4-bit quantization cannot take effect at all)."""
    folder = local_dir(model_path)
    if folder is None or not (folder / "config.json").is_file():
        return []
    try:
        config = read_config(folder)
    except (OSError, ValueError):
        return []
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(quantization, dict):
        return []
    where = f"{folder / 'config.json'}: quantization_config"
    forced = _forced_values(quantization)
    if forced is None:
        shown = ", ".join(
            f"{k}={quantization[k]}" for k in ("quant_method", "bits", "load_in_8bit", "fmt") if k in quantization
        )
        return [
            f"{where}: the checkpoint is already quantized ({shown or 'quant_method unknown'}); transformers loads it "
            "as such, so the searched 4-bit keys (bnb_4bit_quant_type, bnb_4bit_use_double_quant, "
            "bnb_4bit_compute_dtype) cannot take effect; give the unquantized base model"
        ]
    clashes = []
    for key, value in forced.items():
        asked = space.values_of(key)
        if any(a != value for a in asked):
            clashes.append(key)
    if not clashes:
        return []
    forces = ", ".join(f"{k}={yaml_value(v)}" for k, v in forced.items())
    return [
        f"{where}: the checkpoint is already 4-bit (bitsandbytes) and transformers uses its own settings, which "
        f"force {forces}: the searched {', '.join(clashes)} cannot take effect; give the unquantized base model, "
        f"or fix {'these keys' if len(clashes) > 1 else 'this key'} to the forced value"
    ]


def check_setup(space: SearchSpace, model_path: str) -> list[str]:
    """Every setup problem that would fail each trial the same way (one line each; empty when none)."""
    weights = check_weights(space, model_path)
    return [
        *weights,
        *([] if weights else check_target_modules(space, model_path)),
        *check_attention(space),
        *check_quantization_config(space, model_path),
    ]
