"""Optuna's private API is used in one module (sweeper.study._optuna_private): this fails when an Optuna or
optuna-dashboard upgrade removes or renames a name it relies on, and when code elsewhere starts using one."""

import importlib
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from sweeper.study import _optuna_private as private

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", private.RELIED_ON)
def test_the_installed_optuna_still_has_what_sweeper_relies_on(name, tmp_path):
    module, _, path = name.partition(":")
    owner = importlib.import_module(module)
    head, _, attr = path.rpartition(".")
    if head:
        owner = getattr(owner, head)
    if attr in ("_storage", "_study_id", "_trial_id"):  # instance attributes: look at real objects
        study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db")
        trial = study.ask()
        study.tell(trial, 1.0)
        instance = {"Study": study, "Trial": trial, "FrozenTrial": study.trials[0]}[head]
        assert hasattr(instance, attr), f"{name}: gone from optuna {optuna.__version__}"
    else:
        assert hasattr(owner, attr), f"{name}: gone from optuna {optuna.__version__}"


def test_the_helpers_work_on_a_real_rdb_storage_with_a_heartbeat(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/h.db", heartbeat_interval=60)
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    private.record_heartbeat(private.storage_of(study), private.trial_id(trial))
    assert private.heartbeat_interval(private.storage_of(study)) == 60
    assert private.stale_trial_ids(study) == []  # it just beat
    private.fail_trial(study, study.trials[0], {"status": "crash"})
    assert study.trials[0].state == optuna.trial.TrialState.FAIL and study.trials[0].user_attrs["status"] == "crash"
    assert isinstance(private.study_system_attrs(study), dict)
    assert private.dashboard_note(private.study_system_attrs(study), private.trial_id(study.trials[0])) == ""


def test_no_other_module_uses_optuna_private_names():
    pattern = r"\._storage\b|\._study_id\b|\._trial_id\b|_get_stale_trial_ids|optuna_dashboard\._"
    found = subprocess.run(
        ["git", "grep", "-nE", pattern, "--", "sweeper"], cwd=ROOT, capture_output=True, text=True
    ).stdout.splitlines()
    others = [line for line in found if not line.startswith("sweeper/study/_optuna_private.py")]
    # Heartbeat keeps a storage and a trial id of its own under those names: not Optuna's attributes
    # and sweeper.study._storage is a module of ours
    others = [line for line in others if not re.search(r"self\._(storage|trial_id)\b|sweeper\.study\._storage", line)]
    assert others == []
