"""How several sweep processes (and the worker slots of one, its threads) share one study without losing or
doubling trials.

* **The ask lock.** Counting the study's finished and running trials and asking for a new one happen under one lock,
  so N workers on M machines never start more than ``n_trials`` trials between them. Within a process it is a
  thread lock; across processes it is a lock the storage's own machine arbitrates: ``fcntl.flock`` on
  ``<db>.lock`` beside a SQLite file (one machine) or on ``<journal>.ask.lock`` beside a journal file (a shared
  filesystem: Linux's NFS client takes it as a POSIX lock the server arbitrates), ``pg_advisory_lock`` on
  PostgreSQL, ``GET_LOCK`` on MySQL.
  A lock dies with the process (file descriptor or database session), so a killed sweep never leaves it held.
* **The heartbeat.** Each running trial's sweep records Optuna's RDB heartbeat (``RDBStorage.record_heartbeat``)
  every ``heartbeat_interval_s``. A trial whose heartbeat is older than ``grace_period_s`` belongs to a sweep that
  stopped reporting (killed, frozen, its machine gone); any other sweep of the study marks it failed, ``lost``, and
  retries its configuration (:func:`sweeper.storage._recovery.fail_stale_trials`). On one machine a dead sweep is
  found at once by its pid (the trial's ``sweep_host`` and ``sweep_pid``); the heartbeat is what finds it from
  another machine, or when the process is alive but frozen.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage

from sweeper.errors import StudyError
from sweeper.storage._journal import journal_file
from sweeper.storage._optuna_private import heartbeat_interval, record_heartbeat, storage_of, trial_id

# sweeper drives the study with ask/tell and records heartbeats itself (Heartbeat); Optuna warns at every ask that
# heartbeats are meant for Study.optimize. Set once here: warnings.catch_warnings is not thread-safe.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", message=".*heartbeat_interval.*", category=optuna.exceptions.ExperimentalWarning)

#: Seconds between two heartbeats of a running trial (``SWEEPER_HEARTBEAT_INTERVAL_S`` overrides; integer >= 1).
DEFAULT_HEARTBEAT_INTERVAL_S = 30

#: A trial is lost when its last heartbeat is older than this many intervals. Optuna's default is 2; 4 leaves room
#: for a heartbeat delayed by a busy SQLite file (its busy timeout is 60 s).
GRACE_INTERVALS = 4


#: The longest heartbeat interval accepted, in seconds (a lost trial is then found after 4 hours).
MAX_HEARTBEAT_INTERVAL_S = 3600


def heartbeat_interval_s() -> int:
    """The heartbeat interval in seconds: ``SWEEPER_HEARTBEAT_INTERVAL_S`` (1 to 3600), or 30 when it is unset.

    Raises:
        StudyError: The variable is set to anything else.
    """
    raw = os.environ.get("SWEEPER_HEARTBEAT_INTERVAL_S")
    if raw is None or raw.strip() == "":
        return DEFAULT_HEARTBEAT_INTERVAL_S
    if not re.fullmatch(r"[0-9]{1,4}", raw.strip()) or not 1 <= int(raw) <= MAX_HEARTBEAT_INTERVAL_S:
        raise StudyError(
            f"SWEEPER_HEARTBEAT_INTERVAL_S: {raw!r} is not a whole number of seconds from 1 to "
            f"{MAX_HEARTBEAT_INTERVAL_S}; unset it (30 s) or give e.g. 30"
        )
    return int(raw)


def sqlite_database(url: str) -> str | None:
    """The database of a SQLite URL (``sqlite:///x.db``, ``sqlite+pysqlite:///x.db``; ``""`` or ``":memory:"`` for
    an in-memory one), or None for any other URL."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:
        return None
    return (parsed.database or "") if parsed.get_backend_name() == "sqlite" else None


def sqlite_file(url: str) -> str | None:
    """The file of a file-backed SQLite URL, or None (another database, in-memory, or a ``file:`` URI)."""
    database = sqlite_database(url)
    return database if database not in (None, "", ":memory:") and not database.startswith("file:") else None


def storage_file(url: str) -> str | None:
    """The file a file-backed storage keeps the study in (an SQLite database, a journal), or None (a server, an
    in-memory database)."""
    return sqlite_file(url) or journal_file(url)


def in_memory(url: str) -> bool:
    """Whether ``url`` is an in-memory SQLite database (one per connection: not shared between threads, gone when the
    process ends): ``sqlite://``, ``sqlite:///``, ``sqlite:///:memory:`` or a ``file:`` URI with ``mode=memory``."""
    database = sqlite_database(url)
    return database in ("", ":memory:") or (database is not None and "mode=memory" in url)


def heartbeat_kwargs() -> dict:
    """``RDBStorage`` arguments that turn Optuna's heartbeat on: the interval and its grace period, in seconds."""
    interval = heartbeat_interval_s()
    return {"heartbeat_interval": interval, "grace_period": GRACE_INTERVALS * interval}


def heartbeat_enabled(storage: BaseStorage) -> bool:
    """Whether ``storage`` records heartbeats (an RDB storage opened with :func:`heartbeat_kwargs`)."""
    return heartbeat_interval(storage) is not None


class Heartbeat:
    """Record a trial's heartbeat now and every interval until :meth:`stop` (a daemon thread).

    A storage error in the thread (the database briefly unreachable) is skipped: the next beat tries again, and
    only ``GRACE_INTERVALS`` missed beats in a row make the trial lost.
    """

    def __init__(self, storage: BaseStorage, trial_id: int):
        self._storage, self._trial_id = storage, trial_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if heartbeat_enabled(storage):
            self._interval = heartbeat_interval(storage)
            self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{trial_id}", daemon=True)
            self._thread.start()

    @classmethod
    def of(cls, study: optuna.Study, trial: optuna.Trial) -> Heartbeat:
        """The heartbeat of ``trial`` of ``study``, started."""
        return cls(storage_of(study), trial_id(trial))

    @staticmethod
    def interval_s(study: optuna.Study) -> int | None:
        """Seconds between the heartbeats of ``study``'s trials, or None when its storage records none."""
        return heartbeat_interval(storage_of(study))

    def _beat(self) -> None:
        while True:
            try:
                record_heartbeat(self._storage, self._trial_id)
            except Exception:
                pass
            if self._stop.wait(self._interval):
                return

    def stop(self) -> None:
        """Stop beating (the trial is told, or this process gives it up); returns when the thread has ended."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def lock_key(study_name: str) -> int:
    """A signed 64-bit key for the study's advisory lock (PostgreSQL's ``pg_advisory_lock`` takes a bigint)."""
    return int.from_bytes(hashlib.sha256(b"sweeper-ask:" + study_name.encode()).digest()[:8], "big", signed=True)


class AskLock:
    """The lock under which a sweep counts the study's trials and asks for a new one (see the module docstring).

    Args:
        url: The storage URL (``sqlite:///...``, ``postgresql://...``, ``mysql://...``; others get the thread
            lock only).
        study_name: The study; one lock per study.
    """

    def __init__(self, url: str, study_name: str):
        self._thread_lock = threading.Lock()
        self._url, self._name = url, study_name
        self._engine: Any = None
        scheme = url.split(":", 1)[0].split("+")[0]
        self.kind = {"postgresql": "postgresql", "mysql": "mysql"}.get(scheme, "thread")
        database = sqlite_file(url)
        if database is not None:
            self.kind, self._lock_path = "file", Path(database + ".lock")
        journal = journal_file(url)
        if journal is not None:  # beside the journal on the shared filesystem (Optuna's own lock is <file>.lock)
            self.kind, self._lock_path = "file", Path(journal + ".ask.lock")

    def _connection(self):
        if self._engine is None:
            import sqlalchemy
            from sqlalchemy.pool import NullPool

            self._engine = sqlalchemy.create_engine(self._url, poolclass=NullPool)
        return self._engine.connect()

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the body of a ``with`` statement; blocks until it is free."""
        with self._thread_lock:
            if self.kind == "file":
                try:
                    handle = open(self._lock_path, "a")  # noqa: SIM115 - held until release()
                except OSError as exc:
                    raise StudyError(
                        f"{self._lock_path}: --storage: cannot create the lock file beside the study's file "
                        f"({exc.strerror}); put it in a folder you can write"
                    ) from None
                with handle:
                    fcntl.flock(handle, fcntl.LOCK_EX)
                    try:
                        yield
                    finally:
                        fcntl.flock(handle, fcntl.LOCK_UN)
            elif self.kind in ("postgresql", "mysql"):
                import sqlalchemy

                lock, unlock, key = {
                    "postgresql": (
                        "SELECT pg_advisory_lock(:k)",
                        "SELECT pg_advisory_unlock(:k)",
                        lock_key(self._name),
                    ),
                    "mysql": ("SELECT GET_LOCK(:k, -1)", "SELECT RELEASE_LOCK(:k)", f"sweeper-{lock_key(self._name)}"),
                }[self.kind]
                with self._connection() as conn:
                    conn.execute(sqlalchemy.text(lock), {"k": key})
                    conn.commit()
                    try:
                        yield
                    finally:
                        conn.execute(sqlalchemy.text(unlock), {"k": key})
                        conn.commit()
            else:
                yield
