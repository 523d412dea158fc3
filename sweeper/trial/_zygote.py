"""The sweep's side of the trial processes' fork server (:mod:`sweeper.trial._child.zygote`).

A fresh trial process started with ``python -m`` spends its first seconds importing torch, transformers, peft and
bitsandbytes (9-11 s measured on 2 CPU cores, as much as a short CPU trial trains). On a machine without a visible
CUDA device the sweep instead asks a *zygote*, a process that has done those imports once, to fork the trial
process: the child is as fresh as a started one (its own address space, session and process group; the zygote
never runs a trial) and starts in milliseconds. One zygote serves every trial process of one environment in this
process (the environment a library may read at import: see :data:`RUNTIME_ONLY`), and exits when this process does.

Where CUDA is visible, or with ``SWEEPER_TRIAL_START=exec``, or when a zygote cannot be started or answer, the trial
process is started with ``python -m`` as before (:meth:`sweeper.trial._launch.TrialProcess._start`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from sweeper.devices import cuda_visible
from sweeper.trial._zygote_protocol import (
    ZYGOTE_FD_ENV,
    ForkRequest,
    PollRequest,
    Request,
    ZygoteReply,
    request_bytes,
)

#: The module the zygote runs (``python -m``).
ZYGOTE_MODULE = "sweeper.trial._child.zygote"

#: ``SWEEPER_TRIAL_START=exec`` starts every trial process with ``python -m`` (no zygote).
START_ENV = "SWEEPER_TRIAL_START"

#: Environment variables no library reads at import: a trial process forked with another value of them gets that
#: value all the same (the child takes the request's whole environment), so they do not call for another zygote.
RUNTIME_ONLY = frozenset(
    {
        "SWEEPER_CACHE",
        "SWEEPER_PARENT_PID",
        "SWEEPER_CONTROL_FD",
        "SWEEPER_DEBUG_MODULES",
        "PYTEST_CURRENT_TEST",
        "PWD",
        "OLDPWD",
        "COLUMNS",
        "LINES",
    }
)

#: Seconds a zygote may take to import and answer its first request (at most the trial's own timeout) before it is
#: ended and the trial process is started with ``python -m`` instead; it answers later requests at once.
FIRST_ANSWER_S = 300.0


class ZygoteError(RuntimeError):
    """The zygote is gone or did not answer; the caller starts the trial process itself."""


class Zygote:
    """One fork server (:mod:`sweeper.trial._child.zygote`), started with ``env``; thread-safe.

    Args:
        env: Its environment: what its imports read, and what the trial processes it forks inherit unless a request
            says otherwise.

    Raises:
        OSError: It cannot be started.
    """

    def __init__(self, env: Mapping[str, str]):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", ZYGOTE_MODULE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches the sweep, not the zygote
                pass_fds=(theirs.fileno(),),
                env={**env, ZYGOTE_FD_ENV: str(theirs.fileno()), "PYTHONSAFEPATH": "1"},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._sock, self._lock, self._answered = ours, threading.Lock(), False
        self.dead = False

    def _ask(
        self, request: Request, fds: list[int] | None = None, first_answer_s: float = FIRST_ANSWER_S
    ) -> ZygoteReply:
        with self._lock:
            if self.dead:
                raise ZygoteError("the zygote has exited")
            try:
                self._sock.settimeout(None if self._answered else max(0.1, min(first_answer_s, FIRST_ANSWER_S)))
                socket.send_fds(self._sock, [request_bytes(request)], fds or [])
                reply = self._sock.recv(1 << 16)
            except OSError as exc:  # TimeoutError included
                self.close()
                raise ZygoteError(f"the zygote did not answer ({exc})") from exc
            if not reply:
                self.close()
                raise ZygoteError("the zygote has exited")
            self._answered = True
        try:
            answer = ZygoteReply.from_bytes(reply)
        except (ValueError, TypeError) as exc:
            raise ZygoteError(f"the zygote answered what is not a reply ({exc})") from exc
        if answer.error is not None:
            raise ZygoteError(answer.error)
        return answer

    def fork(
        self, env: Mapping[str, str], cwd: str, fds: tuple[int, int, int], first_answer_s: float = FIRST_ANSWER_S
    ) -> int:
        """Fork a trial process with exactly ``env`` and ``cwd``, and ``fds`` (stdin, log, control pipe) as its
        stdin, stdout/stderr and ``SWEEPER_CONTROL_FD`` (duplicated into it; the caller keeps and closes its own);
        its pid, the leader of its own process group. A zygote still importing is waited for ``first_answer_s``
        seconds at most (then ended). Raises :class:`ZygoteError`."""
        pid = self._ask(ForkRequest(cwd=cwd, env=dict(env)), list(fds), first_answer_s).pid
        if pid is None:
            raise ZygoteError("the zygote answered a fork without a pid")
        return pid

    def poll(self, pid: int) -> int | None:
        """A forked trial process's return code (negative: the signal that ended it), None while it runs. Raises
        :class:`ZygoteError`."""
        return self._ask(PollRequest(pid=pid)).returncode

    def close(self) -> None:
        """End the zygote (closing its socket ends it; its trial processes die with it)."""
        self.dead = True
        self._sock.close()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class ForkedProcess:
    """A trial process forked by a :class:`Zygote`, with what :class:`sweeper.trial._launch.TrialProcess` uses of a
    ``subprocess.Popen``: ``pid``, ``stdin``, :meth:`poll` and :meth:`wait`."""

    def __init__(self, zygote: Zygote, pid: int, stdin: IO[bytes]):
        self.pid, self.stdin, self._zygote = pid, stdin, zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its return code, None while it runs; a process whose zygote is gone died with it (``PR_SET_PDEATHSIG``:
        SIGKILL)."""
        if self.returncode is None:
            try:
                self.returncode = self._zygote.poll(self.pid)
            except ZygoteError:
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its return code once it has ended. Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(ZYGOTE_MODULE, timeout or 0.0)
            time.sleep(0.02)
        return code


_ZYGOTES: dict[tuple[tuple[str, str], ...], Zygote] = {}
_REGISTRY_LOCK = threading.Lock()


def _enabled(env: Mapping[str, str]) -> bool:
    if env.get(START_ENV, "") == "exec" or not hasattr(socket, "send_fds") or sys.platform != "linux":
        return False
    return not cuda_visible(env)


def _zygote_for(env: Mapping[str, str]) -> Zygote:
    key = tuple(sorted((k, v) for k, v in env.items() if k not in RUNTIME_ONLY))
    with _REGISTRY_LOCK:
        zygote = _ZYGOTES.get(key)
        if zygote is None or zygote.dead:
            zygote = _ZYGOTES[key] = Zygote(env)
        return zygote


def start_zygote(env: Mapping[str, str]) -> None:
    """Start the zygote for ``env`` now (its imports run in the background), where zygotes are used and it is not
    running; a zygote that cannot start is left to :func:`fork_trial_process` (which falls back)."""
    if _enabled(env):
        try:
            _zygote_for(env)
        except OSError:
            pass


def fork_trial_process(
    env: Mapping[str, str], log_path: Path, control: int, wait_s: float = FIRST_ANSWER_S
) -> ForkedProcess | None:
    """A trial process forked by this environment's zygote (started first when there is none, and waited for
    ``wait_s`` seconds at most while it imports), its output appended to ``log_path`` and its control pipe
    ``control``; None where zygotes are not used (CUDA visible, ``SWEEPER_TRIAL_START=exec``, not Linux) or the
    zygote failed: the caller then starts the process itself."""
    if not _enabled(env):
        return None
    read_end, write_end = os.pipe()
    try:
        zygote = _zygote_for(env)
        with open(log_path, "ab") as log:
            pid = zygote.fork(env, os.getcwd(), (read_end, log.fileno(), control), wait_s)
    except (ZygoteError, OSError):
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return ForkedProcess(zygote, pid, os.fdopen(write_end, "wb"))
