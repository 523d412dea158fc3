"""The ``sweep`` command: one module per command (``_run``, ``_trial``, ``_doctor``, ``_estimate``, ``_report``,
``_export``, ``_dashboard``) and the error funnel here.

Exit codes (``docs/contract.md``): 0 done (pruned trials are normal), 2 bad input (one line per problem: file, key,
what is wrong, the fix), 1 anything else, 130 interrupted by Ctrl-C, 143 and 129 by SIGTERM and SIGHUP (handled as
Ctrl-C is).
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from typing import NoReturn

from sweeper.cli._parser import build_parser
from sweeper.errors import SweeperError


def _storage_failure(exc: BaseException) -> str | None:
    """One line for a study storage that failed while in use (disk full, server gone), or None for other errors."""
    if "optuna" not in sys.modules and "sqlalchemy" not in sys.modules:
        return None
    import optuna

    cause = exc.__cause__ if isinstance(exc, optuna.exceptions.StorageInternalError) else exc
    if not (isinstance(exc, optuna.exceptions.StorageInternalError) or type(cause).__module__.startswith("sqlalchemy")):
        return None
    from sweeper.storage import redact_url

    text = str(getattr(cause, "orig", None) or cause).strip().splitlines() or [type(cause).__name__]
    return (
        f"sweep: the study storage failed ({redact_url(text[0][:200])}); SQLite and PostgreSQL roll back a failed "
        "write and a journal's next write cuts its unfinished line, so finished trials are kept: fix the cause (a "
        "full disk, a stopped server) and run the same command to resume"
    )


def _stop_on_signals() -> None:
    """Handle SIGTERM and SIGHUP as Ctrl-C is (:class:`sweeper.errors.Interrupted`), in the main thread only."""
    import signal
    import threading

    from sweeper.errors import STOP_CAUSE, Interrupted

    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        STOP_CAUSE["by"] = name
        raise Interrupted(name, signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, stop)


def _name_too_long(exc: OSError) -> str:
    """One line for a path whose name (or one of its folders' names) is longer than the file system allows (255 bytes
    a name on Linux): a dataset, space file, study name or ``--storage`` given too long."""
    name = str(exc.filename or "")
    longest = max((len(part.encode()) for part in name.split("/")), default=0)
    shown = name if len(name) <= 60 else f"{name[:28]}...{name[-28:]}"
    return (
        f"{shown}: the name is too long for the file system ({longest} bytes in one name; at most 255); "
        "give a shorter file, study or storage name"
    )


#: The commands that open a study (and so import Optuna).
_OPENS_A_STUDY = frozenset({"run", "report", "dashboard", "confirm", "calibrate", "export"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``sweep``; returns the exit code."""
    from sweeper.errors import Interrupted

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the subcommand's help, not the top-level one
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")  # type: ignore[attr-defined]
    _stop_on_signals()
    if args.command in _OPENS_A_STUDY:  # Optuna's INFO lines ("A new study created ...") are not the command's output
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return args.func(args)
    except SweeperError as exc:
        if args.debug:
            traceback.print_exc()
        for line in exc.problems:
            print(line, file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `sweep ... | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
            print(_name_too_long(exc), file=sys.stderr)
            return 2
        failure = _storage_failure(exc)
        if failure is None:
            raise
        if args.debug:
            traceback.print_exc()
        print(failure, file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        by = f" by {exc.signal_name}" if isinstance(exc, Interrupted) else ""
        print(
            f"sweep: interrupted{by}"
            + (
                "; the running trials were stopped, recorded as interrupted and queued again (run the same command "
                "to go on)"
                if args.command == "run"
                else "; the trial was stopped (a trial alone keeps no study: run it again)"
                if args.command == "trial"
                else "; files already written are complete"
            ),
            file=sys.stderr,
        )
        return 128 + exc.signal_number if isinstance(exc, Interrupted) else 130
