"""Setup errors that would fail every trial the same way, found once before the first trial (``sweep run`` and
``sweep trial`` exit 2 with one line each), and the space that cannot fit at all.

- a LoRA target module that matches no module of the model (peft's rule for a list of names,
  ``peft.tuners.tuners_utils.check_target_module_exists``: a module matches a target when its name equals it or ends
  with ``"." + target``); the module names are read from the checkpoint's safetensors headers or its index json
  (the 8-byte header length and the JSON header of the safetensors format), no weights and no torch;
- a model folder without weights;
- ``attn_implementation: flash_attention_2`` without the ``flash_attn`` package (or without a GPU);
- a checkpoint whose own ``quantization_config`` (``config.json``) overrides the searched quantization:
  transformers uses the checkpoint's and ignores the one passed to ``from_pretrained``
  (``transformers.quantizers.auto.AutoHfQuantizer.merge_quantization_configs``);
- a space of which no configuration is predicted to fit ``memory_limit_gib`` (:func:`nothing_fits`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sweeper.space import SearchSpace, TrialConfig
from sweeper.trial import cuda_visible

#: Weight files ``from_pretrained`` loads from a checkpoint folder (transformers 5 reads only PyTorch formats).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
#: Index files of sharded checkpoints: ``{"weight_map": {tensor name: shard file}}``.
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: Tensor name segments that end a module's name: ``model.layers.0.self_attn.q_proj.weight`` is the module
#: ``model.layers.0.self_attn.q_proj``; a bitsandbytes checkpoint adds ``.weight.absmax``, ``.weight.quant_map``, ...
_PARAM_NAMES = ("weight", "bias")
#: Largest safetensors header read (the format caps it at 100 MB).
_MAX_HEADER = 100_000_000
#: The searched quantization keys and, for a bitsandbytes 4-bit ``quantization_config``, its key and default there
#: (``transformers.BitsAndBytesConfig``).
_QUANT_KEYS = {
    "bnb_4bit_quant_type": ("bnb_4bit_quant_type", "fp4"),
    "bnb_4bit_use_double_quant": ("bnb_4bit_use_double_quant", False),
    "bnb_4bit_compute_dtype": ("bnb_4bit_compute_dtype", "float32"),
}


def _local_dir(model_path: str) -> Path | None:
    """The checkpoint folder: ``model_path`` itself, or a hub id's snapshot in the local Hugging Face cache (found by
    its ``config.json``); None when neither is on this machine."""
    path = Path(model_path)
    if path.is_dir():
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, "config.json")
    except Exception:  # not a valid repo id, no cache: nothing to check here
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def weight_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder (:data:`WEIGHT_PATTERNS`), sorted."""
    return sorted({p for pattern in WEIGHT_PATTERNS for p in folder.glob(pattern) if p.is_file()})


def safetensors_names(path: Path) -> list[str]:
    """The tensor names in a safetensors file's header (no tensor is read).

    Raises:
        ValueError: Not a safetensors file (a header length beyond the file or the format's cap, or not JSON).
    """
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path.name}: shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > _MAX_HEADER:
            raise ValueError(f"{path.name}: header of {size} bytes: not a safetensors file")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name}: header is not a JSON object")
    return [k for k in header if k != "__metadata__"]


def _module_of(tensor: str) -> str:
    parts = tensor.split(".")
    for i, part in enumerate(parts):
        if part in _PARAM_NAMES and i > 0:
            return ".".join(parts[:i])
    return ".".join(parts[:-1])


def module_names(model_path: str) -> list[str] | None:
    """The names of the model's modules that hold weights (``model.layers.0.self_attn.q_proj``, ...), read from the
    checkpoint's index json or safetensors headers, plus ``lm_head`` (a causal LM always has one; a tied one is
    not saved); None when they cannot be read here (a hub id not in the cache, a single ``pytorch_model.bin``)."""
    folder = _local_dir(model_path)
    if folder is None:
        return None
    tensors: list[str] = []
    for index in INDEX_FILES:
        if (folder / index).is_file():
            try:
                data = json.loads((folder / index).read_text())
                tensors = list(data["weight_map"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
            break
    else:
        files = [p for p in weight_files(folder) if p.suffix == ".safetensors"]
        if not files:
            return None
        try:
            for f in files:
                tensors += safetensors_names(f)
        except (OSError, ValueError):
            return None
    modules = {_module_of(t) for t in tensors}
    modules.discard("")
    modules.add("lm_head")
    return sorted(modules)


def matches(target: str, module: str) -> bool:
    """peft's rule for a target in a list (``check_target_module_exists``): the module's name equals the target or
    ends with ``"." + target``."""
    return module == target or module.endswith("." + target)


def unmatched_targets(targets: Iterable[str], modules: Sequence[str]) -> list[str]:
    """The targets that match no module (:func:`matches`), in the given order."""
    return [t for t in targets if not any(matches(t, m) for m in modules)]


def short_names(modules: Iterable[str]) -> list[str]:
    """The distinct last parts of module names, layers' numbers aside: what a user writes in ``target_modules``
    (``q_proj``, ``down_proj``, ``lm_head``, ...)."""
    return sorted({m.rsplit(".", 1)[-1] for m in modules if not m.rsplit(".", 1)[-1].isdigit()})


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
                shards = set(json.loads((folder / index).read_text())["weight_map"].values())
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
    """A problem line for ``flash_attention_2`` without the ``flash_attn`` package or without a GPU."""
    if space.model.attn_implementation != "flash_attention_2":
        return []
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


def _yaml(value: Any) -> str:
    """A value as the space file writes it (``true``, ``[q_proj, v_proj]``)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


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
    folder = _local_dir(model_path)
    if folder is None or not (folder / "config.json").is_file():
        return []
    try:
        config = json.loads((folder / "config.json").read_text())
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
    forces = ", ".join(f"{k}={_yaml(v)}" for k, v in forced.items())
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


#: Single changes that lower a configuration's memory, cheapest first (what they cost the training): checkpointing
#: costs time, double quant ~0.4 bit of precision in the constants, an 8-bit optimizer state precision, a smaller
#: batch is kept by gradient accumulation (export keeps the effective batch), shorter rows lose data, a smaller rank
#: or dropout off change the adapter.
_CHEAP_CHANGES: tuple[tuple[str, Callable[[Any], list[Any]]], ...] = (
    ("gradient_checkpointing", lambda v: [True] if v is False else []),
    ("bnb_4bit_use_double_quant", lambda v: [True] if v is False else []),
    ("optim", lambda v: ["paged_adamw_8bit"] if "8bit" not in str(v) else []),
    ("per_device_train_batch_size", lambda v: sorted({1, v // 2} - {v}, reverse=True) if v > 1 else []),
    ("max_seq_length", lambda v: [s for s in (v * 3 // 4, v // 2, v // 4, v // 8) if s >= 8]),
    ("r", lambda v: [x for x in (v // 2, v // 4, 1) if 1 <= x < v]),
    ("lora_dropout", lambda v: [0.0] if v else []),
)


def nothing_fits(
    space: SearchSpace,
    predict: Callable[[TrialConfig], float | None],
    known_fit: bool = False,
) -> str | None:
    """One line when no configuration of the space is predicted to fit, else None.

    The space's memory-relevant grid (:func:`sweeper.estimate.grid_values`) is predicted with ``predict`` (a trial
    config dict to GiB: the memory model, corrected by the study's calibration where it has one) against
    ``memory_limit_gib * (1 + preflight_margin)``, the preflight's own bound. The line names the smallest predicted
    peak and the cheapest single setting that brings it under ``memory_limit_gib`` itself (:data:`_CHEAP_CHANGES`;
    the margin only forgives the model's error, advice should not lean on it), else the cap it would need: the
    smallest predicted peak, rounded up. ``known_fit``: the study already holds a trial that fit: say nothing.
    """
    import itertools

    from sweeper.estimate import MAX_POINTS, MEMORY_KEYS, grid_values

    if known_fit:
        return None
    limit_gib, margin = space.base.memory_limit_gib, space.base.preflight_margin
    bound = limit_gib * (1 + margin)
    keys = [k for k in MEMORY_KEYS if k in space.search]
    smallest: tuple[float, TrialConfig] | None = None
    for combo in itertools.islice(itertools.product(*[grid_values(space, k) for k in keys]), MAX_POINTS):
        values = dataclasses.replace(space.base, **dict(zip(keys, combo)))
        peak = predict(values)
        if peak is None:
            return None  # the model's shape is unknown: nothing is predicted
        if peak <= bound:
            return None
        if smallest is None or peak < smallest[0]:
            smallest = (peak, values)
    if smallest is None:
        return None
    peak, values = smallest
    shown = " ".join(f"{k}={getattr(values, k)}" for k in ("per_device_train_batch_size", "max_seq_length", *keys))
    shown = " ".join(dict.fromkeys(shown.split()))
    change = None
    for key, options in _CHEAP_CHANGES:
        for option in options(getattr(values, key)):
            after = predict(dataclasses.replace(values, **{key: option}))
            if after is not None and after <= limit_gib:  # predicted to fit the cap itself, not only its margin
                change = f"{key}: {_yaml(option)} ({after:.2f} GiB)"
                break
        if change:
            break
    needed = math.ceil(peak * 100) / 100  # a cap the predicted peak fits (the margin only forgives the model's error)
    fix = (
        f"the cheapest setting to change: {change}, or memory_limit_gib >= {needed:.2f}"
        if change
        else f"no single setting brings it under; raise memory_limit_gib to {needed:.2f} or more"
    )
    return (
        f"{space.path}: training.memory_limit_gib: no configuration of the space is predicted to fit "
        f"{limit_gib:g} GiB (+ preflight_margin {margin:g}): the smallest predicted peak is {peak:.2f} GiB ({shown}); "
        f"{fix} (sweep estimate {space.path})"
    )
