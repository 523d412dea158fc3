"""The sweep: what runs trials on a study (:mod:`sweeper.study`), as ``optuna.study._optimize`` runs them on an
Optuna study.

- :func:`plan_sweep` checks a sweep's setup and opens its study (:class:`SweepPlan`); :func:`run_study` runs its
  trials, telling :class:`SweepCallback` objects of each (:class:`SweepEvent`), with the preflight that prunes what
  cannot fit before it runs, repeats settled without running, and retries of crashed trials;
- :func:`check_setup`: what would fail every trial, before the first;
- the long runs: :func:`confirm_trials` (``sweep confirm``: what it runs, :func:`trials_to_confirm`, the candidates
  of :func:`candidates`) and :func:`calibrate_study` (``sweep calibrate``).

It records on the study through :mod:`sweeper.study` and shares it with other sweeps through :mod:`sweeper.storage`
(locks, heartbeats, stale-trial recovery); the readers (report, export) never import it.
"""

from sweeper.sweep._callbacks import SweepCallback, SweepEvent
from sweeper.sweep._cards import with_card
from sweeper.sweep._confirm import (
    ConfirmCallback,
    candidates,
    confirm_trials,
    long_run_model_path,
    trials_to_confirm,
)
from sweeper.sweep._data_checks import check_data
from sweeper.sweep._loop import run_study
from sweeper.sweep._lr_calibration import CalibrationCallback, EdgeRun, calibrate_study
from sweeper.sweep._plan import SweepPlan, plan_sweep
from sweeper.sweep._setup_checks import check_setup

__all__ = [
    "CalibrationCallback",
    "ConfirmCallback",
    "EdgeRun",
    "SweepCallback",
    "SweepEvent",
    "SweepPlan",
    "calibrate_study",
    "candidates",
    "check_data",
    "check_setup",
    "confirm_trials",
    "long_run_model_path",
    "plan_sweep",
    "run_study",
    "trials_to_confirm",
    "with_card",
]
