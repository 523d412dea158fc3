"""Sweeps that outgrow one machine, in the shape of Optuna's own storage tests (8 processes on one study, exact
counts): eight `sweep run` processes, each in its own working folder as a machine of a cluster would be, on one study
in a real PostgreSQL server or in a journal file on a shared folder; two of them are killed with `kill -9` mid-trial.
Exactly n_trials trials settle, no number is lost or doubled, nothing is left RUNNING, and each killed trial is
retried once. The same with eight worker slots of two `sweep run --workers 4` on one machine, one killed. The journal
starts with the lock a writer killed mid-write leaves, which must not make the sweeps wait forever (optuna#5921); its
heartbeat finding a frozen sweep is in test_parallel.py.

On this 2-core machine (each of the eight sweeps' trials on one thread) PostgreSQL takes 63-87 s, the journal 100 s,
the worker slots 24-44 s: marked slow and cluster (and postgres where it starts a server)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.storage._journal import HeartbeatJournalStorage
from sweeper.study._snapshot import count_finished
from sweeper.testing import PASSWORD, pg_bin, start_server, sweep, tiny_space, write_space

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

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


def _running_by_sweep(url: str, name: str, study: optuna.Study | None) -> tuple[optuna.Study | None, dict[int, list]]:
    """The study (loaded once it exists, then kept: its storage re-reads the unfinished trials at every call, and a
    fresh load per poll took seconds with eight sweeps on the server, long enough to miss a victim's whole trial) and
    the numbers of the trials each sweep pid is measuring (their trial process started)."""
    if study is None:
        if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
            return None, {}  # not created yet (and loading it would create it)
        try:
            study = _load(url, name)
        except KeyError:  # the study is not created yet
            return None, {}
    running: dict[int, list] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if "worker_pid" in t.user_attrs and "sweep_pid" in t.user_attrs:
            running.setdefault(t.user_attrs["sweep_pid"], []).append(t.number)
    return study, running


def _running_in(folder: Path, name: str) -> list[int]:
    """The numbers of the trials a sweep working in ``folder`` is measuring: a trial folder whose process started
    (``worker.pid``) and has no result yet. A CI run polling the storage instead missed a victim's only trial: its
    setup had run long under eight sweeps' load, and the trial lasted less than a poll of the server."""
    trials = folder / "studies" / name / "trials"
    found = []
    for trial in trials.iterdir() if trials.is_dir() else []:
        if trial.name.isdigit() and (trial / "worker.pid").is_file() and not (trial / "result.json").exists():
            found.append(int(trial.name))
    return sorted(found)


def _sweeps_with_kills(
    tiny_model: Path, workdir: Path, url: str, name: str, *, sweeps: int = 8, workers: int = 1, victims: int = 2
) -> list[str]:
    """Run ``sweeps`` sweeps of :data:`N_TRIALS` with ``workers`` worker slots each on ``url`` (each sweep in a working
    folder of its own when ``workers`` is 1: the machines of a cluster; else all in ``workdir``: one machine), kill
    the first ``victims`` with ``kill -9`` once each measures a trial (``min(workers, 2)`` trials), and check the
    counts; returns the sweeps' logs (stdout and stderr), the killed ones first."""
    space = tiny_space(
        tiny_model,
        name=name,
        n_trials=N_TRIALS,
        search={"r": [4, 8, 16, 32, 64], "learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
    )
    space["study"]["sampler"] = "random"
    procs, folders = [], []
    for i in range(sweeps):
        folder = workdir / f"machine{i}" if workers == 1 else workdir
        folder.mkdir(exist_ok=True)
        path = write_space(folder, space)
        cmd = [sys.executable, "-m", "sweeper.cli", "run", str(path), "--storage", url, "--workers", str(workers)]
        log = open(workdir / f"sweep{i}.log", "w")  # noqa: SIM115 - closed with the process
        # eight machines' sweeps share this machine's cores: one thread each, as --workers would split them
        env = {**os.environ, "OMP_NUM_THREADS": "1"} if workers == 1 else None
        procs.append((subprocess.Popen(cmd, cwd=folder, stdout=log, stderr=subprocess.STDOUT, text=True, env=env), log))
        folders.append(folder)
    killed: dict[int, list[int]] = {}  # pid -> the numbers of the trials it was measuring when killed
    deadline = time.monotonic() + 300
    watched: optuna.Study | None = None
    while len(killed) < victims:
        assert time.monotonic() < deadline, f"the victims never started a trial (killed so far: {killed})"
        if workers == 1:  # a machine of its own: its trial folders say what it runs, read in microseconds
            by_sweep = {p.pid: _running_in(folder, name) for (p, _), folder in zip(procs[:victims], folders)}
        else:  # one folder for all: the study says which sweep runs what (a read of the storage)
            watched, by_sweep = _running_by_sweep(url, name, watched)
        for victim, _ in procs[:victims]:
            if victim.pid in killed:
                continue
            assert victim.poll() is None, "a victim ended before it started a trial"
            running = by_sweep.get(victim.pid, [])
            if len(running) >= min(workers, 2):
                victim.send_signal(signal.SIGKILL)  # mid-trial: its trial processes die with it (PR_SET_PDEATHSIG)
                victim.wait()
                killed[victim.pid] = running
        time.sleep(0.05 if workers == 1 else 0.2)
    for p, log in procs:
        p.wait(timeout=600)
        log.close()
    logs = [(workdir / f"sweep{i}.log").read_text() for i in range(sweeps)]
    for (p, _), text in list(zip(procs, logs))[victims:]:
        assert p.returncode == 0, text[-3000:]

    study = _load(url, name)
    numbers = [t.number for t in study.trials]
    assert numbers == list(range(len(numbers)))  # no number twice, none missing
    assert count_finished(study) == N_TRIALS, [(t.number, t.state, t.user_attrs.get("status")) for t in study.trials]
    assert not [t.number for t in study.trials if t.state == TrialState.RUNNING]
    # What the victims were running when killed (another sweep may have failed one before it could be read again):
    # every trial the victims left RUNNING, and nothing else, was failed as interrupted.
    lost_numbers = [t.number for t in study.trials if t.user_attrs.get("interrupted")]
    assert all(study.trials[n].user_attrs["sweep_pid"] in killed for n in lost_numbers), lost_numbers
    assert {n for numbers in killed.values() for n in numbers} <= set(lost_numbers), (killed, lost_numbers)
    said = "\n".join(logs)
    for number in lost_numbers:
        lost = study.trials[number]
        assert lost.state == TrialState.FAIL and lost.user_attrs["interrupted"] is True, lost.user_attrs
        # Its configuration runs again, once (max_retries 1): a retry the other victim was killed in is not retried
        # again, and the sweep that found it says so. Every retry names the first attempt as retry_of.
        first = lost.user_attrs.get("retry_of", number)
        chain = [t for t in study.trials if t.number == first or t.user_attrs.get("retry_of") == first]
        shown = [(t.number, t.state.name, t.user_attrs.get("status"), t.user_attrs.get("sweep_pid")) for t in chain]
        assert all(t.params == lost.params for t in chain) and len(chain) == 2, shown
        interrupted = [t.number for t in chain if t.user_attrs.get("interrupted")]
        if len(interrupted) == 1:
            assert chain[1].state.is_finished() and chain[1].state != TrialState.FAIL, shown
        then = "runs again" if "retry_of" not in lost.user_attrs else "ran 2 times and is not retried"
        assert f"trial {number}: its sweep process is gone; marked interrupted, its configuration {then}" in said, said
    survivors = {t.user_attrs["sweep_pid"] for t in study.trials if t.state == TrialState.COMPLETE}
    assert len(survivors) >= min(3, sweeps - victims), survivors  # the work was shared, not done by one sweep
    assert study.user_attrs["sweep_starts"] == sweeps
    assert not [t.number for t in study.trials if "duplicate_of" in t.user_attrs]  # each sweep samples its own seed
    return logs


@pytest.mark.postgres
def test_eight_sweeps_on_postgresql_two_killed_mid_trial(tiny_model, workdir, postgres):
    """Also: the reading commands take the URL, and its password appears nowhere (output, attributes, files)."""
    logs = _sweeps_with_kills(tiny_model, workdir, postgres.url, "cluster_pg")
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
    """On a journal that a sweep killed inside a write left locked an hour before (the symbolic link Optuna's journal
    lock is, left in place): all eight find it stale at once (older than JOURNAL_LOCK_AGE_S), exactly one of them
    breaks it, and they go on, instead of waiting forever (optuna#5921) or breaking each other's locks. (A lock whose
    holder was killed moments ago is broken after the grace period: test_coordination.py, and here the victims'.)
    Also: the reading commands take the journal by URL and by path."""
    shared = workdir / "shared"  # the shared filesystem of a cluster
    shared.mkdir()
    journal = shared / "cluster.log"
    journal.touch()
    lock = f"{journal}.lock"
    os.symlink(journal, lock)  # what JournalFileSymlinkLock.acquire leaves when its process is killed
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago), follow_symlinks=False)
    url = f"journal:///{journal}"
    logs = _sweeps_with_kills(tiny_model, workdir, url, "cluster_journal")
    # one of the eight broke it, and at most one more per victim: a victim killed inside a heartbeat's write leaves a
    # lock of its own (CI of stop 62: two breaks). Optuna's own lock let several break one lock and then hold the
    # lock at once; that race is tested round by round in test_coordination.py, and here by its two sentences.
    by_age = sum(text.count("broke a journal lock made 36") for text in logs)  # 3600 s ago and a few seconds
    breaks = by_age + sum(text.count("broke a journal lock unchanged for 30 s") for text in logs)
    assert by_age == 1 and breaks <= 1 + 2, logs[-1][-3000:]
    for said in ("taken while another sweep's was being given back", "broke this sweep's journal lock"):
        assert not [text for text in logs if said in text], said
    machine = workdir / "machine7"
    for ref in (url, str(journal)):
        report = sweep("report", ref, "--json", cwd=machine)
        assert report.returncode == 0 and '"study": "cluster_journal"' in report.stdout, report.stderr


def test_eight_workers_of_two_sweeps_on_one_machine_one_killed_mid_trial(tiny_model, workdir):
    """The same with worker slots: two `sweep run --workers 4` on one machine's SQLite study, one killed with its
    trials (each slot's trial process dies with it); the other measures exactly n_trials between them."""
    _sweeps_with_kills(tiny_model, workdir, "sqlite:///studies/cluster_workers.db", "cluster_workers", sweeps=2,
                       workers=4, victims=1)  # fmt: skip
