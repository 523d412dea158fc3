"""One trial: a short, real QLoRA run in its own process.

The parent side (this package's public face, imported by the sweep) writes the trial's config, starts a trial
process (``python -m sweeper.trial._child.worker``, or forked by a zygote: :mod:`sweeper.trial._zygote`), enforces
its timeout and maps how it ended to a :class:`TrialResult`. The two sides speak a typed protocol
(:mod:`sweeper.trial._job`): a job line in, :class:`TrialProgress` lines and a done line out. The child side
(:mod:`sweeper.trial._child`) is the only code that imports torch, transformers, peft and bitsandbytes.

The names are loaded on first use (PEP 562): the trial process imports this package's modules (``_result``,
``_devices``, ``_job``) directly, and loading the package must not load the sweep's side (``_launch``) there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper._lazy import lazy_names

if TYPE_CHECKING:
    from sweeper.trial._card import Card, CardError, read_cards, smallest_card
    from sweeper.trial._devices import (
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
    from sweeper.trial._job import Measures, TrialProgress
    from sweeper.trial._launch import TrialProcess, TrialStartError, prestart, run_trial
    from sweeper.trial._result import (
        CUDA_ALLOC_CONF_NOT_APPLICABLE,
        MemoryReading,
        Provenance,
        StressOutcome,
        TrialResult,
    )
    from sweeper.trial._status import FAIL_STATUSES, TrialStatus

#: Public name -> the module that defines it.
_HOMES = {
    "Card": "sweeper.trial._card",
    "CardError": "sweeper.trial._card",
    "read_cards": "sweeper.trial._card",
    "smallest_card": "sweeper.trial._card",
    "FAIL_STATUSES": "sweeper.trial._status",
    "CUDA_ALLOC_CONF_NOT_APPLICABLE": "sweeper.trial._result",
    "CUDA_ALLOC_CONF_VAR": "sweeper.trial._devices",
    "ALLOC_CONF_VAR": "sweeper.trial._devices",
    "MemoryReading": "sweeper.trial._result",
    "Provenance": "sweeper.trial._result",
    "StressOutcome": "sweeper.trial._result",
    "TrialProcess": "sweeper.trial._launch",
    "TrialStartError": "sweeper.trial._launch",
    "prestart": "sweeper.trial._launch",
    "TrialProgress": "sweeper.trial._job",
    "Measures": "sweeper.trial._job",
    "TrialResult": "sweeper.trial._result",
    "TrialStatus": "sweeper.trial._status",
    "cpu_has_bfloat16": "sweeper.trial._devices",
    "cuda_alloc_conf": "sweeper.trial._devices",
    "cuda_visible": "sweeper.trial._devices",
    "device_kind": "sweeper.trial._devices",
    "environment_alloc_conf": "sweeper.trial._devices",
    "environment_expandable_segments": "sweeper.trial._devices",
    "run_trial": "sweeper.trial._launch",
    "visible_gpus": "sweeper.trial._devices",
}

__all__ = [
    "ALLOC_CONF_VAR",
    "CUDA_ALLOC_CONF_NOT_APPLICABLE",
    "CUDA_ALLOC_CONF_VAR",
    "FAIL_STATUSES",
    "Card",
    "CardError",
    "Measures",
    "MemoryReading",
    "Provenance",
    "StressOutcome",
    "TrialProcess",
    "TrialProgress",
    "TrialResult",
    "TrialStartError",
    "TrialStatus",
    "cpu_has_bfloat16",
    "cuda_alloc_conf",
    "cuda_visible",
    "device_kind",
    "environment_alloc_conf",
    "environment_expandable_segments",
    "prestart",
    "read_cards",
    "run_trial",
    "smallest_card",
    "visible_gpus",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
