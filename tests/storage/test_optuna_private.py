"""Optuna's private API is used in one module (sweeper.storage._optuna_private): this fails when an Optuna or
optuna-dashboard upgrade removes or renames a name it relies on, and when code elsewhere starts using one."""

import importlib
from pathlib import Path

import optuna
import pytest

from sweeper.storage import _optuna_private as private

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", private.RELIED_ON)
def test_the_installed_optuna_still_has_what_sweeper_relies_on(name, tmp_path):
    module, _, path = name.partition(":")
    owner = importlib.import_module(module)
    head, _, attr = path.rpartition(".")
    if head:
        owner = getattr(owner, head)
    if attr in ("_lock_file", "_lock_target_file"):  # set by the lock's constructor
        assert hasattr(owner(str(tmp_path / "j.log")), attr), f"{name}: gone from optuna {optuna.__version__}"
    elif attr in ("_storage", "_study_id", "_trial_id"):  # instance attributes: look at real objects
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


#: Optuna's private attributes sweeper reaches, which only ``_optuna_private`` may name.
PRIVATE_ATTRIBUTES = {"_storage", "_study_id", "_trial_id", "_get_stale_trial_ids"}


def _private_uses(path: Path) -> list[str]:
    """Where a module imports a private module of optuna or optuna-dashboard (a dotted part starting with ``_``) or
    reads one of :data:`PRIVATE_ATTRIBUTES` from anything but ``self`` (read from its syntax tree: docstrings that
    name a private module are not uses)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for module in modules:
            parts = module.split(".")
            if parts[0] in ("optuna", "optuna_dashboard") and any(p.startswith("_") for p in parts[1:]):
                found.append(f"{path.name}:{node.lineno}: import {module}")
        on_self = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES and not on_self:
            found.append(f"{path.name}:{node.lineno}: .{node.attr}")
    return found


def test_no_other_module_uses_optuna_private_names():
    uses = {path: _private_uses(path) for path in sorted((ROOT / "sweeper").rglob("*.py"))}
    # the check sees what it looks for: the one module allowed to has such uses
    assert uses.pop(ROOT / "sweeper" / "storage" / "_optuna_private.py")
    assert [use for found in uses.values() for use in found] == []


def test_the_journal_backend_writes_the_lines_optunas_own_backend_writes(tmp_path):
    # study/_journal.py re-implements JournalFileBackend.append_logs (to cut a torn last line first): an Optuna
    # change of the journal's line format must fail here, not in a cluster's journal (issue 56)
    from optuna.storages.journal import JournalFileBackend

    from sweeper.storage._journal import _JournalFile

    logs = [{"op_code": 0, "worker_id": "w-1", "study_name": "s", "directions": [1]}, {"op_code": 4, "x": [1.5, None]}]
    JournalFileBackend(str(tmp_path / "optuna.log")).append_logs(logs)
    _JournalFile(str(tmp_path / "ours.log")).append_logs(logs)
    assert (tmp_path / "ours.log").read_bytes() == (tmp_path / "optuna.log").read_bytes()
