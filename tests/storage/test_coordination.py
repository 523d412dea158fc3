"""How sweeps that share one study coordinate, without trial processes: the ask lock (a thread lock within a process,
a file lock beside a SQLite database between processes, gone with the process that held it), asking under it (never
more than ``n_trials`` trials between several sweep processes), the heartbeat thread, and the failing of stale
trials (a sweep gone on this host, a sweep that went silent anywhere, a sweep that beats less often left alone).

Everything is real: SQLite storages in the test's folder, trials asked from Optuna studies, sweep processes (forked
processes that open the study and ask as ``sweep run`` does, :class:`sweeper.sweep._running.RunningSweep`). A trial
whose sweep went silent is made by moving its last heartbeat back in the database, as if it were a minute old,
instead of waiting out a grace period. The end-to-end tests with real trials are in test_parallel.py, test_study.py
and test_faults.py.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import socket
import sqlite3
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from sweeper.space import parse_space
from sweeper.storage._coordination import AskLock, Heartbeat
from sweeper.storage._journal import HEARTBEAT_ATTR
from sweeper.storage._optuna_private import heartbeat_interval, stale_trial_ids, storage_of, trial_id
from sweeper.storage._recovery import StaleTrial, _fail_running, fail_stale_trials, stale_running
from sweeper.study._snapshot import count_finished
from sweeper.study._storage import load_existing_study, open_study
from sweeper.sweep._callbacks import SweepStop
from sweeper.sweep._plan import SweepPlan
from sweeper.sweep._running import RunningSweep

SEARCH = {"r": [4, 8, 16, 32, 64, 128]}


def _open(url: str, n_trials: int = 4) -> optuna.Study:
    space = parse_space({"study": {"name": "s", "n_trials": n_trials}, "search": SEARCH}, "space.yaml")
    return open_study(space, url, "s", n_trials)


@pytest.fixture(scope="module")
def empty_study(tmp_path_factory) -> Path:
    """The database of an empty study ``s`` as ``sweep run`` creates it: made once a module (Optuna's tables take most
    of a second to create), copied by :func:`db`."""
    folder = tmp_path_factory.mktemp("empty-study")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # its studies/s/ folder
        _open(f"sqlite:///{folder}/s.db")
    return folder / "s.db"


@pytest.fixture
def db(empty_study, tmp_path) -> Path:
    """A copy of :func:`empty_study`'s database in the test's folder."""
    return Path(shutil.copy(empty_study, tmp_path / "s.db"))


def _sweep(url: str, n_trials: int) -> RunningSweep:
    """A sweep of study ``s`` in ``url`` as ``sweep run`` makes it, by a hand-made plan (no model: only asking)."""
    space = parse_space({"study": {"name": "s", "n_trials": n_trials}, "search": SEARCH}, "space.yaml")
    plan = SweepPlan(
        space=space,
        model_path="unused",
        study=open_study(space, url, "s", n_trials),
        storage=url,
        name="s",
        n_trials=n_trials,
        timeout_s=None,
        workers=1,
        devices=[None],
        finished_before=0,
        predict_peak_gib=lambda config: None,
    )
    return RunningSweep(plan, [])


# -- what the sweep processes below run (forked: a process of its own, without a second interpreter's imports) -----

_FORK = multiprocessing.get_context("fork")


def _hold_lock(url: str, conn: Connection) -> None:
    """Take the study's ask lock and say ``held``; on ``release`` let it go, on ``again`` take it again."""
    lock = AskLock(url, "s")
    while True:
        with lock.held():
            conn.send("held")
            conn.recv()  # release
        if conn.recv() != "again":
            return


def _ask_on_go(url: str, n_trials: int, conn: Connection) -> None:
    """Open the study as a sweep, say ``ready``, wait to be told, then ask one trial and send its number."""
    sweep = _sweep(url, n_trials)
    conn.send("ready")
    conn.recv()
    trial = sweep.ask(None)
    conn.send(None if trial is None else trial.number)


def _ask_until_stopped(url: str, n_trials: int, conn: Connection) -> None:
    """Ask, hold the trial a moment, tell it complete, until the sweep stops; send how many trials it ran."""
    sweep = _sweep(url, n_trials)
    ran = 0
    while True:
        try:
            trial = sweep.ask(None)
        except SweepStop:
            break
        if trial is None:  # the trials still needed run in another process
            time.sleep(0.02)
            continue
        time.sleep(0.02)
        sweep.study.tell(trial, [1.0, 0.5])
        ran += 1
    conn.send(ran)


def _start(target, *args: object) -> tuple[BaseProcess, Connection]:
    """Run ``target(*args, conn)`` in a forked process; returns it and this end of ``conn``."""
    here, there = _FORK.Pipe()
    proc = _FORK.Process(target=target, args=(*args, there), daemon=True)
    proc.start()
    return proc, here


def _receive(conn: Connection, proc: BaseProcess, timeout: float = 30) -> object:
    assert conn.poll(timeout), f"process {proc.pid} said nothing (exit code {proc.exitcode})"
    return conn.recv()


# -- the ask lock --------------------------------------------------------------------------------------------------


def _acquire_in_thread(lock: AskLock) -> tuple[threading.Event, threading.Event]:
    """Take ``lock`` in a thread: returns (taken, release); the thread holds it until ``release`` is set."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock.held():
            taken.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    return taken, release


def test_the_ask_lock_of_a_sqlite_study_excludes_other_processes_and_dies_with_its_holder(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"  # the lock needs no database: it is a file beside it
    lock = AskLock(url, "s")
    assert lock.kind == "file"
    holder, conn = _start(_hold_lock, url)
    assert _receive(conn, holder) == "held"
    taken, release = _acquire_in_thread(lock)
    assert not taken.wait(0.2)  # another process holds it
    conn.send("release")  # released when its holder leaves the with block
    assert taken.wait(10)
    release.set()
    conn.send("again")
    assert _receive(conn, holder) == "held"
    taken, release = _acquire_in_thread(lock)
    assert not taken.wait(0.2)
    holder.kill()  # kill -9 while it holds the lock: a dead sweep never leaves the study locked
    holder.join()
    assert taken.wait(10)
    release.set()
    assert (tmp_path / "s.db.lock").exists()


@pytest.mark.parametrize("url", ["sqlite:///{tmp}/s.db", "sqlite:///:memory:"])
def test_the_ask_lock_excludes_the_worker_threads_of_one_sweep(tmp_path, url):
    lock = AskLock(url.format(tmp=tmp_path), "s")
    assert lock.kind == ("thread" if ":memory:" in url else "file")
    counter = [0]

    def add() -> None:
        for _ in range(20):
            with lock.held():
                seen = counter[0]
                time.sleep(0.0005)  # a read-then-write that loses updates unless the lock is held
                counter[0] = seen + 1

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter[0] == 80


def test_the_ask_lock_kind_follows_the_storage():
    assert AskLock("postgresql://me:pw@127.0.0.1:1/x", "s").kind == "postgresql"  # no connection until held
    assert AskLock("mysql+pymysql://me:pw@127.0.0.1:1/x", "s").kind == "mysql"
    assert AskLock("sqlite+pysqlite:///x.db", "s").kind == "file"
    assert AskLock("sqlite:///file:x.db?mode=memory&uri=true", "s").kind == "thread"
    journal = AskLock("journal:////shared/night.log", "s")  # beside the journal, not Optuna's own <file>.lock
    assert journal.kind == "file" and journal._lock_path == Path("/shared/night.log.ask.lock")


def test_three_sweep_processes_on_one_journal_ask_exactly_n_trials(tmp_path, monkeypatch):
    """The ask lock and Optuna's journal between processes: n_trials trials, numbered without a gap."""
    monkeypatch.chdir(tmp_path)
    url = f"journal:///{tmp_path / 's.log'}"
    _open(url)
    started = [_start(_ask_until_stopped, url, 4) for _ in range(3)]
    ran = [_receive(conn, proc, 60) for proc, conn in started]
    for proc, _ in started:
        proc.join(10)
        assert proc.exitcode == 0
    study, _ = load_existing_study(str(tmp_path / "s.log"))
    assert [t.number for t in study.trials] == list(range(4)) and sum(ran) == 4
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_a_journal_trial_whose_sweep_stopped_beating_is_stale(tmp_path, monkeypatch):
    """The journal's heartbeat (sweeper's, in the journal): a RUNNING trial whose last beat is older than the grace
    period is stale, one that beat just now is not, nor one that never beat (as Optuna's RDB heartbeat)."""
    import datetime as dt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWEEPER_HEARTBEAT_INTERVAL_S", "1")  # grace: 4 s
    study = _open(f"journal:///{tmp_path / 's.log'}")
    storage = storage_of(study)
    silent, beating, never = study.ask(), study.ask(), study.ask()
    old = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=60)).isoformat()
    storage.set_trial_system_attr(trial_id(silent), HEARTBEAT_ATTR, old)
    storage.record_heartbeat(trial_id(beating))
    assert stale_trial_ids(study) == [trial_id(silent)] and trial_id(never) not in stale_trial_ids(study)
    assert heartbeat_interval(storage) == 1
    # the beats are the journal's bookkeeping: no column of the trials' table, no attribute a reader sees
    assert not [c for c in study.trials_dataframe().columns if "heartbeat" in c]
    assert all(HEARTBEAT_ATTR not in t.system_attrs for t in (*study.trials, storage.get_trial(trial_id(beating))))
    study.tell(silent, state=TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):  # a beat after the end: the thread skips it
        storage.record_heartbeat(trial_id(silent))


def test_a_journal_in_a_missing_folder_is_one_line(tmp_path):
    from sweeper.errors import StudyError

    with pytest.raises(StudyError, match=r"journal:///.*/nowhere/s\.log: study\.storage: the folder .* does not exist"):
        _open(f"journal:///{tmp_path / 'nowhere' / 's.log'}")


def test_a_sweep_asks_only_under_the_lock_and_records_who_asked(db, monkeypatch):
    url = f"sqlite:///{db}"
    monkeypatch.setenv("SWEEPER_HEARTBEAT_INTERVAL_S", "5")
    asker, conn = _start(_ask_on_go, url, 4)
    assert _receive(conn, asker) == "ready"
    reader = optuna.load_study(study_name="s", storage=url)  # Optuna's own storage: it never takes the ask lock
    with AskLock(url, "s").held():
        conn.send("go")
        time.sleep(0.2)
        assert reader.trials == []  # the sweep waits for the lock before it counts and asks
    assert _receive(conn, asker) == 0
    asker.join(10)
    assert asker.exitcode == 0
    [trial] = optuna.load_study(study_name="s", storage=url).trials
    assert trial.state == TrialState.RUNNING
    assert trial.user_attrs["sweep_pid"] == asker.pid and trial.user_attrs["sweep_host"] == socket.gethostname()
    assert trial.user_attrs["heartbeat_interval_s"] == 5  # what fail_stale_trials judges it by


def test_asking_waits_while_the_last_trials_run_and_stops_at_n_trials(db):
    sweep = _sweep(f"sqlite:///{db}", 2)
    first, second = sweep.ask(None), sweep.ask(None)
    assert first is not None and second is not None
    assert sweep.ask(None) is None  # 0 finished + 2 running: wait, do not ask a third
    sweep.study.tell(first, [1.0, 0.5])
    assert sweep.ask(None) is None  # 1 finished + 1 running
    second.set_user_attr("interrupted", True)  # an interrupted trial does not count: one more is asked
    sweep.study.tell(second, state=TrialState.FAIL)
    third = sweep.ask(None)
    assert third is not None and third.number == 2
    sweep.study.tell(third, [1.0, 0.5])
    with pytest.raises(SweepStop):
        sweep.ask(None)
    assert count_finished(sweep.study) == 2


def test_three_sweep_processes_on_one_study_ask_exactly_n_trials(db):
    url = f"sqlite:///{db}"
    started = [_start(_ask_until_stopped, url, 4) for _ in range(3)]
    ran = [_receive(conn, proc, 60) for proc, conn in started]
    for proc, _ in started:
        proc.join(10)
        assert proc.exitcode == 0
    study = optuna.load_study(study_name="s", storage=url)
    assert [t.number for t in study.trials] == list(range(4))  # no trial asked beyond n_trials
    assert all(t.state == TrialState.COMPLETE for t in study.trials) and sum(ran) == 4
    assert {t.user_attrs["sweep_pid"] for t in study.trials} <= {proc.pid for proc, _ in started}


# -- the heartbeat -------------------------------------------------------------------------------------------------


def _age_heartbeats(db: Path, seconds: int = 60) -> None:
    """Move every trial's last heartbeat ``seconds`` back, as if its sweep had been silent that long."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', ?)", (f"-{seconds} seconds",))


def _heartbeats(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM trial_heartbeats").fetchone()[0]


def _wait(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _beating(trial_id: int) -> bool:
    return any(t.name == f"heartbeat-{trial_id}" and t.is_alive() for t in threading.enumerate())


def _quick_heartbeat_study(db: Path, **engine: object) -> optuna.Study:
    """Study ``s`` in ``db`` through a storage that asks for a heartbeat every 0.2 s (grace 1 s): Optuna takes any
    positive interval, and the heartbeat thread reads it from the storage, so that the test waits fractions of a
    second."""
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{db}",
        engine_kwargs=engine or None,
        heartbeat_interval=0.2,
        grace_period=1,
    )
    return optuna.load_study(study_name="s", storage=storage)


def test_a_heartbeat_beats_until_stopped(db):
    study = _quick_heartbeat_study(db)
    trial = study.ask()
    heartbeat = Heartbeat(study._storage, trial._trial_id)
    assert _beating(trial._trial_id)
    assert _wait(lambda: _heartbeats(db) == 1)  # the first beat is at once
    _age_heartbeats(db)
    assert _wait(lambda: stale_trial_ids(study) == [])  # it beat again
    heartbeat.stop()  # returns when its thread has ended
    assert not _beating(trial._trial_id)
    _age_heartbeats(db)
    time.sleep(0.45)  # over two intervals
    assert stale_trial_ids(study) == [trial._trial_id]  # no beat since it stopped


def test_a_heartbeat_outlives_a_locked_database(db):
    """A beat that fails (here the SQLite file is locked by another writer past the storage's 0.1 s busy timeout) is
    skipped: the thread goes on and the next beat lands."""
    study = _quick_heartbeat_study(db, connect_args={"timeout": 0.1})
    trial = study.ask()
    heartbeat = Heartbeat(study._storage, trial._trial_id)
    try:
        blocker = sqlite3.connect(db, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        time.sleep(0.5)  # two beats fail meanwhile
        blocker.execute("ROLLBACK")
        blocker.close()
        assert _beating(trial._trial_id)
        _age_heartbeats(db)
        assert _wait(lambda: stale_trial_ids(study) == [])
    finally:
        heartbeat.stop()


def test_no_heartbeat_without_a_heartbeat_storage():
    study = optuna.create_study(directions=["minimize", "minimize"])  # in memory: no heartbeat
    trial = study.ask()
    heartbeat = Heartbeat(study._storage, trial._trial_id)
    assert not _beating(trial._trial_id)
    heartbeat.stop()
    assert stale_trial_ids(study) == []


# -- stale trials --------------------------------------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _running(study: optuna.Study, **attrs: object) -> optuna.Trial:
    """A trial asked as a sweep asks it, with its bookkeeping attributes, and one heartbeat recorded."""
    trial = study.ask({"r": CategoricalDistribution(SEARCH["r"])})
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    study._storage.record_heartbeat(trial._trial_id)
    return trial


def test_stale_trials_are_shown_then_failed_and_retried_once(db, monkeypatch):
    """The trials of a sweep that died on this host (its pid), of sweeps that went silent (their heartbeat, whichever
    host: one is this host's frozen process), none of a sweep that beats fresh or less often than this one."""
    monkeypatch.setenv("SWEEPER_HEARTBEAT_INTERVAL_S", "1")  # grace: 4 s
    study = _open(f"sqlite:///{db}")
    here, dead = socket.gethostname(), _dead_pid()
    gone = _running(study, sweep_host=here, sweep_pid=dead, heartbeat_interval_s=1)
    lost = _running(study, sweep_host="another-machine", sweep_pid=4242, heartbeat_interval_s=1)
    frozen = _running(study, sweep_host=here, sweep_pid=os.getpid(), heartbeat_interval_s=1)
    slower = _running(study, sweep_host="another-machine", sweep_pid=4343, heartbeat_interval_s=30)
    last = _running(study, sweep_host=here, sweep_pid=dead, retry_attempt=1, retry_of=0)  # its retries used up
    _age_heartbeats(db)
    fresh = _running(study, sweep_host="another-machine", sweep_pid=4444, heartbeat_interval_s=1)

    # What 'sweep report' shows before any sweep resumes.
    shown = stale_running(study)
    assert sorted(shown) == [gone.number, lost.number, frozen.number, last.number]
    assert shown[gone.number].startswith(f"trial {gone.number}, started ")
    assert shown[gone.number].endswith(f"its sweep (pid {dead}) is gone")
    assert "its sweep (pid 4242 on another-machine) has sent no heartbeat for over 4 s" in shown[lost.number]

    failed = fail_stale_trials(study, max_retries=1)
    assert failed == [
        StaleTrial(gone.number, "gone"),
        StaleTrial(lost.number, "lost"),
        StaleTrial(frozen.number, "lost"),
        StaleTrial(last.number, "gone", retried=False),  # said so: the sweep's note names max_retries
    ]
    trials = study.trials
    for t in (gone, lost, frozen, last):
        stored = trials[t.number]
        assert stored.state == TrialState.FAIL and stored.user_attrs["status"] == "crash"
        assert stored.user_attrs["interrupted"] is True
    assert trials[gone.number].user_attrs["reason"] == (
        f"interrupted: the sweep process (pid {dead}) stopped while this trial ran"
    )
    assert trials[lost.number].user_attrs["reason"] == (
        "lost: its sweep (pid 4242 on another-machine) sent no heartbeat for 4 s"
    )
    assert trials[slower.number].state == trials[fresh.number].state == TrialState.RUNNING
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert [(q.user_attrs["retry_of"], q.user_attrs["retry_attempt"]) for q in queued] == [
        (gone.number, 1),
        (lost.number, 1),
        (frozen.number, 1),
    ]  # none for the trial whose retries were used up
    assert [q.system_attrs["fixed_params"] for q in queued] == [t.params for t in (gone, lost, frozen)]
    # The next sweep to look finds nothing more: each stale trial is failed and retried once.
    assert fail_stale_trials(study, max_retries=1) == [] and stale_running(study) == {}
    assert len(study.trials) == len(trials)


def test_a_trial_told_meanwhile_is_not_failed(db):
    """A stale trial's own sweep tells it between another sweep's look and its failing it: nothing is done."""
    study = _open(f"sqlite:///{db}")
    trial = _running(study, sweep_host=socket.gethostname(), sweep_pid=_dead_pid())
    [seen] = study.get_trials(states=(TrialState.RUNNING,))
    study.tell(trial, [1.0, 0.5])
    assert not _fail_running(study, seen, "interrupted: test", max_retries=1)
    [told] = study.trials
    assert told.state == TrialState.COMPLETE and "status" not in told.user_attrs and told.values == [1.0, 0.5]


def test_a_dead_sweep_is_found_by_its_pid_without_heartbeats():
    study = optuna.create_study(directions=["minimize", "minimize"])  # in memory: no heartbeat
    trial = study.ask()
    trial.set_user_attr("sweep_host", socket.gethostname())
    trial.set_user_attr("sweep_pid", _dead_pid())
    other = study.ask()
    other.set_user_attr("sweep_host", "another-machine")
    other.set_user_attr("sweep_pid", 4242)
    assert fail_stale_trials(study) == [StaleTrial(trial.number, "gone")]


def test_the_dashboard_reads_a_journal_study(tmp_path, monkeypatch):
    """optuna-dashboard's own API on the journal, as `sweep dashboard journal:///...` serves it (its WSGI app)."""
    import io
    import json
    from wsgiref.util import setup_testing_defaults

    from sweeper.report._dashboard import dashboard_app
    from sweeper.storage import dashboard_storage

    monkeypatch.chdir(tmp_path)
    url = f"journal:///{tmp_path / 's.log'}"
    study = _open(url)
    study.tell(study.ask(), [1.0, 0.5])
    app = dashboard_app(dashboard_storage(url), "s")
    environ: dict = {"PATH_INFO": "/api/studies", "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[0].startswith("200"), body[:500]
    summaries = json.loads(body)["study_summaries"]
    assert [s["study_name"] for s in summaries] == ["s"]
    environ["PATH_INFO"] = f"/api/studies/{summaries[0]['study_id']}"
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    assert status[-1].startswith("200") and [t["number"] for t in json.loads(body)["trials"]] == [0], body[:500]


def test_a_trial_that_waited_for_the_same_configuration_reuses_its_result(db):
    """Two machines were asked one configuration: the later trial waits while the earlier one runs elsewhere, then
    reads the study again and reuses its result instead of measuring it a second time (its view as read at the ask
    did not hold the result: it was measured twice, found by a helper running two machines at once)."""
    from sweeper.study._storage import record_result
    from sweeper.sweep._running import settle_repeat, wait_for_same
    from sweeper.trial import TrialResult

    url = f"sqlite:///{db}"
    other, mine = _sweep(url, 4), _sweep(url, 4)
    first = other.ask(None)
    mine.study.enqueue_trial(first.params)
    second = mine.ask(None)
    assert second is not None and second.params == first.params and second.number > first.number

    def finish_elsewhere() -> None:
        time.sleep(0.5)
        config = other.space.trial_config(first.params)
        record_result(first, TrialResult.from_dict({"status": "complete", "peak_memory_gib": 1.0}), config)
        other.study.tell(first, [1.0, 0.5])

    thread = threading.Thread(target=finish_elsewhere)
    thread.start()
    assert wait_for_same(mine, second)
    thread.join()
    assert settle_repeat(mine, second, mine.view)
    told = optuna.load_study(study_name="s", storage=url).trials[second.number]
    assert told.state == TrialState.COMPLETE and told.user_attrs["duplicate_of"] == first.number


def test_a_journal_with_an_unfinished_last_line_is_cut_and_goes_on(tmp_path, monkeypatch, caplog):
    """A write that did not finish (a full disk, a killed writer) leaves a last line without its newline; Optuna's
    next append was glued onto it and made the whole journal unreadable (found by a helper filling a tmpfs). The
    next write cuts it, says so, and every trial is still there."""
    monkeypatch.chdir(tmp_path)
    url = f"journal:///{tmp_path / 's.log'}"
    study = _open(url)
    study.tell(study.ask(), [1.0, 0.5])
    journal = tmp_path / "s.log"
    with open(journal, "ab") as f:
        f.write(b'{"op_code": 4, "worker_id": "torn-writer", "trial_id": 0, "user_att')  # torn mid-write
    again = _open(url)  # a resume: reads, then writes
    again.tell(again.ask(), [2.0, 0.25])
    study, _ = load_existing_study(str(journal))
    assert [t.state for t in study.trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert journal.read_bytes().endswith(b"\n") and b"torn-writer" not in journal.read_bytes()
    assert "cut an unfinished last line (67 bytes)" in caplog.text


@pytest.mark.parametrize(
    "content, said",
    [(b"SQLite format 3\x00" + bytes(100), "an SQLite database"), (b"hello\nworld", "not a journal entry")],
)
def test_a_file_that_is_not_a_journal_is_refused_and_left_as_it_was(tmp_path, monkeypatch, content, said):
    from sweeper.errors import StudyError

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mine.log"
    path.write_bytes(content)
    # the space's key for a sweep, the command's argument for a reading command (issue 55)
    for opening, key in (
        (lambda: _open(f"journal:///{path}"), "study.storage"),
        (lambda: load_existing_study(str(path)), "STUDY"),
    ):
        with pytest.raises(StudyError, match=f": {key}: .* is not an Optuna journal \\(its first line is {said}\\)"):
            opening()
    assert path.read_bytes() == content


@pytest.mark.parametrize("url", ["journal://x.log", "journal:///", "JOURNAL:x.log"])
def test_a_journal_url_without_a_path_says_the_form(tmp_path, monkeypatch, url):
    from sweeper.errors import StudyError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(StudyError, match="study.storage: a journal is journal:/// and the file's path"):
        _open(url)
    # a reading command names its own argument, STUDY, as its other errors do (issue 68)
    from sweeper.storage._open import read_storage

    with pytest.raises(StudyError, match=r"^\S+: STUDY: a journal is journal:/// and the file's path"):
        read_storage(url)


def test_a_full_disk_under_a_journal_is_the_storage_failing(tmp_path, monkeypatch):
    """A write the journal's disk refuses is Optuna's StorageInternalError, which the CLI says in one line (it was a
    traceback of OSError)."""
    import errno

    from sweeper.cli import _storage_failure
    from sweeper.storage._journal import _JournalFile

    monkeypatch.chdir(tmp_path)
    study = _open(f"journal:///{tmp_path / 's.log'}")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # the disk refuses the write: a mock, as no disk fills up here
    with pytest.raises(optuna.exceptions.StorageInternalError) as failed:
        study.ask()
    assert isinstance(failed.value.__cause__, OSError) and isinstance(storage_of(study)._backend, _JournalFile)
    line = _storage_failure(failed.value)
    assert line is not None and "No space left on device" in line and "run the same command to resume" in line


_LOCK_HOLDER = """
import os, sys, time, warnings
warnings.simplefilter("ignore")  # optuna: a grace period under 3 s "might be too small"
from sweeper.storage._journal import _StaleSafeSymlinkLock
path, start_at = sys.argv[1], float(sys.argv[2])
lock = _StaleSafeSymlinkLock(path, grace_period=1)
while time.time() < start_at:
    time.sleep(0.001)
lock.acquire()
with open(path + ".events", "a") as f:
    f.write(f"start {os.getpid()}\\n")
time.sleep(0.2)
with open(path + ".events", "a") as f:
    f.write(f"end {os.getpid()}\\n")
lock.release()  # raises when another waiter broke this lock while it was held
"""


@pytest.mark.slow
def test_sweeps_waiting_on_a_killed_writers_journal_lock_break_it_once_and_hold_the_lock_one_at_a_time(tmp_path):
    # Optuna 5.1's symlink lock lets every waiter that judged the lock stale break it, the later ones breaking the
    # lock the first had just taken: with three waiters, two or three held it at once in 6 of 6 rounds (a CI run of
    # test_cluster: "did not possess lock"). Each round plants a killed writer's lock and starts three holders at once.
    import sys

    for round_ in range(2):
        path = tmp_path / f"r{round_}.log"
        path.write_bytes(b"")
        os.symlink(path, f"{path}.lock")  # what a sweep killed while it wrote leaves
        start_at = time.time() + 1.0
        holders = [
            subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(path), str(start_at)], stderr=subprocess.PIPE)
            for _ in range(3)
        ]
        assert [h.wait(timeout=60) for h in holders] == [0, 0, 0], [h.stderr.read() for h in holders if h.stderr]
        events = Path(f"{path}.events").read_text().split()
        pairs = list(zip(events[0::4], events[1::4], events[2::4], events[3::4]))
        assert len(events) == 12 and all(a == "start" and c == "end" and b == d for a, b, c, d in pairs), events
        assert not os.path.lexists(f"{path}.lock") and not list(tmp_path.glob("*.broken"))


@pytest.mark.parametrize("bad", [{"heartbeat_interval": 0}, {"heartbeat_interval": -30}, {"grace_period": 0}])
def test_a_journal_heartbeat_of_zero_or_negative_seconds_is_refused(tmp_path, bad):
    # as Optuna's RDBStorage refuses them (issue 56): a trial stale at once would be failed under its running sweep
    from sweeper.storage._journal import HeartbeatJournalStorage

    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        HeartbeatJournalStorage(str(tmp_path / "j.log"), **{"heartbeat_interval": 30, **bad})


def test_a_journal_with_a_garbled_entry_names_its_line(tmp_path, monkeypatch):
    # issue 55: Optuna's error named a field inside the entry ("'trial_id'"), not where in the file it is
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from sweeper.errors import StudyError

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "night.log"
    study = optuna.create_study(
        study_name="s", storage=JournalStorage(JournalFileBackend(str(path))), directions=["minimize", "minimize"]
    )
    for value in (1.0, 2.0):
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[value, value]))
    lines = path.read_bytes().splitlines(keepends=True)
    garbled = b'{"op_code":6,"worker_id":"w-1"}\n'  # an entry Optuna cannot apply: no trial named
    path.write_bytes(b"".join([*lines[:3], garbled, *lines[3:]]))
    with pytest.raises(StudyError, match=r"cannot read it as an Optuna journal at line 4 .*cut line 4 and what"):
        load_existing_study(str(path))
    # issue 68: a line that is not JSON at all was named one line late (Optuna skips a last line it cannot parse, a
    # write under way, so the prefix that ends with it read)
    path.write_bytes(b"".join([*lines[:1], b'{"op_code": 6, "worker_id\n', *lines[1:]]))
    with pytest.raises(StudyError, match=r"cannot read it as an Optuna journal at line 2 .*cut line 2 and what"):
        load_existing_study(str(path))
