"""One trial: a short, real QLoRA run in its own process.

The parent side (this package's public face, imported by the sweep) writes the trial's config, starts
``python -m sweeper.trial._child.worker``, enforces its timeout and maps how it ended to a :class:`TrialResult`. The
child side (:mod:`sweeper.trial._child`) is the only code that imports torch, transformers, peft and bitsandbytes.
"""

from sweeper.trial._devices import cuda_visible, visible_gpus
from sweeper.trial._launch import TrialProcess, run_trial
from sweeper.trial._result import FAIL_STATUSES, PRUNED_STATUSES, RESULT_STATUSES, Phase, TrialResult, TrialStatus

__all__ = [
    "FAIL_STATUSES",
    "PRUNED_STATUSES",
    "RESULT_STATUSES",
    "Phase",
    "TrialProcess",
    "TrialResult",
    "TrialStatus",
    "cuda_visible",
    "run_trial",
    "visible_gpus",
]
