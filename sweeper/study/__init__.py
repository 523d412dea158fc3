"""The study: an Optuna study of the objectives declared in :mod:`sweeper.study._objectives` (by default two, minimized:
``peak_memory_gib`` and ``edge_proximity``, ``1 / stability_margin``), the typed view of its stored trials that the
readers (:mod:`sweeper.report`, :mod:`sweeper.export`) take, and what a sweep records on it (results, setups, the
memory calibration, the trials' artifacts), as ``optuna.study`` holds ``Study.tell``. Where it is kept and how sweeps
share it (storages by URL, locks, heartbeats, stale-trial recovery, its folder's owner) is :mod:`sweeper.storage`,
below it; what runs trials on it (the plan, the loop, the preflight, the long runs) is :mod:`sweeper.sweep`, above.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler learns
to avoid their region. Timeouts, crashes and errors are FAIL.
"""

from sweeper.study._artifacts import artifact_store, loss_curve_svg, upload_trial_artifacts
from sweeper.study._calibration import (
    store_baseline,
    stored_calibration,
    update_calibration,
)
from sweeper.study._confirmation import Confirmation
from sweeper.study._front import by_knee_distance, ties_on_stability
from sweeper.study._objectives import Objective, study_objectives
from sweeper.study._sampling import make_sampler, to_distributions
from sweeper.study._setups import run_setup
from sweeper.study._snapshot import StudyLike, StudySnapshot, count_finished, snapshot, stored_trials
from sweeper.study._storage import load_existing_study, open_study, record_repeat, record_result
from sweeper.study._stored import PredictionError, StoredTrial, stored_trial

__all__ = [
    "Confirmation",
    "Objective",
    "PredictionError",
    "StoredTrial",
    "StudyLike",
    "StudySnapshot",
    "artifact_store",
    "by_knee_distance",
    "load_existing_study",
    "loss_curve_svg",
    "make_sampler",
    "open_study",
    "record_repeat",
    "record_result",
    "run_setup",
    "snapshot",
    "store_baseline",
    "stored_calibration",
    "stored_trial",
    "study_objectives",
    "ties_on_stability",
    "to_distributions",
    "update_calibration",
    "upload_trial_artifacts",
]
