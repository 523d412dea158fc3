"""Sweeps that outgrow one machine, in the shape of Optuna's own storage tests (8 processes on one study, exact
counts): eight `sweep run` processes, each in its own working folder as a machine of a cluster would be, on one study
in a real PostgreSQL server or in a journal file on a shared folder; two of them are killed with `kill -9` mid-trial.
Exactly n_trials trials settle, no number is lost or doubled, nothing is left RUNNING, and each killed trial is
retried once. Also: the journal's heartbeat finds a frozen sweep, and a journal lock left by a hard kill does not make
the next sweep wait forever (optuna#5921).

Eight processes on this 2-core machine take 2 to 2.5 minutes a test (PostgreSQL 119 s, the journal 150 s with its
30 s lock wait): marked slow and cluster (and postgres where it starts a server)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.study._journal import HeartbeatJournalStorage
from sweeper.study._snapshot import count_finished
from sweeper.testing import PASSWORD, pg_bin, start_server, sweep, tiny_space, write_space

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

N_SWEEPS = 8
N_TRIALS = 10


@pytest.fixture(scope="module")
def postgres(tmp_path_factory):
    if pg_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is not installed: .ci/run must install Debian's postgresql")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    server = start_server(tmp_path_factory.mktemp("pg"))
    yield server
    server.stop()


def _no_password_anywhere(workdir: Path, *texts: str) -> None:
    encoded = PASSWORD.replace("@", "%40").replace(":", "%3A")
    for text in texts:
        assert PASSWORD not in text and encoded not in text
    for path in workdir.rglob("*"):
        if path.is_file() and path.suffix != ".db":
            data = path.read_bytes()
            assert PASSWORD.encode() not in data and encoded.encode() not in data, path


def _load(url: str, name: str) -> optuna.Study:
    if url.startswith("journal:///"):
        return optuna.load_study(study_name=name, storage=HeartbeatJournalStorage(url.removeprefix("journal:///")))
    return optuna.load_study(study_name=name, storage=url)


def _running_trial_of(url: str, name: str, pid: int) -> int | None:
    """The number of the trial the sweep ``pid`` is measuring (its trial process started), or None."""
    try:
        study = _load(url, name)
    except KeyError:  # the study is not created yet
        return None
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get("sweep_pid") == pid and "worker_pid" in t.user_attrs:
            return t.number
    return None


def _eight_sweeps_two_killed(tiny_model: Path, workdir: Path, url: str, name: str) -> list[str]:
    """Run :data:`N_SWEEPS` sweeps of :data:`N_TRIALS` on ``url``, kill two mid-trial, check the counts; returns the
    sweeps' logs (stdout and stderr), the killed ones first."""
    space = tiny_space(
        tiny_model,
        name=name,
        n_trials=N_TRIALS,
        search={"r": [4, 8, 16, 32, 64], "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
    )
    space["study"]["sampler"] = "random"
    procs = []
    for i in range(N_SWEEPS):  # each in a folder of its own: the machines of a cluster share only the storage
        machine = workdir / f"machine{i}"
        machine.mkdir()
        path = write_space(machine, space)
        cmd = [sys.executable, "-m", "sweeper.cli", "run", str(path), "--storage", url]
        log = open(machine / "sweep.log", "w")  # noqa: SIM115 - closed with the process
        procs.append((subprocess.Popen(cmd, cwd=machine, stdout=log, stderr=subprocess.STDOUT, text=True), log))
    victims = [p for p, _ in procs[:2]]
    killed: dict[int, int] = {}  # pid -> the number of the trial it was measuring
    deadline = time.monotonic() + 300
    while len(killed) < len(victims):
        assert time.monotonic() < deadline, f"the victims never started a trial (killed so far: {killed})"
        for victim in victims:
            if victim.pid in killed:
                continue
            assert victim.poll() is None, "a victim ended before it started a trial"
            number = _running_trial_of(url, name, victim.pid)
            if number is not None:
                victim.send_signal(signal.SIGKILL)  # mid-trial: its trial process dies with it (PR_SET_PDEATHSIG)
                victim.wait()
                killed[victim.pid] = number
        time.sleep(0.2)
    for p, log in procs:
        p.wait(timeout=600)
        log.close()
    logs = [(workdir / f"machine{i}" / "sweep.log").read_text() for i in range(N_SWEEPS)]
    for (p, _), text in list(zip(procs, logs))[2:]:
        assert p.returncode == 0, text[-3000:]

    study = _load(url, name)
    numbers = [t.number for t in study.trials]
    assert numbers == list(range(len(numbers)))  # no number twice, none missing
    assert count_finished(study) == N_TRIALS, [(t.number, t.state, t.user_attrs.get("status")) for t in study.trials]
    assert not [t.number for t in study.trials if t.state == TrialState.RUNNING]
    for number in killed.values():
        lost = study.trials[number]
        assert lost.state == TrialState.FAIL and lost.user_attrs["interrupted"] is True, lost.user_attrs
        # Its configuration runs again, once (max_retries 1): a retry the other victim was killed in is not retried
        # again, and the sweep that found it says so. Every retry names the first attempt as retry_of.
        first = lost.user_attrs.get("retry_of", number)
        chain = [t for t in study.trials if t.number == first or t.user_attrs.get("retry_of") == first]
        shown = [(t.number, t.state.name, t.user_attrs.get("status"), t.user_attrs.get("sweep_pid")) for t in chain]
        assert all(t.params == lost.params for t in chain) and len(chain) == 2, shown
        interrupted = [t.number for t in chain if t.user_attrs.get("interrupted")]
        assert set(interrupted) <= set(killed.values()), shown  # only the kills were retried
        if len(interrupted) == 1:
            assert chain[1].state.is_finished() and chain[1].state != TrialState.FAIL, shown
    said = "\n".join(logs)
    for number in killed.values():
        then = "runs again" if "retry_of" not in study.trials[number].user_attrs else "ran 2 times and is not retried"
        assert f"trial {number}: its sweep process is gone; marked interrupted, its configuration {then}" in said, said

    survivors = {t.user_attrs["sweep_pid"] for t in study.trials if t.state == TrialState.COMPLETE}
    assert len(survivors) >= 3, survivors  # the work was shared, not done by one sweep while the others waited
    assert study.user_attrs["sweep_starts"] == N_SWEEPS
    assert not [t.number for t in study.trials if "duplicate_of" in t.user_attrs]  # each sweep samples its own seed
    return logs


@pytest.mark.postgres
def test_eight_sweeps_on_postgresql_two_killed_mid_trial(tiny_model, workdir, postgres):
    """Also: the reading commands take the URL, and its password appears nowhere (output, attributes, files)."""
    logs = _eight_sweeps_two_killed(tiny_model, workdir, postgres.url, "cluster_pg")
    machine = workdir / "machine7"
    report = sweep("report", postgres.url, cwd=machine)
    export = sweep("export", postgres.url, "--format", "json", cwd=machine)
    assert report.returncode == 0 and export.returncode == 0, report.stderr + export.stderr
    study = optuna.load_study(study_name="cluster_pg", storage=postgres.url)
    texts = [*logs, report.stdout, report.stderr, export.stdout, export.stderr, repr(study.user_attrs)]
    texts += [repr(t.user_attrs) + repr(t.system_attrs) for t in study.trials]
    assert "***@127.0.0.1" in logs[-1]
    _no_password_anywhere(workdir, *texts)


def test_eight_sweeps_on_a_journal_file_two_killed_mid_trial(tiny_model, workdir):
    """On a journal that a sweep killed inside a write left locked (the symbolic link Optuna's journal lock is, left
    in place): the sweeps wait Optuna's grace period (30 s) and go on, instead of waiting forever (optuna#5921).
    Also: the reading commands take the journal by URL and by path."""
    shared = workdir / "shared"  # the shared filesystem of a cluster
    shared.mkdir()
    journal = shared / "cluster.log"
    journal.touch()
    os.symlink(journal, f"{journal}.lock")  # what JournalFileSymlinkLock.acquire leaves when its process is killed
    url = f"journal:///{journal}"
    logs = _eight_sweeps_two_killed(tiny_model, workdir, url, "cluster_journal")
    assert any("Forcibly releasing the lock file" in text for text in logs), logs[-1][-3000:]
    machine = workdir / "machine7"
    for ref in (url, str(journal)):
        report = sweep("report", ref, "--json", cwd=machine)
        assert report.returncode == 0 and '"study": "cluster_journal"' in report.stdout, report.stderr
