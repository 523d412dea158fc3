"""The study: an Optuna study of the objectives declared in :mod:`sweeper.study._objectives` (by default two,
minimized: ``peak_memory_gib`` and ``edge_proximity``, ``1 / stability_margin``) in an RDB storage (SQLite by default,
PostgreSQL or MySQL to share it between machines); the typed view of its stored trials; the run
loop that fills it; stale-trial recovery and coordination between sweeps; and the preflight that prunes what cannot
fit.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler
learns to avoid their region. Timeouts, crashes and errors are FAIL.
"""

from sweeper.study._artifacts import (
    artifact_store,
)
from sweeper.study._calibration import (
    CALIBRATION_ATTR,
    PredictionError,
    calibration_points,
    device_kind,
    prediction_errors,
    stored_calibration,
)
from sweeper.study._confirm import (
    candidates,
    confirm_trials,
)
from sweeper.study._identity import STUDIES_DIR, STUDY_ID_ATTR, check_study_owner, study_dir, study_identity, trial_dir
from sweeper.study._loop import (
    MAX_CONSECUTIVE_DUPLICATES,
    SweepCallback,
    SweepEvent,
    run_study,
)
from sweeper.study._machine import check_writable
from sweeper.study._objectives import (
    DEFAULT_OBJECTIVES,
    LEGACY_OBJECTIVES,
    Objective,
    objective,
    register_objective,
    stability_objective,
    study_objectives,
    unregister_objective,
)
from sweeper.study._optuna_private import dashboard_note, study_system_attrs, trial_id
from sweeper.study._plan import (
    SweepPlan,
    plan_sweep,
)
from sweeper.study._recovery import stale_running
from sweeper.study._sampling import FAILURE_CONSTRAINT, failure_constraint
from sweeper.study._setup_checks import (
    check_setup,
)
from sweeper.study._setups import differences
from sweeper.study._snapshot import (
    StudyLike,
    StudySnapshot,
    confirmations,
    count_finished,
    current_trials,
    learning,
    measured_trials,
    nan_causes,
    pareto_front,
    snapshot,
    status_counts,
    stored_trials,
)
from sweeper.study._storage import load_existing_study, open_study, record_result
from sweeper.study._stored import (
    OUTCOME_STATUSES,
    Confirmation,
    StoredTrial,
    by_knee_distance,
    non_dominated,
    stored_trial,
)
from sweeper.study._urls import redact_url

__all__ = [
    "CALIBRATION_ATTR",
    "DEFAULT_OBJECTIVES",
    "FAILURE_CONSTRAINT",
    "LEGACY_OBJECTIVES",
    "MAX_CONSECUTIVE_DUPLICATES",
    "OUTCOME_STATUSES",
    "STUDIES_DIR",
    "STUDY_ID_ATTR",
    "Confirmation",
    "Objective",
    "PredictionError",
    "StoredTrial",
    "StudyLike",
    "StudySnapshot",
    "SweepCallback",
    "SweepEvent",
    "SweepPlan",
    "artifact_store",
    "by_knee_distance",
    "calibration_points",
    "candidates",
    "check_setup",
    "check_study_owner",
    "check_writable",
    "confirm_trials",
    "confirmations",
    "count_finished",
    "current_trials",
    "dashboard_note",
    "device_kind",
    "differences",
    "failure_constraint",
    "learning",
    "load_existing_study",
    "measured_trials",
    "nan_causes",
    "non_dominated",
    "objective",
    "open_study",
    "pareto_front",
    "plan_sweep",
    "prediction_errors",
    "record_result",
    "redact_url",
    "register_objective",
    "run_study",
    "snapshot",
    "stability_objective",
    "stale_running",
    "status_counts",
    "stored_calibration",
    "stored_trial",
    "stored_trials",
    "study_dir",
    "study_identity",
    "study_objectives",
    "study_system_attrs",
    "trial_dir",
    "trial_id",
    "unregister_objective",
]
