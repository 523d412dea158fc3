"""sweeper: a hyperparameter stability sweeper for QLoRA fine-tuning.

Short, real QLoRA runs (bitsandbytes 4-bit, peft LoRA, transformers Trainer) in an Optuna study of two objectives,
peak memory and instability; NaN and out-of-memory trials are pruned with their cause.
"""

from sweeper.errors import DataError, ModelError, SpaceError, StudyError, SweeperError
from sweeper.space import SearchSpace, TrialConfig, load_space, parse_space
from sweeper.stability import InstabilityComponents, compute_instability
from sweeper.trial import TrialResult, run_trial

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

__version__ = "0.1.0"
