"""The study: an Optuna study of the objectives declared in :mod:`sweeper.study._objectives` (by default two, minimized:
``peak_memory_gib`` and ``edge_proximity``, ``1 / stability_margin``) in an Optuna storage (SQLite by default,
PostgreSQL or MySQL to share it between machines, a journal file on a shared filesystem without a database server),
and the typed view of its stored trials that the readers (:mod:`sweeper.report`, :mod:`sweeper.export`) take. What
runs trials on it (the plan, the loop, the preflight, the long runs of ``sweep confirm`` and ``sweep calibrate``) is
:mod:`sweeper.sweep`, which writes through :mod:`sweeper.study.writing` (heartbeats and locks between sweeps, stale-
trial recovery, setups, results).

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler learns
to avoid their region. Timeouts, crashes and errors are FAIL.
"""

from sweeper.study._artifacts import artifact_store
from sweeper.study._calibration import current_calibration
from sweeper.study._confirmation import Confirmation
from sweeper.study._front import by_knee_distance, ties_on_stability
from sweeper.study._identity import check_study_owner, study_dir
from sweeper.study._journal import dashboard_storage
from sweeper.study._objectives import Objective
from sweeper.study._optuna_private import unnoted_trials
from sweeper.study._snapshot import StudyLike, StudySnapshot, snapshot
from sweeper.study._storage import load_existing_study
from sweeper.study._stored import PredictionError, StoredTrial
from sweeper.study._urls import redact_url

__all__ = [
    "Confirmation",
    "Objective",
    "PredictionError",
    "StoredTrial",
    "StudyLike",
    "StudySnapshot",
    "artifact_store",
    "by_knee_distance",
    "check_study_owner",
    "current_calibration",
    "dashboard_storage",
    "load_existing_study",
    "redact_url",
    "snapshot",
    "study_dir",
    "ties_on_stability",
    "unnoted_trials",
]
