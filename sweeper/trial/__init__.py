"""One trial: a short, real QLoRA run in its own process.

The parent side (this package's public face, imported by the sweep) writes the trial's config, starts a trial
process (``python -m sweeper.trial._child.worker``, or forked by a zygote: :mod:`sweeper.trial._zygote`), enforces
its timeout and maps how it ended to a :class:`TrialResult`. The two sides speak a typed protocol
(:mod:`sweeper.trial._job`): a job line in, :class:`TrialProgress` lines and a done line out. The child side
(:mod:`sweeper.trial._child`) is the only code that imports torch, transformers, peft and bitsandbytes.

The names are loaded on first use (PEP 562): the trial process imports this package's modules (``_result``,
``_job``) directly, and loading the package must not load the sweep's side (``_launch``) there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper._lazy import lazy_names

if TYPE_CHECKING:
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
    "FAIL_STATUSES": "sweeper.trial._status",
    "CUDA_ALLOC_CONF_NOT_APPLICABLE": "sweeper.trial._result",
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
    "run_trial": "sweeper.trial._launch",
}

__all__ = [
    "CUDA_ALLOC_CONF_NOT_APPLICABLE",
    "FAIL_STATUSES",
    "Measures",
    "MemoryReading",
    "Provenance",
    "StressOutcome",
    "TrialProcess",
    "TrialProgress",
    "TrialResult",
    "TrialStartError",
    "TrialStatus",
    "prestart",
    "run_trial",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
