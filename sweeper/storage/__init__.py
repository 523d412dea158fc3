"""Where studies are kept and how sweeps share them, below what a study is (:mod:`sweeper.study`), as Optuna keeps
``optuna.storages`` below ``optuna.study``: opening a storage by its URL (SQLite, PostgreSQL, MySQL, a journal file
with its own heartbeat and lock), the locks and heartbeats between sweeps, failing the trials of a sweep that died,
the study's folder and whose it is, the checks of the disk, every use of Optuna's private API, and the names of the
attributes sweeper stores on studies and trials (:class:`StudyAttr`, :class:`TrialAttr`).
"""

from sweeper.storage._attrs import BOOKKEEPING, StudyAttr, TrialAttr
from sweeper.storage._coordination import AskLock, Heartbeat, heartbeat_interval_s, in_memory, sqlite_file, storage_file
from sweeper.storage._identity import (
    OWNER_FILE,
    check_study_dir,
    check_study_owner,
    default_storage,
    study_dir,
    study_identity,
    trial_dir,
    write_owner,
)
from sweeper.storage._journal import dashboard_storage, journal_file
from sweeper.storage._machine import check_disk, check_writable
from sweeper.storage._open import open_storage, read_storage, storage_url_of
from sweeper.storage._optuna_private import heartbeat_interval, storage_of, trial_id, unnoted_trials, wfg_hypervolume
from sweeper.storage._recovery import fail_stale_trials, retry, stale_running
from sweeper.storage._urls import redact_url

__all__ = [
    "BOOKKEEPING",
    "OWNER_FILE",
    "AskLock",
    "Heartbeat",
    "StudyAttr",
    "TrialAttr",
    "check_disk",
    "check_study_dir",
    "check_study_owner",
    "check_writable",
    "dashboard_storage",
    "default_storage",
    "fail_stale_trials",
    "heartbeat_interval",
    "heartbeat_interval_s",
    "in_memory",
    "journal_file",
    "open_storage",
    "read_storage",
    "redact_url",
    "retry",
    "sqlite_file",
    "stale_running",
    "storage_file",
    "storage_of",
    "storage_url_of",
    "study_dir",
    "study_identity",
    "trial_dir",
    "unnoted_trials",
    "wfg_hypervolume",
    "write_owner",
]
