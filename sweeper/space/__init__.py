"""``space.yaml``: the study, the model, the data, the fixed settings and the search dimensions, as typed, frozen
objects (:class:`SearchSpace`), and the one schema of a trial's settings (:class:`TrialConfig`).

Pure: imports neither torch nor optuna, so a space file loads and validates in milliseconds.
"""

from sweeper.space._overrides import apply_overrides
from sweeper.space._parse import load_space, parse_space
from sweeper.space._schema import (
    ATTN_IMPLEMENTATIONS,
    COMPUTE_DTYPES,
    DATA_FORMATS,
    OPTIMIZERS,
    QUANT_TYPES,
    RUN_POLICY_KEYS,
    SAMPLERS,
    Categorical,
    DatasetSpec,
    Dimension,
    KeySpec,
    MemoryRole,
    ModelSpec,
    Range,
    StudySpec,
    TrialConfig,
    memory_roles,
)
from sweeper.space._space import SearchSpace
from sweeper.space._values import TRIAL_KEYS, name_problem, parse_duration_s, yaml_value

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "COMPUTE_DTYPES",
    "DATA_FORMATS",
    "OPTIMIZERS",
    "QUANT_TYPES",
    "RUN_POLICY_KEYS",
    "SAMPLERS",
    "TRIAL_KEYS",
    "Categorical",
    "DatasetSpec",
    "Dimension",
    "KeySpec",
    "MemoryRole",
    "ModelSpec",
    "Range",
    "SearchSpace",
    "StudySpec",
    "TrialConfig",
    "apply_overrides",
    "load_space",
    "memory_roles",
    "name_problem",
    "parse_duration_s",
    "parse_space",
    "yaml_value",
]
