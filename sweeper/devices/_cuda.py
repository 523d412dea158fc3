"""Which device the trials will use, decided without importing torch (the sweep process never imports it, and the
trial process must set its CPU memory cap before torch is loaded)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cuda_visible(env: Mapping[str, str] | None = None) -> bool:
    """Whether a CUDA device may be used by a process with environment ``env`` (default: this process's): an NVIDIA
    driver is present (``/dev/nvidiactl`` or ``/proc/driver/nvidia``) and ``CUDA_VISIBLE_DEVICES`` does not hide
    every device (``""`` or ``"-1"``)."""
    if (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return Path("/dev/nvidiactl").exists() or Path("/proc/driver/nvidia").exists()


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: its own ``CUDA_VISIBLE_DEVICES``, else
    every ``/dev/nvidiaN``; empty without a driver."""
    if not cuda_visible():
        return []
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible:
        visible = sorted((p.name.removeprefix("nvidia") for p in Path("/dev").glob("nvidia[0-9]*")), key=int)
    return visible


#: The environment variable of the CUDA caching allocator's options (``option:value`` pairs, comma-separated).
CUDA_ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"


#: torch's newer name for :data:`CUDA_ALLOC_CONF_VAR`: which of the two a torch reads when both are set depends on
#: its version (``c10/cuda/CUDAAllocatorConfig.h``: the CUDA name first in recent releases, the newer name first in
#: some), and one set alone is read by every version that knows it.
ALLOC_CONF_VAR = "PYTORCH_ALLOC_CONF"


def environment_alloc_conf(env: Mapping[str, str] | None = None) -> str:
    """The CUDA allocator's options the environment ``env`` (default: this process's) gives, from both
    :data:`CUDA_ALLOC_CONF_VAR` and :data:`ALLOC_CONF_VAR`, one ``option:value`` per option (the CUDA name's value
    where both name it), comma-separated; ``""`` where neither is set.

    >>> environment_alloc_conf({"PYTORCH_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True",
    ...                         "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    'max_split_size_mb:64,expandable_segments:False'
    """
    env = os.environ if env is None else env
    options: dict[str, str] = {}
    for var in (ALLOC_CONF_VAR, CUDA_ALLOC_CONF_VAR):
        for option in env.get(var, "").split(","):
            if option.strip():
                options[option.partition(":")[0].strip()] = option.strip()
    return ",".join(options.values())


def environment_expandable_segments(env: Mapping[str, str] | None = None) -> str | None:
    """The ``expandable_segments`` option the environment ``env`` (default: this process's) gives the CUDA allocator
    in ``PYTORCH_CUDA_ALLOC_CONF`` or in torch's newer name for it, ``PYTORCH_ALLOC_CONF`` (``"True"``, ``"False"``;
    the first's where both name it, :func:`environment_alloc_conf`); None where neither names it."""
    for option in environment_alloc_conf(env).split(","):
        key, _, value = option.partition(":")
        if key.strip() == "expandable_segments":
            return value.strip()
    return None


def cuda_alloc_conf(environment: str | None, expandable_segments: bool) -> str:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` a trial runs under: the environment's options (``environment``, None or ``""``
    for unset) with its ``expandable_segments`` option replaced by the trial's (:attr:`sweeper.space.TrialConfig.
    expandable_segments`): ``expandable_segments:True`` appended when true, none when false (PyTorch's default).
    ``""`` is the allocator's defaults.

    >>> cuda_alloc_conf("max_split_size_mb:128,expandable_segments:False", True)
    'max_split_size_mb:128,expandable_segments:True'
    >>> cuda_alloc_conf("expandable_segments:True", False)
    ''
    """
    options = [o.strip() for o in (environment or "").split(",") if o.strip()]
    options = [o for o in options if o.partition(":")[0].strip() != "expandable_segments"]
    return ",".join([*options, "expandable_segments:True"] if expandable_segments else options)


#: ``/proc/cpuinfo`` flags of the instructions that compute in bfloat16 (x86: AVX512-BF16, AMX-BF16; Arm: BF16).
BFLOAT16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_has_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this CPU has bfloat16 instructions (:data:`BFLOAT16_FLAGS` among its ``flags``/``Features``).

    Without them torch computes a bfloat16 matmul through conversions: measured on an AMD EPYC with AVX2 only
    (torch 2.13), a bfloat16 training step of the built-in model took 17.7 s against 2.4 s in float32
    (``benchmarks/stability/validity_block.py``), and a lone 512x576x1536 matmul 5-100x longer.

    Returns:
        True or False; None when ``cpuinfo`` cannot be read or lists no flags (not Linux), so that nothing is claimed.
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & BFLOAT16_FLAGS) if flags else None


def device_kind() -> str:
    """The memory kind of the trials this machine runs: ``cuda_max_reserved`` when a GPU is visible, else
    ``cpu_peak_rss`` (as the trial process measures it, :func:`cuda_visible`)."""
    return "cuda_max_reserved" if cuda_visible() else "cpu_peak_rss"
