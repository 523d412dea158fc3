"""The study's face for the code that runs trials on it (:mod:`sweeper.sweep`): opening and writing a study,
its setups, heartbeats and locks between sweeps, stale-trial recovery, the sampler, the stored attributes' names.

The readers (:mod:`sweeper.report`, :mod:`sweeper.export`) read through :mod:`sweeper.study` only; what is here is
the bookkeeping of a sweep, which Optuna keeps in ``optuna.storages`` beside ``optuna.study``.
"""

from __future__ import annotations

from sweeper.study._artifacts import loss_curve_svg, upload_trial_artifacts
from sweeper.study._calibration import device_kind, store_baseline, stored_calibration, update_calibration
from sweeper.study._confirmation import ATTEMPT_PREFIX, ATTR_PREFIX
from sweeper.study._coordination import AskLock, Heartbeat, heartbeat_interval_s, in_memory, sqlite_file
from sweeper.study._identity import OWNER_FILE, STUDY_ID_ATTR, default_storage, trial_dir
from sweeper.study._machine import check_disk, check_writable, slot_devices, slot_env
from sweeper.study._objectives import objective_values, study_objectives
from sweeper.study._optuna_private import heartbeat_interval, storage_of, trial_id
from sweeper.study._recovery import fail_stale_trials, retry
from sweeper.study._sampling import FAILURE_CONSTRAINT, failure_constraint, make_sampler, to_distributions
from sweeper.study._setups import TRIAL_SETUP_ATTR, choose_setup, stored_setups, unapplied_settings
from sweeper.study._snapshot import CARDS_ATTR, LONGEST_SAMPLE_ATTR, LR_CALIBRATION_ATTR, count_finished, stored_trials
from sweeper.study._storage import open_study, record_result
from sweeper.study._stored import CORRECTED_ATTR, TrialStatus, stored_trial

__all__ = [
    "ATTEMPT_PREFIX",
    "ATTR_PREFIX",
    "CARDS_ATTR",
    "CORRECTED_ATTR",
    "FAILURE_CONSTRAINT",
    "LONGEST_SAMPLE_ATTR",
    "LR_CALIBRATION_ATTR",
    "OWNER_FILE",
    "STUDY_ID_ATTR",
    "TRIAL_SETUP_ATTR",
    "AskLock",
    "Heartbeat",
    "TrialStatus",
    "check_disk",
    "check_writable",
    "choose_setup",
    "count_finished",
    "default_storage",
    "device_kind",
    "fail_stale_trials",
    "failure_constraint",
    "heartbeat_interval",
    "heartbeat_interval_s",
    "in_memory",
    "loss_curve_svg",
    "make_sampler",
    "objective_values",
    "open_study",
    "record_result",
    "retry",
    "slot_devices",
    "slot_env",
    "sqlite_file",
    "storage_of",
    "store_baseline",
    "stored_calibration",
    "stored_setups",
    "stored_trial",
    "stored_trials",
    "study_objectives",
    "to_distributions",
    "trial_dir",
    "trial_id",
    "unapplied_settings",
    "update_calibration",
    "upload_trial_artifacts",
]
