"""A study in a journal file on a shared filesystem, for a cluster without a database server: Optuna's
``JournalStorage`` with its file backend (``JournalFileBackend``; Optuna's documented path for clusters on NFS, where
SQLite's locking fails: optuna#6036), given as ``--storage journal:///PATH.log``.

Optuna's journal storage has no heartbeat, so a sweep killed on another machine would leave its trial RUNNING
forever. :class:`HeartbeatJournalStorage` adds one in the journal itself: each running trial's sweep writes the time
into the trial's system attribute :data:`HEARTBEAT_ATTR` every interval (Optuna's heartbeat interface,
``BaseHeartbeat``, so the RDB path's code finds stale trials the same way), and a RUNNING trial whose last beat is
older than the grace period is stale. The beats are each machine's own clock (UTC): the machines' clocks must agree
to well within the grace period (4 intervals, 2 minutes by default), as NTP keeps them.

Optuna's journal lock (a symbolic link beside the file, ``<file>.lock``) survives a hard kill of the process holding
it; Optuna then forces it free after :data:`JOURNAL_LOCK_GRACE_S` seconds without change (optuna#5921: without a
grace period a resumed sweep waited forever).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import FrozenTrial, TrialState

from sweeper.study._optuna_private import BaseHeartbeat, trial_id

#: The URL scheme of a journal file: ``journal:///relative/path.log`` or ``journal:////absolute/path.log`` (the
#: path after ``journal:///``, as SQLite's URLs write it).
JOURNAL_SCHEME = "journal:///"

#: The trial system attribute holding its sweep's last heartbeat (ISO 8601, UTC).
HEARTBEAT_ATTR = "sweeper:heartbeat"

#: Seconds after which Optuna forces free a journal lock that has not changed (its holder was killed mid-write).
JOURNAL_LOCK_GRACE_S = 30


def journal_file(url: str) -> str | None:
    """The file of a ``journal:///PATH`` URL, or None for any other URL."""
    if not url.startswith(JOURNAL_SCHEME):
        return None
    return url[len(JOURNAL_SCHEME) :] or None


def dashboard_storage(url: str) -> str:
    """What optuna-dashboard takes for the study at ``url``: a journal's file path (it reads any file that is not
    SQLite as a journal), else the URL itself."""
    return journal_file(url) or url


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's ``JournalStorage`` on a journal file, with a heartbeat kept in the journal (see the module
    docstring).

    Args:
        path: The journal file (created when missing).
        heartbeat_interval: Seconds between a running trial's beats; None: no heartbeat (a reading command).
        grace_period: Seconds after the last beat at which a RUNNING trial is stale (required with an interval).
    """

    def __init__(self, path: str, heartbeat_interval: int | None = None, grace_period: int | None = None) -> None:
        backend = JournalFileBackend(path, lock_obj=JournalFileSymlinkLock(path, grace_period=JOURNAL_LOCK_GRACE_S))
        super().__init__(backend)
        self._heartbeat_interval = heartbeat_interval
        self._grace_period = grace_period if grace_period is not None else 2 * (heartbeat_interval or 0)
        self.path = Path(path)

    def record_heartbeat(self, trial_id: int) -> None:
        """Write the time now (UTC) as the trial's :data:`HEARTBEAT_ATTR`.

        Raises:
            optuna.exceptions.UpdateFinishedTrialError: The trial has ended.
        """
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, dt.datetime.now(dt.UTC).isoformat())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Storage ids of the study's RUNNING trials whose last beat is older than the grace period (a trial that
        never beat is left alone, as Optuna's RDB heartbeat does)."""
        if self._heartbeat_interval is None:
            return []
        now = dt.datetime.now(dt.UTC)
        stale = []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get(HEARTBEAT_ATTR)
            if isinstance(beat, str) and (now - dt.datetime.fromisoformat(beat)).total_seconds() > self._grace_period:
                stale.append(trial_id(t))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        """Seconds between beats, or None without a heartbeat."""
        return self._heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        """None: sweeper fails and retries stale trials itself (:func:`sweeper.study._recovery.fail_stale_trials`)."""
        return None
