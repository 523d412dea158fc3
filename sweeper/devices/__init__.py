"""The machine a sweep's trials run on, read without importing torch: which device the trials use (CUDA visible or
the CPU, the GPUs a sweep may spread over, bfloat16 on this CPU), the CUDA caching allocator's settings a trial
process runs under, and the cards themselves (name, size, the cap ``memory_limit_gib: auto`` stands for).

- :mod:`~sweeper.devices._cuda`: the device kind, the visible GPUs, the allocator's environment;
- :mod:`~sweeper.devices._card`: each card's name and size, read in a short child process.

Below the trial (which caps its memory on them) and the sweep (which spreads trials over them); imports neither torch
nor optuna.
"""

from sweeper.devices._card import Card, CardError, read_cards, smallest_card
from sweeper.devices._cuda import (
    ALLOC_CONF_VAR,
    CUDA_ALLOC_CONF_VAR,
    cpu_has_bfloat16,
    cuda_alloc_conf,
    cuda_visible,
    device_kind,
    environment_alloc_conf,
    environment_expandable_segments,
    visible_gpus,
)

__all__ = [
    "ALLOC_CONF_VAR",
    "CUDA_ALLOC_CONF_VAR",
    "Card",
    "CardError",
    "cpu_has_bfloat16",
    "cuda_alloc_conf",
    "cuda_visible",
    "device_kind",
    "environment_alloc_conf",
    "environment_expandable_segments",
    "read_cards",
    "smallest_card",
    "visible_gpus",
]
