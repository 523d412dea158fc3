"""sweeper: a hyperparameter stability sweeper for QLoRA fine-tuning.

Short, real QLoRA runs (bitsandbytes 4-bit, peft LoRA, transformers Trainer) in an Optuna study of two objectives,
peak memory and instability; NaN and out-of-memory trials are pruned with their cause.

The public names are loaded on first use (PEP 562): importing any ``sweeper`` module loads this package first, and
the trial process, which imports only its own modules, must not load the sweep's side of a trial with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper._lazy import lazy_names

if TYPE_CHECKING:
    from sweeper.errors import DataError, ModelError, SpaceError, StudyError, SweeperError
    from sweeper.space import SearchSpace, TrialConfig, load_space, parse_space
    from sweeper.stability import InstabilityComponents, compute_instability
    from sweeper.trial import TrialResult, run_trial

#: Public name -> the module that defines it.
_HOMES = {
    "DataError": "sweeper.errors",
    "InstabilityComponents": "sweeper.stability",
    "ModelError": "sweeper.errors",
    "SearchSpace": "sweeper.space",
    "SpaceError": "sweeper.errors",
    "StudyError": "sweeper.errors",
    "SweeperError": "sweeper.errors",
    "TrialConfig": "sweeper.space",
    "TrialResult": "sweeper.trial",
    "compute_instability": "sweeper.stability",
    "load_space": "sweeper.space",
    "parse_space": "sweeper.space",
    "run_trial": "sweeper.trial",
}

__all__ = [
    "DataError",
    "InstabilityComponents",
    "ModelError",
    "SearchSpace",
    "SpaceError",
    "StudyError",
    "SweeperError",
    "TrialConfig",
    "TrialResult",
    "compute_instability",
    "load_space",
    "parse_space",
    "run_trial",
]

__version__ = "0.2.0"


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
