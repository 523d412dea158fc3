"""The worker slots of a sweep (``--workers N``): which GPU each slot's trials see and how many CPU threads each
takes."""

from __future__ import annotations

import os

from sweeper.devices import visible_gpus


def slot_devices(workers: int, devices: list[str] | None) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each of ``workers`` worker slots (None: leave the environment as is).

    ``devices`` given: slot i gets ``devices[i % len(devices)]``. Not given, with several workers and GPUs visible:
    the GPUs this process may use (its own ``CUDA_VISIBLE_DEVICES``, else every ``/dev/nvidiaN``), in turn. One
    worker and no ``--devices`` keeps the environment: the worker sees what the sweep sees.
    """
    if devices:
        return [devices[i % len(devices)] for i in range(workers)]
    visible = visible_gpus() if workers > 1 else []
    if visible:
        return [visible[i % len(visible)] for i in range(workers)]
    return [None] * workers


def slot_env(device: str | None, workers: int) -> dict[str, str] | None:
    """A worker slot's environment: its device in ``CUDA_VISIBLE_DEVICES``, and with several workers an equal share
    of the CPU cores in ``OMP_NUM_THREADS`` (unless set), so that N CPU trials do not each start a thread per core."""
    if device is None and workers == 1:
        return None
    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    return env
