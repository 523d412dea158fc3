"""Several workers on one study: worker threads of one `sweep run` (--workers; a configuration asked twice is measured
once), ending with exactly n_trials finished trials; a sweep that stops sending heartbeats loses its trial to another
sweep, which retries it (eight sweeps on PostgreSQL and on a journal file, two killed: test_cluster.py). The
coordination itself (the ask lock, asking up to n_trials, heartbeats, which stale trials are failed and which left
alone) has fast tests of its own in test_coordination.py."""

import os
import re
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from sweeper.study._snapshot import count_finished
from sweeper.study._storage import load_existing_study
from sweeper.study._stored import is_finished
from sweeper.testing import sweep, tiny_space, write_space

pytestmark = pytest.mark.slow


def _intervals_overlap(trials) -> bool:
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))


def test_two_workers_run_trials_at_once_and_stop_at_n_trials(tiny_model, workdir):
    """Two worker slots of one sweep run its first two trials at once, each slot in one warm process (on the CPU: no
    --devices, which is refused where no GPU is visible).
    Its last two trials are the same configuration (queued twice; in practice a retry, or another machine asked it):
    the later one waits for the earlier one (or finds it measured) and reuses its result, and no trial process starts
    for it."""
    from sweeper.space import load_space
    from sweeper.study._storage import open_study

    space = tiny_space(tiny_model, name="par", n_trials=4, search={"r": [4, 8, 16, 32]})
    space["study"]["sampler"] = "random"
    path = write_space(workdir, space)
    queued = open_study(load_space(path))
    for r in (8, 16, 4, 4):  # both slots start at once on the first two; the last two are one configuration
        queued.enqueue_trial({"r": r})
    out = sweep("run", str(path), "--workers", "2", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "workers 2 trials at once (on the CPU" in out.stdout
    study = optuna.load_study(study_name="par", storage="sqlite:///studies/par.db")
    third, fourth = study.trials[2:4]
    assert third.params == fourth.params == {"r": 4} and third.state == TrialState.COMPLETE
    assert fourth.user_attrs["duplicate_of"] == 2 and not re.search(r"start +#3 ", out.stdout), out.stdout
    assert not (workdir / "studies" / "par" / "trials" / "3").exists()  # no trial process ever started for it
    measured = [t for t in study.trials if "duplicate_of" not in t.user_attrs]
    assert count_finished(study) == 4 and all(t.state == TrialState.COMPLETE for t in measured)
    # Each worker slot keeps one warm trial process: two processes, and every trial after a slot's first ran warm.
    assert len({t.user_attrs["worker_pid"] for t in measured}) == 2
    assert sum(bool(t.user_attrs["warm"]) for t in measured) == len(measured) - 2
    assert _intervals_overlap(measured[:2]), [(t.datetime_start, t.datetime_complete) for t in measured]
    assert all(t.user_attrs["peak_memory_gib"] > 0 for t in measured)  # each worker measured its own process


def _freeze_outside_a_write(pid: int, url: str) -> None:
    """SIGSTOP ``pid`` at a moment it holds no write lock on the study: a process frozen inside a write (its
    ``worker_pid`` attribute or a heartbeat) keeps a SQLite database locked for everyone, which is SQLite's nature,
    not what this test is about, and holds a journal's lock until Optuna forces it free (30 s). Stop it, try to take
    the lock, and if it is held let it run a moment and stop it again."""
    import sqlite3

    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        if url.startswith("journal:///"):
            if not os.path.lexists(url.removeprefix("journal:///") + ".lock"):
                return
        else:
            try:
                con = sqlite3.connect(url.removeprefix("sqlite:///"), timeout=0.2)
                con.execute("BEGIN IMMEDIATE")
                con.rollback()
                con.close()
                return
            except sqlite3.OperationalError:
                pass
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"{url} stayed locked by pid {pid}")


@pytest.mark.parametrize("backend", ["sqlite", "journal"])
def test_a_silent_sweep_loses_its_trial_to_another_by_heartbeat(tiny_model, workdir, backend):
    """A sweep frozen mid-trial (SIGSTOP: alive, so its pid says nothing) stops sending heartbeats; a second sweep
    of the study fails its trial as lost after the grace period (4 heartbeats of 1 s) and runs it again. In SQLite
    the heartbeat is Optuna's; in a journal file it is sweeper's, written into the journal."""
    space = tiny_space(tiny_model, name="hb", n_trials=2, search={"r": [4, 8]})
    path = write_space(workdir, space)
    env = {**os.environ, "SWEEPER_HEARTBEAT_INTERVAL_S": "1"}
    url = "sqlite:///studies/hb.db" if backend == "sqlite" else f"journal:///{workdir / 'hb.log'}"
    cmd = [sys.executable, "-m", "sweeper.cli", "run", str(path), "--storage", url]
    frozen = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    pid_file = workdir / "studies" / "hb" / "trials" / "0" / "worker.pid"
    deadline = time.monotonic() + 120
    while not pid_file.exists():
        assert time.monotonic() < deadline and frozen.poll() is None, "trial 0 never started"
        time.sleep(0.1)
    _freeze_outside_a_write(frozen.pid, url)
    try:
        other = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=600, env=env)
    finally:
        os.kill(frozen.pid, signal.SIGKILL)
        frozen.wait()
    assert other.returncode == 0, other.stderr
    assert "trial 0: its sweep sent no heartbeat; marked lost" in other.stdout
    study, _ = load_existing_study(url)
    lost = study.trials[0]
    assert lost.state == TrialState.FAIL and lost.user_attrs["reason"].startswith("lost: its sweep (pid")
    retries = [t for t in study.trials if t.user_attrs.get("retry_of") == 0]
    assert len(retries) == 1 and retries[0].params == lost.params and retries[0].state == TrialState.COMPLETE
    # (the retry counts, or it reuses the result of the same configuration measured meanwhile: duplicate_of)
    assert is_finished(retries[0]) or "duplicate_of" in retries[0].user_attrs
    assert count_finished(study) == 2
