"""A study in a journal file on a shared filesystem, for a cluster without a database server: Optuna's
``JournalStorage`` with its file backend (``JournalFileBackend``; Optuna's documented path for clusters on NFS, where
SQLite's locking fails: optuna#6036), given as ``--storage journal:///PATH.log``.

Optuna's journal storage has no heartbeat, so a sweep killed on another machine would leave its trial RUNNING
forever. :class:`HeartbeatJournalStorage` adds one in the journal itself: each running trial's sweep writes the time
into the trial's system attribute :data:`HEARTBEAT_ATTR` every interval (Optuna's heartbeat interface,
``BaseHeartbeat``, so the RDB path's code finds stale trials the same way), and a RUNNING trial whose last beat is
older than the grace period is stale. The beats are each machine's own clock (UTC): the machines' clocks must agree
to well within the grace period (4 intervals, 2 minutes by default), as NTP keeps them.

Optuna's journal lock (a symbolic link beside the file, ``<file>.lock``) survives a hard kill of the process holding
it; it is forced free after :data:`JOURNAL_LOCK_GRACE_S` seconds without change (optuna#5921: without a grace period
a resumed sweep waited forever), by exactly one of the sweeps waiting on it (:class:`_StaleSafeSymlinkLock`; Optuna's
own lets each of them break it, the later ones breaking the lock the first had taken). A lock whose link was made more
than :data:`JOURNAL_LOCK_AGE_S` ago by the filesystem's clock is broken at once: a writer holds it for one write, so
it was left by a sweep killed long before (a study resumed the next morning does not wait out the grace first).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import time
import uuid
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import FrozenTrial, TrialState

from sweeper.errors import StudyError
from sweeper.storage._optuna_private import BaseHeartbeat, trial_id

#: The URL scheme of a journal file: ``journal:///relative/path.log`` or ``journal:////absolute/path.log`` (the
#: path after ``journal:///``, as SQLite's URLs write it).
JOURNAL_SCHEME = "journal:///"

#: The trial system attribute holding its sweep's last heartbeat (ISO 8601, UTC).
HEARTBEAT_ATTR = "sweeper:heartbeat"

#: Seconds after which Optuna forces free a journal lock that has not changed (its holder was killed mid-write).
JOURNAL_LOCK_GRACE_S = 30
#: Age in seconds (now less the lock link's mtime) past which a journal lock is stale at first sight: the heartbeat's
#: grace (4 intervals, 2 minutes by default), within which the machines' clocks must already agree.
JOURNAL_LOCK_AGE_S = 120


def journal_file(url: str, key: str = "study.storage") -> str | None:
    """The file of a ``journal:///PATH`` URL, or None for any other URL; ``key`` names where the URL was given in
    the error: the space's ``study.storage`` (``sweep run``) or a reading command's ``STUDY``.

    Raises:
        StudyError: A ``journal:`` URL that is not ``journal:///`` and a path (two slashes, no path).
    """
    if not url.lower().startswith("journal:"):
        return None
    path = url[len(JOURNAL_SCHEME) :] if url.startswith(JOURNAL_SCHEME) else ""
    if not path.strip("/"):
        raise StudyError(
            f"{url}: {key}: a journal is journal:/// and the file's path (journal:///studies/night.log "
            "relative to this folder, journal:////shared/night.log absolute)"
        )
    return path


def dashboard_storage(url: str) -> str:
    """What optuna-dashboard takes for the study at ``url``: a journal's file path (it reads any file that is not
    SQLite as a journal), else the URL itself."""
    return journal_file(url) or url


def check_journal(url: str, path: str, key: str = "study.storage") -> None:
    """Refuse a file that is not an Optuna journal before anything reads or writes it: an SQLite database, a text
    file, a file of another program. An empty file is a new journal. ``key`` names where the URL was given: the
    space's ``study.storage`` (``sweep run``) or a reading command's ``STUDY``.

    Raises:
        StudyError: One line naming the URL and what the file's first line is not.
    """
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
    except OSError as exc:
        raise StudyError(f"{url}: {key}: cannot read {path} ({exc.strerror})") from None
    if not first:
        return
    try:
        entry = json.loads(first)
    except ValueError:
        entry = None
    if not (isinstance(entry, dict) and "op_code" in entry and "worker_id" in entry):
        what = "an SQLite database" if first.startswith(b"SQLite format 3") else "not a journal entry"
        raise StudyError(
            f"{url}: {key}: {path} is not an Optuna journal (its first line is {what}); give the journal a "
            "sweep wrote, or a new path (journal:///PATH.log creates it)"
        )


def _drop_torn_tail(path: str) -> int:
    """Cut a last line that has no newline off the journal at ``path``: a write that did not finish (the disk
    filled up, the writer was killed). Optuna's readers skip such a line, but its next append would be glued onto it
    and make every later line unreadable. Call it holding the journal's lock.

    Returns:
        The bytes cut (0 when the file ends with a newline or is empty).
    """
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        end = size
        while end > 0:  # back to the last newline, a block at a time
            start = max(0, end - 65536)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
        f.truncate(keep)
        return size - keep


class _StaleSafeSymlinkLock(JournalFileSymlinkLock):
    """Optuna's symbolic-link journal lock, whose forced release of a stale lock breaks only the lock it judged stale.

    Optuna's ``JournalFileSymlinkLock.acquire`` frees a lock unchanged for its grace period by renaming away
    whatever lock is there: when several sweeps wait on the lock of a killed writer, all judge it stale at once, the
    first breaks it and takes the lock, and the next break that new lock, so that two or three sweeps write at once
    (``tests/storage/test_coordination.py``: 6 of 6 rounds of three waiters with Optuna 5.1's lock; CI of stop 61, "did
    not possess lock"). Here a lock is known by its link's inode and mtime (``lstat``) with the mtime of what it
    points to, the grace period runs while all three stay the same, and a breaker that renamed away a lock other
    than the one it judged (another waiter's, taken since) links it back before anything else can take the path.
    A wait interrupted (Ctrl-C) leaves the other sweep's lock alone (Optuna's releases it).
    """

    def acquire(self) -> bool:
        """Take the lock, waiting while another sweep holds it, and breaking it after :data:`JOURNAL_LOCK_GRACE_S`
        without change (its holder was killed mid-write), or at once when its link is older than
        :data:`JOURNAL_LOCK_AGE_S` (left by a sweep killed long before).

        Returns:
            True (the lock is held).
        """
        sleep_s, seen, since = 0.001, None, time.monotonic()
        while True:
            try:
                os.symlink(self._lock_target_file, self._lock_file)
                return True
            except FileExistsError:
                pass
            try:
                link = os.lstat(self._lock_file)
                now_seen = (link.st_ino, link.st_mtime_ns, os.stat(self._lock_file).st_mtime_ns)
            except OSError:
                continue  # released meanwhile: take it
            old = time.time() - link.st_mtime > JOURNAL_LOCK_AGE_S
            if now_seen != seen and not old:
                seen, since = now_seen, time.monotonic()
            elif old or (self.grace_period is not None and time.monotonic() - since > self.grace_period):
                self._break(now_seen[:2], link.st_mtime if old else None)
                seen, sleep_s = None, 0.001
                continue
            time.sleep(sleep_s)
            sleep_s = min(2 * sleep_s, 1.0)

    def _break(self, stale: tuple[int, int], made: float | None = None) -> None:
        """Remove the lock judged stale (``(inode, mtime_ns)`` of its link: a rename keeps both, and a new link of a
        reused inode has its own mtime), and only it; ``made``: the link's mtime when it was judged stale by its age
        (:data:`JOURNAL_LOCK_AGE_S`), None when by the grace period."""
        aside = f"{self._lock_file}.{uuid.uuid4().hex}.broken"
        try:
            os.rename(self._lock_file, aside)
        except OSError:
            return  # another waiter broke it first
        link = os.lstat(aside)
        if (link.st_ino, link.st_mtime_ns) != stale:
            # another waiter broke the stale lock and took the lock since: give it back, unless the path was taken
            # in the microseconds between (then that sweep and the holder both write; said, as it is not undone)
            try:
                os.link(aside, self._lock_file, follow_symlinks=False)
            except OSError:
                optuna.logging.get_logger("sweeper.journal").warning(
                    f"{self._lock_file}: a journal lock was taken while another sweep's was being given back"
                )
        else:
            why = (
                f"unchanged for {self.grace_period} s"
                if made is None
                else f"made {time.time() - made:.0f} s ago (older than {JOURNAL_LOCK_AGE_S} s)"
            )
            optuna.logging.get_logger("sweeper.journal").warning(
                f"{self._lock_file}: broke a journal lock {why} (a sweep killed while it wrote)"
            )
        os.unlink(aside)


class _JournalFile(JournalFileBackend):
    """Optuna's ``JournalFileBackend`` whose appends first cut a torn last line (:func:`_drop_torn_tail`, said as a
    warning) and whose failed writes (a full disk) are Optuna's ``StorageInternalError``, as a database's are."""

    def __init__(self, path: str) -> None:
        self.file_lock = _StaleSafeSymlinkLock(path, grace_period=JOURNAL_LOCK_GRACE_S)
        super().__init__(path, lock_obj=self.file_lock)
        self.path = path

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append ``logs`` under the journal's lock, as Optuna's backend does, after cutting a torn last line.

        Raises:
            optuna.exceptions.StorageInternalError: The write failed (its ``__cause__``: the ``OSError``).
        """
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        self.file_lock.acquire()
        try:
            cut = _drop_torn_tail(self.path)
            if cut:
                optuna.logging.get_logger("sweeper.journal").warning(
                    f"{self.path}: cut an unfinished last line ({cut} bytes) left by a write that did not complete "
                    "(a full disk or a killed process); no reader had applied it"
                )
            with open(self.path, "ab") as f:
                f.write(text.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise optuna.exceptions.StorageInternalError(f"{self.path}: {exc.strerror or exc}") from exc
        finally:
            try:
                self.file_lock.release()
            except RuntimeError:
                # Another sweep broke this lock as stale while it was held: a sweep frozen (SIGSTOP, a swapped-out
                # machine) longer than the grace period inside its write. (Several sweeps breaking the lock a killed
                # writer left no longer do it: _StaleSafeSymlinkLock.) The write above is complete; the lock is
                # the other sweep's now, and it releases it.
                optuna.logging.get_logger("sweeper.journal").warning(
                    f"{self.path}: another sweep broke this sweep's journal lock as stale while it wrote; the write "
                    "is complete"
                )


def _without_beat(trial: FrozenTrial) -> FrozenTrial:
    """``trial`` as its readers see it: without the heartbeat's :data:`HEARTBEAT_ATTR`, which is the journal's
    bookkeeping (an RDB storage keeps its beats in a table of their own), so that ``trials_dataframe()`` and
    optuna-dashboard show no ``system_attrs_sweeper:heartbeat`` column (issue 56). A copy when it has one: the
    journal's replayed trials are shared (``deepcopy=False``) and stay as they are."""
    if HEARTBEAT_ATTR not in trial.system_attrs:
        return trial
    shown = copy.copy(trial)
    shown.system_attrs = {k: v for k, v in trial.system_attrs.items() if k != HEARTBEAT_ATTR}
    return shown


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """Optuna's ``JournalStorage`` on a journal file, with a heartbeat kept in the journal (see the module
    docstring).

    Args:
        path: The journal file (created when missing).
        heartbeat_interval: Seconds between a running trial's beats; None: no heartbeat (a reading command).
        grace_period: Seconds after the last beat at which a RUNNING trial is stale (default: twice the interval).

    Raises:
        ValueError: A zero or negative ``heartbeat_interval`` or ``grace_period`` (Optuna's RDB storage refuses them).
    """

    def __init__(self, path: str, heartbeat_interval: int | None = None, grace_period: int | None = None) -> None:
        # as Optuna's RDBStorage refuses them: a beat every 0 s, or a trial stale at once, is no heartbeat
        for name, value in (("heartbeat_interval", heartbeat_interval), ("grace_period", grace_period)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds or None, got {value}")
        super().__init__(_JournalFile(path))
        self._heartbeat_interval = heartbeat_interval
        self._grace_period = grace_period if grace_period is not None else 2 * (heartbeat_interval or 0)
        self.path = Path(path)

    def record_heartbeat(self, trial_id: int) -> None:
        """Write the time now (UTC) as the trial's :data:`HEARTBEAT_ATTR`.

        Raises:
            optuna.exceptions.UpdateFinishedTrialError: The trial has ended.
        """
        self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, dt.datetime.now(dt.UTC).isoformat())

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        """Optuna's, without the heartbeat's :data:`HEARTBEAT_ATTR` (:func:`_without_beat`)."""
        return [_without_beat(t) for t in super().get_all_trials(study_id, deepcopy=deepcopy, states=states)]

    def get_trial(self, trial_id: int) -> FrozenTrial:
        """Optuna's, without the heartbeat's :data:`HEARTBEAT_ATTR` (:func:`_without_beat`)."""
        return _without_beat(super().get_trial(trial_id))

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        """Storage ids of the study's RUNNING trials whose last beat is older than the grace period (a trial that
        never beat is left alone, as Optuna's RDB heartbeat does)."""
        if self._heartbeat_interval is None:
            return []
        now = dt.datetime.now(dt.UTC)
        stale = []
        for t in super().get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beat = t.system_attrs.get(HEARTBEAT_ATTR)
            if isinstance(beat, str) and (now - dt.datetime.fromisoformat(beat)).total_seconds() > self._grace_period:
                stale.append(trial_id(t))
        return stale

    def get_heartbeat_interval(self) -> int | None:
        """Seconds between beats, or None without a heartbeat."""
        return self._heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        """None: sweeper fails and retries stale trials itself (:func:`sweeper.storage._recovery.fail_stale_trials`)."""
        return None
