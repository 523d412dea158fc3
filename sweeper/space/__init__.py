"""``space.yaml``: the study, the model, the data, the fixed settings and the search dimensions, as typed, frozen
objects (:class:`SearchSpace`), and the one schema of a trial's settings (:class:`TrialConfig`).

Pure: imports neither torch nor optuna, so a space file loads and validates in milliseconds.
"""

from sweeper.space._overrides import apply_overrides
from sweeper.space._parse import load_space, parse_space
from sweeper.space._schema import (
    MAX_STEPS,
    OPTIMIZERS,
    RUN_POLICY_KEYS,
    Categorical,
    DatasetSpec,
    ModelSpec,
    StudySpec,
    TrialConfig,
    memory_roles,
    same_rows_lengths,
)
from sweeper.space._space import SearchSpace
from sweeper.space._values import TRIAL_KEYS, name_problem, parse_duration_s, yaml_value

__all__ = [
    "MAX_STEPS",
    "OPTIMIZERS",
    "RUN_POLICY_KEYS",
    "TRIAL_KEYS",
    "Categorical",
    "DatasetSpec",
    "ModelSpec",
    "SearchSpace",
    "StudySpec",
    "TrialConfig",
    "load_space",
    "memory_roles",
    "name_problem",
    "parse_duration_s",
    "parse_space",
    "same_rows_lengths",
    "yaml_value",
]
