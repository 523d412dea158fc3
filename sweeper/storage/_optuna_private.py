"""Every use of Optuna's (and optuna-dashboard's) private API, in one place, each with why no public API serves.

Optuna's public API (``Study``, ``Trial``, ``FrozenTrial``) has no way to reach a study's storage, a trial's storage
id, another process's trial (to fail a trial whose sweep died), the RDB heartbeat's stale list, or a study's system
attributes (where optuna-dashboard keeps notes). sweeper needs each: the functions here are the only code that
touches those names, and ``tests/storage/test_optuna_private.py`` checks that the installed Optuna still has every one
of them (:data:`RELIED_ON`), so an upgrade that moves one fails a fast test instead of a night's sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import optuna
from optuna.storages import BaseStorage

# a journal storage with a heartbeat (study/_journal.py) implements it
from optuna.storages._heartbeat import BaseHeartbeat as BaseHeartbeat
from optuna.trial import FrozenTrial


class _HasFrozen(Protocol):
    @property
    def frozen(self) -> FrozenTrial | None: ...


#: What :func:`unnoted_trials` takes and returns: a stored trial with its ``frozen`` ``FrozenTrial`` (or None).
_Stored = TypeVar("_Stored", bound=_HasFrozen)


#: ``(object, attribute)`` pairs this module reads, as ``"module:Class.attribute"``; the test imports each.
RELIED_ON = (
    "optuna.study:Study._storage",
    "optuna.study:Study._study_id",
    "optuna.trial:Trial._trial_id",
    "optuna.trial:FrozenTrial._trial_id",
    "optuna.storages:RDBStorage._get_stale_trial_ids",
    "optuna.storages:RDBStorage.get_heartbeat_interval",
    "optuna.storages:RDBStorage.record_heartbeat",
    "optuna.storages._heartbeat:BaseHeartbeat._get_stale_trial_ids",
    "optuna_dashboard._note:get_note_from_system_attrs",
    "optuna._hypervolume:compute_hypervolume",
    # study/_journal.py: its lock subclasses Optuna's symlink lock, and its backend re-implements append_logs (the
    # line format is held by tests/storage/test_optuna_private.py)
    "optuna.storages.journal:JournalFileSymlinkLock._lock_file",
    "optuna.storages.journal:JournalFileSymlinkLock._lock_target_file",
    "optuna.storages.journal:JournalFileBackend.append_logs",
)


def storage_of(study: optuna.Study) -> BaseStorage:
    """The study's storage (``Study._storage``): to fail another process's trial, record heartbeats, delete a study
    this command created, and read system attributes."""
    return study._storage


def trial_id(trial: optuna.Trial | FrozenTrial) -> int:
    """The trial's id in its storage (``_trial_id``), which storage methods take (its ``number`` is per study)."""
    return int(trial._trial_id)


def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    """The study's system attributes (``storage.get_study_system_attrs(Study._study_id)``), where optuna-dashboard
    keeps its notes."""
    return dict(study._storage.get_study_system_attrs(study._study_id))


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """The storage's heartbeat interval in seconds, or None without a heartbeat (not an RDB storage, or created
    without ``heartbeat_interval``)."""
    get = getattr(storage, "get_heartbeat_interval", None)
    return get() if get is not None else None


def record_heartbeat(storage: BaseStorage, trial_storage_id: int) -> None:
    """Record a heartbeat of the trial now (RDBStorage's, which ``Study.optimize`` would call from its thread)."""
    storage.record_heartbeat(trial_storage_id)  # type: ignore[attr-defined]


def stale_trial_ids(study: optuna.Study) -> list[int]:
    """Storage ids of the study's RUNNING trials whose heartbeat is older than the grace period (none without a
    heartbeat). Optuna's ``fail_stale_trials`` fails them without letting sweeper record why first, so the list is
    read here (``RDBStorage._get_stale_trial_ids``)."""
    storage = study._storage
    if heartbeat_interval(storage) is None:
        return []
    return list(storage._get_stale_trial_ids(study._study_id))  # type: ignore[attr-defined]


def fail_trial(study: optuna.Study, trial: FrozenTrial, user_attrs: dict[str, Any]) -> None:
    """End another process's RUNNING ``trial`` as FAIL after setting ``user_attrs`` (a study's ``tell`` only ends a
    trial this process asked for).

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: The trial had ended meanwhile.
    """
    storage = study._storage
    for key, value in user_attrs.items():
        storage.set_trial_user_attr(trial._trial_id, key, value)
    storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)


def unnoted_trials(study: optuna.Study, trials: Sequence[_Stored]) -> list[tuple[_Stored, optuna.Trial]]:
    """Those of ``trials`` (of ``study``; anything with the ``frozen`` trial it was read from, as
    :class:`sweeper.study.StoredTrial`) that carry no optuna-dashboard note yet, each with the ``optuna.Trial``
    handle that ``optuna_dashboard.save_note`` takes (built from the trial's storage id: a finished trial cannot be
    asked for again)."""
    system_attrs = study_system_attrs(study)
    out = []
    for t in trials:
        if t.frozen is None or dashboard_note(system_attrs, trial_id(t.frozen)):
            continue
        out.append((t, optuna.Trial(study, trial_id(t.frozen))))
    return out


def dashboard_note(system_attrs: dict[str, Any], trial_storage_id: int) -> str:
    """The body of optuna-dashboard's note on a trial (``optuna_dashboard._note.get_note_from_system_attrs``; the
    package has no public reader), ``""`` when it has none."""
    from optuna_dashboard._note import get_note_from_system_attrs

    return str(get_note_from_system_attrs(system_attrs, trial_storage_id)["body"])


def wfg_hypervolume(points: Any, reference: Any) -> float:
    """Optuna's ``optuna._hypervolume.compute_hypervolume`` (WFG; While et al. 2012): the hypervolume that ``points``
    (a 2-D float array, one row per point, each objective minimized, every point better than ``reference`` on every
    objective) dominate, bounded by ``reference`` (a 1-D float array). Optuna exposes no public function for it; the
    arithmetic around it (which points count, the reference point) is :mod:`sweeper.study._pareto`'s."""
    from optuna._hypervolume import compute_hypervolume

    return float(compute_hypervolume(points, reference))
