"""Running ``sweep``: in a subprocess (the real console entry point, a real process's exit code and streams) or
in-process (:func:`sweeper.cli.main` with the streams captured; for tests of parsing, bad input and report text)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def sweep(*args: str, cwd: Path, timeout: float = 600, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run ``sweep ARGS`` in ``cwd`` as a subprocess (``python -m sweeper.cli``) and capture its output.

    Raises:
        subprocess.TimeoutExpired: It ran longer than ``timeout`` seconds.
    """
    popen.setdefault("env", {**os.environ})
    return subprocess.run(
        [sys.executable, "-m", "sweeper.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **popen
    )


@dataclass(frozen=True)
class CliResult:
    """What an in-process ``sweep`` printed and returned, named as :class:`subprocess.CompletedProcess` names it."""

    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path | None = None) -> CliResult:
    """Run ``sweep ARGS`` in this process, in ``cwd`` (default: the current working directory, which is restored
    after), with stdout and stderr captured; the warnings filters, Optuna's log level and the SIGTERM and SIGHUP
    handlers it sets are restored too (a test run stopped by SIGTERM stops as pytest does, not as a sweep).

    argparse's own exits (``--help``, a usage error) are returned as their exit code, as the console script's are.
    An exception the command does not turn into an exit code propagates (a subprocess would exit 1 with its
    traceback).
    """
    import optuna

    from sweeper.cli import main

    out, err = io.StringIO(), io.StringIO()
    before, verbosity = Path.cwd(), optuna.logging.get_verbosity()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        os.chdir(before)
        optuna.logging.set_verbosity(verbosity)
        if threading.current_thread() is threading.main_thread():  # where main() installed its handlers
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
    return CliResult(returncode=int(code or 0), stdout=out.getvalue(), stderr=err.getvalue())
