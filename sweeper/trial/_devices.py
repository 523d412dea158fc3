"""Which device the trials will use, decided without importing torch (the sweep process never imports it, and the
trial process must set its CPU memory cap before torch is loaded)."""

from __future__ import annotations

import os
from pathlib import Path


def cuda_visible() -> bool:
    """Whether a CUDA device may be used: an NVIDIA driver is present (``/dev/nvidiactl`` or
    ``/proc/driver/nvidia``) and ``CUDA_VISIBLE_DEVICES`` does not hide every device (``""`` or ``"-1"``)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
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
