"""What Optuna is told about a sweep: the searched keys as distributions, the sampler, and the constraint that
marks a NaN or OOM trial infeasible."""

from __future__ import annotations

import warnings
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

from sweeper.space import Categorical, SearchSpace, StudySpec
from sweeper.trial import TrialStatus


def to_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna distributions of the searched keys (fixed keys are not parameters)."""
    out: dict[str, BaseDistribution] = {}
    for key, dim in space.search.items():
        if isinstance(dim, Categorical):
            out[key] = CategoricalDistribution(list(dim.choices))
        elif dim.is_int:
            out[key] = IntDistribution(int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1))
        else:
            out[key] = FloatDistribution(dim.low, dim.high, log=dim.log, step=dim.step)
    return out


#: Name of the constraint a NaN/OOM trial violates (optuna ``Trial.set_constraint``).
FAILURE_CONSTRAINT = "not_nan_or_oom"


def failure_constraint(status: str) -> float:
    """Constraint value of a trial: 1.0 (infeasible) when PRUNED as nan/oom/predicted_oom/dominated_oom, else -1.0.

    Optuna's TPE sorts infeasible trials behind every feasible one when it splits trials into good and bad
    (``optuna/samplers/_tpe/sampler.py``, ``_split_trials``), and NSGA-II ranks them last, so the sampler learns to
    avoid the region of a NaN or an OOM even though such a trial has no objective values.
    """
    try:
        return 1.0 if TrialStatus(status).pruned else -1.0
    except ValueError:  # not a status sweeper knows: not a result about the configuration
        return -1.0


def set_failure_constraint(trial: optuna.Trial | Any, status: str) -> None:
    """Mark ``trial`` infeasible (its :data:`FAILURE_CONSTRAINT` 1.0) when ``status`` is a NaN or an OOM, else
    feasible (-1.0): :func:`failure_constraint`, stored with ``Trial.set_constraint``."""
    trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(status))


def n_startup_trials(n_trials: int) -> int:
    """Random trials before TPE models the space: a quarter of the study, between 3 and 10 (optuna's default).

    A short study (the demo's 10 trials) should still spend most trials learning; a long one keeps optuna's 10.
    """
    return max(3, min(10, n_trials // 4))


def make_sampler(spec: StudySpec, n_trials: int, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The study's sampler: TPE (multivariate, constant liar for parallel asks), random, or NSGA-II, seeded with
    ``seed`` (default ``spec.seed``).

    TPE learns from PRUNED trials (their :func:`failure_constraint`), which is why it is the default; NSGA-II selects
    parents from COMPLETE trials only, so NaN/OOM trials teach it nothing; random sampling learns nothing at all.
    """
    seed = spec.seed if seed is None else seed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if spec.sampler == "nsgaii":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            constant_liar=True,
            n_startup_trials=n_startup_trials(n_trials),
        )
