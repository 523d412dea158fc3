"""Where studies are kept and how sweeps share them, below what a study is (:mod:`sweeper.study`), as Optuna keeps
``optuna.storages`` below ``optuna.study``: opening a storage by its URL (SQLite, PostgreSQL, MySQL, a journal file
with its own heartbeat and lock), the locks and heartbeats between sweeps, failing the trials of a sweep that died,
the study's folder and whose it is, the checks of the disk, every use of Optuna's private API, and the names of the
attributes sweeper stores on studies and trials (:class:`StudyAttr`, :class:`TrialAttr`).
"""

from sweeper.storage._attrs import StudyAttr, TrialAttr
from sweeper.storage._coordination import AskLock, Heartbeat
from sweeper.storage._identity import check_study_owner, default_storage, study_dir, trial_dir
from sweeper.storage._journal import dashboard_storage
from sweeper.storage._machine import check_disk, check_writable
from sweeper.storage._optuna_private import storage_of, trial_id, unnoted_trials, wfg_hypervolume
from sweeper.storage._recovery import fail_stale_trials, retry, stale_running
from sweeper.storage._studies import BeforeRun, check_storage_url, claim_study, locate_study, open_for_writing
from sweeper.storage._urls import redact_url

__all__ = [
    "AskLock",
    "BeforeRun",
    "Heartbeat",
    "StudyAttr",
    "TrialAttr",
    "check_disk",
    "check_storage_url",
    "check_study_owner",
    "check_writable",
    "claim_study",
    "dashboard_storage",
    "default_storage",
    "fail_stale_trials",
    "locate_study",
    "open_for_writing",
    "redact_url",
    "retry",
    "stale_running",
    "storage_of",
    "study_dir",
    "trial_dir",
    "trial_id",
    "unnoted_trials",
    "wfg_hypervolume",
]
