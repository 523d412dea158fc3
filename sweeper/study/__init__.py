"""The study: an Optuna study of two minimized objectives, ``peak_memory_gib`` and ``instability``, in an RDB storage
(SQLite by default, PostgreSQL or MySQL to share it between machines); the typed view of its stored trials; the run
loop that fills it; stale-trial recovery and coordination between sweeps; and the preflight that prunes what cannot
fit.

Trials that go NaN or run out of memory are told as PRUNED (with their cause in the user attributes) and are marked
infeasible with ``Trial.set_constraint``; TPE sorts infeasible trials behind every feasible one, so the sampler
learns to avoid their region. Timeouts, crashes and errors are FAIL.
"""

from sweeper.study._artifacts import artifact_dir, artifact_store, loss_curve_svg, upload_trial_artifacts
from sweeper.study._calibration import (
    CALIBRATION_ATTR,
    CORRECTED_ATTR,
    calibration_points,
    device_kind,
    prediction_errors,
    stored_calibration,
    update_calibration,
)
from sweeper.study._confirm import candidates, confirm_trials, horizon, long_config
from sweeper.study._coordination import heartbeat_interval_s, in_memory
from sweeper.study._loop import MAX_CONSECUTIVE_DUPLICATES, SweepCallback, SweepEvent, find_duplicate, run_study
from sweeper.study._machine import check_disk, check_writable, slot_devices, slot_env
from sweeper.study._plan import SweepPlan, plan_sweep
from sweeper.study._preflight import known_memory, trial_device
from sweeper.study._recovery import StaleTrial, fail_stale_trials, retry
from sweeper.study._setup_checks import check_setup
from sweeper.study._storage import (
    FAILURE_CONSTRAINT,
    OBJECTIVES,
    STUDIES_DIR,
    default_storage,
    failure_constraint,
    load_existing_study,
    make_sampler,
    open_study,
    record_result,
    redact_url,
    study_dir,
    to_distributions,
    trial_dir,
)
from sweeper.study._stored import (
    Confirmation,
    StoredTrial,
    TrialStatus,
    by_knee_distance,
    confirmations,
    count_finished,
    is_finished,
    legacy_instability_trials,
    legacy_instability_warning,
    measured_trials,
    nan_causes,
    pareto_front,
    status_counts,
    stored_trial,
    stored_trials,
)

__all__ = [
    "CALIBRATION_ATTR",
    "CORRECTED_ATTR",
    "FAILURE_CONSTRAINT",
    "MAX_CONSECUTIVE_DUPLICATES",
    "OBJECTIVES",
    "STUDIES_DIR",
    "Confirmation",
    "StaleTrial",
    "StoredTrial",
    "SweepCallback",
    "SweepEvent",
    "SweepPlan",
    "TrialStatus",
    "artifact_dir",
    "artifact_store",
    "by_knee_distance",
    "calibration_points",
    "candidates",
    "check_disk",
    "check_setup",
    "check_writable",
    "confirm_trials",
    "confirmations",
    "count_finished",
    "default_storage",
    "device_kind",
    "fail_stale_trials",
    "failure_constraint",
    "find_duplicate",
    "heartbeat_interval_s",
    "horizon",
    "in_memory",
    "is_finished",
    "known_memory",
    "legacy_instability_trials",
    "legacy_instability_warning",
    "load_existing_study",
    "long_config",
    "loss_curve_svg",
    "make_sampler",
    "measured_trials",
    "nan_causes",
    "open_study",
    "pareto_front",
    "plan_sweep",
    "prediction_errors",
    "record_result",
    "redact_url",
    "retry",
    "run_study",
    "slot_devices",
    "slot_env",
    "status_counts",
    "stored_calibration",
    "stored_trial",
    "stored_trials",
    "study_dir",
    "to_distributions",
    "trial_device",
    "trial_dir",
    "update_calibration",
    "upload_trial_artifacts",
]
