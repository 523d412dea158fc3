"""What a trial process tells its sweep while a trial runs: its phase, step, last loss and peak memory so far, as
``{"progress": {...}}`` lines on the control pipe (``SWEEPER_CONTROL_FD``), the pipe its result line also travels on.

A line costs one ``os.write`` of about 150 bytes and one read of ``/proc/self/status`` (CPU) or of the CUDA
allocator's counters; lines within :data:`MIN_INTERVAL_S` of the last are skipped (a phase change is always sent), so
a trial sends at most a few lines a second whatever its step time (``benchmarks/progress_overhead.py`` measures the
cost). The parent side reads them as they come (:class:`sweeper.trial.TrialProcess`), so the pipe never fills.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from sweeper.trial._child.memory import peak_memory_gib

#: Progress lines closer together than this are skipped, unless the phase changed (seconds).
MIN_INTERVAL_S = 0.5

#: The control pipe's descriptor in a trial process served by a sweep; None when the worker runs on its own.
_fd: int | None = None
_last: tuple[float, str] = (0.0, "")
_device = "cpu"


def attach(fd: int | None, device_type: str = "cpu") -> None:
    """Send progress lines to ``fd`` (None: send nothing) and read the peak memory of ``device_type``."""
    global _fd, _device, _last
    _fd, _device, _last = fd, device_type, (0.0, "")


def set_device(device_type: str) -> None:
    """The device whose peak memory the lines carry (``cuda`` once the trial runs on a GPU)."""
    global _device
    _device = device_type


def report(phase: str, *, step: int | None = None, of: int | None = None, loss: float | None = None) -> None:
    """Tell the sweep what the trial is doing: ``phase`` (``load``, ``train``, ``stress``, ``diagnose``), the
    optimizer step done and the steps of the phase, the last step's loss, and the peak memory so far (GiB). Never
    raises: a sweep that stopped reading ends the trial by its own means."""
    global _last
    if _fd is None:
        return
    now = time.monotonic()
    if phase == _last[1] and now - _last[0] < MIN_INTERVAL_S:
        return
    _last = (now, phase)
    fields: dict[str, Any] = {"phase": phase}
    if step is not None:
        fields["step"] = step
    if of is not None:
        fields["of"] = of
    if loss is not None and math.isfinite(loss):
        fields["loss"] = round(float(loss), 6)
    try:
        fields["peak_memory_gib"] = round(peak_memory_gib(_device), 4)
        os.write(_fd, (json.dumps({"progress": fields}) + "\n").encode())
    except (OSError, RuntimeError):
        pass
