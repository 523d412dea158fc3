"""Reading a checkpoint's files without loading it: ``config.json``, the weight files of its folder, the tensor
names of its safetensors headers (the 8-byte header length and the JSON header of the safetensors format) or of its
index json, and the module names they give, with peft's rule for matching a LoRA target to them.

Pure: no torch, no weights read; plain ``json`` and ``struct``, and the local Hugging Face cache for a hub id.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: Weight files ``from_pretrained`` loads from a checkpoint folder (transformers 5 reads only PyTorch formats).
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.pth")
#: Index files of sharded checkpoints: ``{"weight_map": {tensor name: shard file}}``.
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: Tensor name segments that end a module's name: ``model.layers.0.self_attn.q_proj.weight`` is the module
#: ``model.layers.0.self_attn.q_proj``; a bitsandbytes checkpoint adds ``.weight.absmax``, ``.weight.quant_map``, ...
_PARAM_NAMES = ("weight", "bias")
#: Largest safetensors header read (the format caps it at 100 MB).
_MAX_HEADER = 100_000_000


def read_config(path: str | Path) -> Any:
    """The JSON of ``PATH/config.json``.

    Raises:
        OSError: It cannot be read.
        ValueError: It is not JSON.
    """
    return json.loads((Path(path) / "config.json").read_text())


def read_weight_map(index: Path) -> Any:
    """The ``weight_map`` of a sharded checkpoint's index json (``{tensor name: shard file}``, :data:`INDEX_FILES`).

    Raises:
        OSError: It cannot be read.
        ValueError: It is not JSON.
        KeyError, TypeError: It has no ``weight_map``.
    """
    return json.loads(index.read_text())["weight_map"]


def checkpoint_file(model_path: str, name: str) -> Path | None:
    """The file ``name`` of a checkpoint: in the folder ``model_path``, or for a hub id in the local Hugging Face
    cache; None when it is not on this machine."""
    path = Path(model_path) / name
    if path.is_file():
        return path
    if Path(model_path).is_dir():
        return None
    try:  # a hub id: only what is in the local cache
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, name)
    except Exception:
        return None
    return Path(cached) if isinstance(cached, str) else None


def checkpoint_dtype(model_path: str) -> str | None:
    """The dtype a local checkpoint's ``config.json`` declares (``dtype``, or ``torch_dtype`` before transformers 5),
    or None when it declares none or is not a local folder."""
    try:
        data = read_config(model_path)
    except (OSError, ValueError):
        return None
    value = data.get("dtype") or data.get("torch_dtype")
    return value if isinstance(value, str) else None


def local_dir(model_path: str) -> Path | None:
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
    folder = local_dir(model_path)
    if folder is None:
        return None
    tensors: list[str] = []
    for index in INDEX_FILES:
        if (folder / index).is_file():
            try:
                tensors = list(read_weight_map(folder / index))
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
