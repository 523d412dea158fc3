"""The trial process's tie to the sweep that started it (child side, imported before anything heavy)."""

from __future__ import annotations

import ctypes
import os
import signal


def die_with_parent() -> None:
    """In the trial process, first thing: be killed with SIGKILL when the sweep that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``), so a sweep killed with ``kill -9`` does not leave its worker training on, holding
    the GPU. Set by the trial process itself rather than in a ``preexec_fn`` (unsafe in a process with threads, as the
    sweep is: heartbeats, workers); a sweep that died before this call is seen by the parent pid check.
    """
    expected = os.environ.get("SWEEPER_PARENT_PID")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)
