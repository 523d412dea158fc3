"""Opening a study: creating or loading the Optuna study (its objectives from
:mod:`sweeper.study._objectives`, its sampler from :mod:`sweeper.study._sampling`, its folder's ownership from
:mod:`sweeper.storage._identity`), loading the study a reading command names, and storing a trial's result as its user
attributes. SQLite by default; PostgreSQL or MySQL to share a study between machines.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler
learns to avoid their region. Timeouts, crashes and errors are FAIL. The loop that runs trials is
:mod:`sweeper.sweep._loop`.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial

from sweeper.errors import StudyError
from sweeper.space import SearchSpace, TrialConfig
from sweeper.stability import RECORDED_COMPONENTS
from sweeper.storage import (
    TrialAttr,
    claim_study,
    default_storage,
    locate_study,
    open_for_writing,
    redact_url,
)
from sweeper.study._objectives import DEFAULT_OBJECTIVES, Objective, is_sweeper_study, resolve_objectives
from sweeper.study._sampling import make_sampler, set_failure_constraint, to_distributions
from sweeper.trial import TrialResult


def open_study(
    space: SearchSpace,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    objectives: Sequence[str] | None = None,
) -> optuna.Study:
    """Create the study, or load it when it exists (``load_if_exists``).

    Args:
        space: The parsed ``space.yaml``.
        storage: The storage URL; None: the space's, else ``sqlite:///studies/<name>.db``.
        study_name: The study's name; None: the space's.
        n_trials: The study's size, for the sampler's random start; None: the space's ``n_trials``.
        objectives: Names of registered objectives (:mod:`sweeper.study._objectives`), in order, for a new study;
            None: the space's ``study.objectives``, else :data:`~sweeper.study._objectives.DEFAULT_OBJECTIVES`. An
            existing study keeps its own (asking for others is refused).

    Raises:
        StudyError: The storage cannot be created or written, an existing study of that name has other directions, or
            ``studies/<name>/`` holds the trials of a study of that name in another storage
            (:func:`sweeper.storage.open_for_writing`).
    """
    name = study_name or space.study.name
    url = storage or space.study.storage or default_storage(name)
    if objectives is None:
        objectives = space.study.objectives
    wanted = DEFAULT_OBJECTIVES if objectives is None else resolve_objectives(objectives, str(space.path))
    sampler = make_sampler(space.study, n_trials or space.study.n_trials)
    opened = open_for_writing(name, url)
    try:
        study = optuna.create_study(
            study_name=name,
            storage=opened,
            sampler=sampler,
            directions=[o.direction for o in wanted],
            load_if_exists=True,
        )
    except ValueError as exc:
        raise StudyError(
            f"{url}: study.name: a study '{name}' exists with other directions ({exc}); choose another --study name"
        ) from None
    if not study.metric_names and not study.trials:  # an old study without metric names keeps its instability
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([o.name for o in wanted])
    if space.study.baseline and not study.trials:  # a new study measures the space's first choices first
        study.enqueue_trial(space.first_choices(), skip_if_exists=True)
    _check_same_objectives(study, wanted if objectives is not None else None, url)
    _check_same_search(study, space, url)
    claim_study(study, url)  # its folder was checked before the study was created
    return study


def _check_same_objectives(study: optuna.Study, wanted: Sequence[Objective] | None, url: str) -> None:
    """Refuse a study that is not a sweeper study, or (``wanted``: the objectives asked for, None when none were)
    one that ranks by other objectives: a study's objectives cannot change.

    Raises:
        StudyError: One line naming the study, what it ranks by and the fix.
    """
    name = study.study_name
    if not is_sweeper_study(study):
        raise StudyError(
            f"{url}: study.name: study '{name}' is not a sweeper study (directions "
            f"{study.directions}); choose another --study name"
        )
    if wanted is not None and study.metric_names and list(study.metric_names) != [o.name for o in wanted]:
        raise StudyError(
            f"{url}: study.objectives: study '{name}' ranks by {', '.join(study.metric_names)}, not "
            f"{', '.join(o.name for o in wanted)}; a study's objectives cannot change: keep them, or start a new "
            "study (--study NAME)"
        )


def _check_same_search(study: optuna.Study, space: SearchSpace, url: str) -> None:
    """Refuse a space whose searched values differ from those the study's trials were sampled from: Optuna cannot
    change a parameter's distribution in a study (``check_distribution_compatibility``), and would fail inside
    ``ask`` after the trial was created, leaving a RUNNING trial with no parameters.

    Raises:
        StudyError: One line naming the key, the values the study was measured with, and the fix.
    """
    wanted = to_distributions(space)
    seen: dict[str, BaseDistribution] = {}
    for t in study.get_trials(deepcopy=False):
        for key, dist in t.distributions.items():
            seen.setdefault(key, dist)
    problems = []
    for key, dist in seen.items():
        if key not in wanted:
            continue
        try:
            optuna.distributions.check_distribution_compatibility(dist, wanted[key])
        except ValueError:
            problems.append(f"{key} ({_describe(dist)}; now {_describe(wanted[key])})")
    if problems:
        raise StudyError(
            f"{space.path}: search.{problems[0].split(' ')[0]}: study '{study.study_name}' in {redact_url(url)} was "
            f"measured with other values of {', '.join(problems)}; a study's searched values cannot change: keep "
            f"them, or start a new study (--study NAME)"
        )


def _describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return "choices " + ", ".join(map(str, dist.choices))
    low, high = getattr(dist, "low", None), getattr(dist, "high", None)
    return f"a range {low} to {high}"


def record_result(trial: optuna.Trial | Any, result: TrialResult, config: TrialConfig) -> None:
    """Store a result as the trial's user attributes (``docs/contract.md``): every field, the instability components
    flattened, and the trial's settings as ``config`` (the one place a config becomes a dict); and mark the trial
    infeasible for the sampler when the result is a NaN or an OOM (:func:`set_failure_constraint`)."""
    data = result.to_dict()
    measured = data.pop("instability_components") or {}
    components = {name: measured.get(name) for name in RECORDED_COMPONENTS}
    for key, value in {**data, **components, TrialAttr.CONFIG: config.to_dict()}.items():
        trial.set_user_attr(key, value)
    set_failure_constraint(trial, result.status)


def record_repeat(trial: optuna.Trial, same: FrozenTrial, reason: str) -> None:
    """Store on ``trial`` the result of ``same``, the finished trial that measured its configuration: every user
    attribute but a trial's own bookkeeping (:attr:`TrialAttr.BOOKKEEPING`: its process, host, heartbeat), marked
    :data:`TrialAttr.DUPLICATE_OF` with ``reason`` and no wall time, and the same constraint for the sampler.
    The caller tells it with ``same``'s state and values."""
    for key, value in same.user_attrs.items():
        if key not in TrialAttr.BOOKKEEPING:
            trial.set_user_attr(key, value)
    trial.set_user_attr(TrialAttr.DUPLICATE_OF, same.number)
    trial.set_user_attr(TrialAttr.REASON, reason)
    trial.set_user_attr(TrialAttr.WALL_TIME_S, 0.0)
    set_failure_constraint(trial, same.user_attrs[TrialAttr.STATUS])


def load_existing_study(ref: str) -> tuple[optuna.Study, str]:
    """The study a command names (:func:`sweeper.storage.locate_study`): a study name (``studies/<name>.db``, or
    the storage its folder names), a ``.db`` or journal ``.log`` path, or a storage URL; a path or URL must hold
    exactly one study or name one after a ``#`` (``journal:///night.log#night-2``).

    Returns:
        ``(study, storage_url)``.

    Raises:
        StudyError: No such study file or study, or the storage holds several studies (their names are listed).
    """
    storage, name, url = locate_study(ref)
    study = optuna.load_study(study_name=name, storage=storage)
    if not is_sweeper_study(study):
        raise StudyError(
            f"{redact_url(url)}: STUDY: '{name}' is not a sweeper study (objectives "
            f"{study.metric_names or [d.name.lower() for d in study.directions]}); give a study that "
            "'sweep run' made"
        )
    return study, url  # reading commands never refuse for the folder's owner (a copy is read as it is)
