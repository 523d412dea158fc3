"""The messages between the sweep and its zygote (:mod:`sweeper.trial._zygote` and
:mod:`sweeper.trial._child.zygote`), typed both ways as :mod:`sweeper.trial._job` types the trial process's: one JSON
datagram a message on a ``SOCK_SEQPACKET`` socket, a request (:class:`ForkRequest`, :class:`PollRequest`) and its
:class:`ZygoteReply`. Imports no torch: both sides read it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

#: The environment variable that carries the zygote's end of the request socket.
ZYGOTE_FD_ENV = "SWEEPER_ZYGOTE_FD"

#: Largest request in bytes (a fork carries the trial process's whole environment).
MAX_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class ForkRequest:
    """Fork a trial process (sent with its three descriptors: stdin, its log, the write end of its control pipe).

    Attributes:
        cwd: Its working directory.
        env: Its exact environment, as ``subprocess.Popen`` would give it.
    """

    cwd: str
    env: dict[str, str]


@dataclass(frozen=True)
class PollRequest:
    """Ask for a forked trial process's return code.

    Attributes:
        pid: The process.
    """

    pid: int


Request = ForkRequest | PollRequest


def request_bytes(request: Request) -> bytes:
    """``request`` as its datagram: ``{"op": "fork", "cwd": ..., "env": {...}}`` or ``{"op": "poll", "pid": N}``."""
    op = "fork" if isinstance(request, ForkRequest) else "poll"
    return json.dumps({"op": op, **asdict(request)}).encode()


def read_request(message: bytes) -> Request:
    """Inverse of :func:`request_bytes`.

    Raises:
        ValueError: Not JSON, an unknown ``op`` or fields of the wrong type. TypeError: Fields missing or unknown.
    """
    data: dict[str, Any] = json.loads(message)
    op = data.pop("op", None)
    if op == "fork":
        fork = ForkRequest(**data)
        if not isinstance(fork.cwd, str) or not isinstance(fork.env, dict):
            raise ValueError("a fork request carries cwd (a string) and env (a mapping)")
        return fork
    if op == "poll":
        poll = PollRequest(**data)
        if isinstance(poll.pid, bool) or not isinstance(poll.pid, int):
            raise ValueError(f"a poll request's pid must be an integer, not {poll.pid!r}")
        return poll
    raise ValueError(f"unknown request {op!r}")


@dataclass(frozen=True)
class ZygoteReply:
    """The zygote's answer to one request.

    Attributes:
        pid: A fork's child, the leader of its own process group.
        returncode: A poll's answer: None while the process runs, else as ``subprocess.Popen.returncode``
            (negative: the signal that ended it).
        error: Why the request failed (``ValueError: ...``); the other fields are then None.
    """

    pid: int | None = None
    returncode: int | None = None
    error: str | None = None

    def to_bytes(self) -> bytes:
        """The reply as its datagram."""
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_bytes(cls, message: bytes) -> ZygoteReply:
        """Inverse of :meth:`to_bytes`.

        Raises:
            ValueError: Not JSON. TypeError: Fields unknown.
        """
        return cls(**json.loads(message))
