"""A study written by sweeper 0.1.0 (commit ffcd872, ``tests/fixtures/study_v010.db``) still opens: ``sweep report``,
``sweep export`` and ``sweep dashboard`` read it, and ``sweep run --n-trials N+1`` resumes it without touching its
trials.

These tests use only the command line and the storage file (read with plain Optuna), never sweeper's modules, so
they hold across moves of the package's internals. The command is the installed ``sweep`` console script (what a
user runs), or ``python -m sweeper.cli`` where it is not installed. See ``tests/fixtures/README.md`` for how the
fixture was made."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import optuna
import pytest
from conftest import write_space
from optuna.trial import TrialState

FIXTURES = Path(__file__).parent / "fixtures"
FIXTURE_DB = FIXTURES / "study_v010.db"
FIXTURE_SPACE = FIXTURES / "study_v010.yaml"
NAME = "v010"
#: The fixture's trials: number -> (state, ``status`` user attribute); #5 repeats #0 (``duplicate_of``).
FIXTURE_TRIALS = {
    0: (TrialState.COMPLETE, "complete"),
    1: (TrialState.COMPLETE, "complete"),
    2: (TrialState.PRUNED, "nan"),
    3: (TrialState.PRUNED, "oom"),
    4: (TrialState.PRUNED, "dominated_oom"),
    5: (TrialState.COMPLETE, "complete"),
    6: (TrialState.COMPLETE, "complete"),
}
#: Trials that count toward n_trials (every one but the repeat #5): the study was run with n_trials 6.
FIXTURE_FINISHED = 6
FRONT = {0, 1}


def _sweep_command() -> list[str]:
    script = Path(sys.executable).with_name("sweep")
    if script.is_file():
        return [sys.executable, str(script)]
    return [sys.executable, "-m", "sweeper.cli"]


def sweep(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``sweep ARGS`` in ``cwd`` as a user would, with this environment (``PYTHONPATH`` included)."""
    return subprocess.run(
        [*_sweep_command(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ}
    )


@pytest.fixture
def old_study(workdir) -> Path:
    """The fixture copied to ``studies/v010.db`` in an empty working directory (the copy is what gets written)."""
    (workdir / "studies").mkdir()
    shutil.copyfile(FIXTURE_DB, workdir / "studies" / f"{NAME}.db")
    return workdir


def _load(workdir: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=NAME, storage=f"sqlite:///{workdir / 'studies' / f'{NAME}.db'}")


def _counts(trial) -> bool:
    """Counts toward n_trials, as sweeper 0.1.0 counts: ended, not interrupted, retried or a repeat."""
    a = trial.user_attrs
    return (
        trial.state.is_finished()
        and not a.get("interrupted", False)
        and not a.get("retried", False)
        and "duplicate_of" not in a
    )


def test_fixture_holds_every_kind_of_trial(old_study):
    trials = _load(old_study).trials
    assert {t.number: (t.state, t.user_attrs["status"]) for t in trials} == FIXTURE_TRIALS
    assert trials[5].user_attrs["duplicate_of"] == 0 and trials[5].values == trials[0].values
    assert trials[2].user_attrs["nan_cause"] == "data"
    assert sum(_counts(t) for t in trials) == FIXTURE_FINISHED


def test_report(old_study):
    out = sweep("report", NAME, cwd=old_study)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Pareto front" in out.stdout
    for needle in ("complete 3", "nan 1 (data 1)", "oom 1", "dominated_oom 1", "repeated 1"):
        assert needle in out.stdout, (needle, out.stdout)
    front_rows = [line.split() for line in out.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert {int(row[0]) for row in front_rows if len(row) > 5} >= FRONT, out.stdout
    assert (old_study / "studies" / NAME / "report.html").is_file()
    # Its instabilities are sweeper 0.1.0's (the training loss's spikes), not the probe's: the report says so.
    assert "WARNING instability: 3 trials of this study (0, 1, 6) measured it with sweeper 0.1.0" in out.stdout
    # no headroom was measured in 0.1.0: the safe pick says so, not "took the most headroom (-), near its edge"
    [safe] = [line for line in out.stdout.splitlines() if line.strip().startswith("safe #")]
    assert safe.endswith("no trial has a measured headroom (a study written before the stress phase): took the least "
                         "memory"), safe  # fmt: skip
    assert "most headroom" not in out.stdout


def test_report_json(old_study):
    out = sweep("report", NAME, "--json", cwd=old_study)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["study"] == NAME
    assert {p["number"] for p in data["front"]} == FRONT
    by_number = {t["number"]: t for t in data["trials"]}
    measured = {n for n in FIXTURE_TRIALS if n != 5}  # the repeat may or may not be listed
    assert measured <= set(by_number) <= set(FIXTURE_TRIALS), sorted(by_number)
    for n in measured:
        assert by_number[n]["status"] == FIXTURE_TRIALS[n][1], by_number[n]
    assert data["status_counts"] == {"complete": 3, "nan": 1, "oom": 1, "dominated_oom": 1, "repeated": 1}
    assert data["nan_causes"] == {"data": [2]}


@pytest.mark.parametrize("fmt", ["hf", "json"])
def test_export_the_knee(old_study, fmt):
    exports = old_study / "studies" / NAME / "exports"
    out = sweep("export", NAME, "--pick", "knee", "--format", fmt, cwd=old_study)
    assert out.returncode == 0, out.stdout + out.stderr
    written = sorted(p for p in exports.iterdir() if p.is_file()) if exports.is_dir() else []
    assert written, out.stdout
    assert all(p.stat().st_size > 0 for p in written)
    if fmt == "json":
        [path] = written
        data = json.loads(path.read_text())
        assert data["provenance"]["study"] == NAME and data["provenance"]["trial"] in FRONT
    else:
        assert any(p.suffix == ".py" for p in written), written
        source = next(p for p in written if p.suffix == ".py").read_text()
        compile(source, "export.py", "exec")  # valid Python
        assert "BitsAndBytesConfig" in source and "LoraConfig" in source


def test_a_copy_beside_itself_is_refused_and_its_folder_read_only_from_its_project(old_study):
    """Sweeper 0.1 wrote no owner file into ``studies/v010/``: the folder is the database's beside it of its name. A
    copy of the database beside it (``studies/v010-copy.db``) would write its trial folders into the original's; and
    a reading command run from another folder would write the study's files apart from its trials. Both refused,
    each in one line; the original still reads."""
    (old_study / "studies" / NAME / "trials" / "0").mkdir(parents=True)  # what 0.1's sweep run left beside it
    copy = old_study / "studies" / f"{NAME}-copy.db"
    shutil.copyfile(old_study / "studies" / f"{NAME}.db", copy)
    out = sweep("export", f"sqlite:///studies/{copy.name}", "--format", "json", cwd=old_study)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stdout + out.stderr
    [line] = out.stderr.strip().splitlines()
    assert f"studies/{NAME}/ holds the trials" in line and "written by sweeper 0.1" in line, line
    assert not (old_study / "studies" / NAME / "exports").exists()
    elsewhere = old_study / "elsewhere"
    elsewhere.mkdir()
    out = sweep("export", f"sqlite:///{old_study / 'studies' / f'{NAME}.db'}", "--format", "json", cwd=elsewhere)
    assert out.returncode != 0 and f"run this command from {old_study}" in out.stderr, out.stdout + out.stderr
    assert not (elsewhere / "studies").exists()
    assert sweep("export", NAME, "--format", "json", cwd=old_study).returncode == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
    with opener.open(url, timeout=timeout) as response:
        return response.status, response.read()


def test_dashboard_serves_the_study(old_study):
    port = _free_port()
    server = subprocess.Popen(
        [*_sweep_command(), "dashboard", NAME, "--host", "127.0.0.1", "--port", str(port)],
        cwd=old_study,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"sweep dashboard exited {server.returncode}: {server.stdout.read()}"
            try:
                status, body = _get(f"http://127.0.0.1:{port}/api/studies")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert time.monotonic() < deadline, "the dashboard never answered on 127.0.0.1"
                time.sleep(0.25)
        assert status == 200
        summaries = json.loads(body)["study_summaries"]
        assert [s["study_name"] for s in summaries] == [NAME]
        status, body = _get(f"http://127.0.0.1:{port}/api/studies/{summaries[0]['study_id']}", timeout=30)
        assert status == 200
        study = json.loads(body)
        assert sorted(t["number"] for t in study["trials"]) == sorted(FIXTURE_TRIALS)
        assert _get(f"http://127.0.0.1:{port}/dashboard/")[0] == 200
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        server.stdout.close()


@pytest.mark.slow
def test_resume_adds_one_trial_and_keeps_the_old_ones(old_study, tiny_model):
    import yaml

    space = yaml.safe_load(FIXTURE_SPACE.read_text())
    assert space["study"]["name"] == NAME and space["model"]["name_or_path"] == "TINY_MODEL"
    space["model"]["name_or_path"] = str(tiny_model)
    path = write_space(old_study, space)
    before = _load(old_study).trials
    finished = sum(_counts(t) for t in before)
    assert finished == FIXTURE_FINISHED

    out = sweep("run", str(path), "--n-trials", str(finished + 1), cwd=old_study)
    assert out.returncode == 0, out.stdout + out.stderr
    resume = [line for line in out.stdout.splitlines() if line.startswith("resume")]
    assert resume and str(finished) in resume[0], out.stdout

    after = _load(old_study).trials
    assert sum(_counts(t) for t in after) == finished + 1, [(t.number, t.state, t.user_attrs) for t in after]
    assert len(after) > len(before)
    for old, new in zip(before, after):
        assert new.number == old.number and new.state == old.state and new.params == old.params
        assert new.values == old.values
        assert new.user_attrs["status"] == old.user_attrs["status"]
