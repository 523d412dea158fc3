"""The errors sweeper raises for people to act on.

Every error carries one line per problem, each naming the file, the key and the fix; the CLI prints those lines
and exits with code 2 (bad input). Anything that is not a :class:`SweeperError` is a bug or an environment failure
and keeps its traceback (exit code 1).
"""

from __future__ import annotations


class SweeperError(Exception):
    """Base class: a problem the user can fix, described by one or more one-line messages.

    Args:
        problems: One line per problem, each of the form ``"<file>: <key>: <what is wrong>; <the fix>"``.
    """

    exit_code = 2

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class SpaceError(SweeperError):
    """A space file (``space.yaml``) or a ``--set`` override is invalid; all problems are listed at once."""


class DataError(SweeperError):
    """A dataset cannot be found, read, or turned into training samples."""


class ModelError(SweeperError):
    """A model cannot be found or loaded (path missing, hub unreachable, unsupported file)."""


class StudyError(SweeperError):
    """A study or its storage cannot be opened or written."""


class RunError(SweeperError):
    """The machine failed a running sweep (disk full, storage unreachable): the line says what was kept and how to
    resume. Exit code 1: not bad input."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what ``timeout``, systemd, Slurm and a closed terminal send), raised in the main thread by
    the CLI's handler and handled everywhere as Ctrl-C is: the running trials are killed, recorded as interrupted and
    queued again.

    Args:
        signal_name: ``SIGTERM`` or ``SIGHUP``.
        signal_number: Its number; the CLI exits with ``128 + signal_number`` (143, 129), as a shell reports it.
    """

    def __init__(self, signal_name: str, signal_number: int):
        self.signal_name, self.signal_number = signal_name, signal_number
        super().__init__(signal_name)


#: What stopped this process last: ``Ctrl-C`` unless a handled signal did (set by the CLI's handler); the reason
#: an interrupted trial records.
STOP_CAUSE = {"by": "Ctrl-C"}


class ExperimentalWarning(UserWarning):
    """A measurement or setting that is experimental was used: it has no interface promise until promoted, and its
    figures are stored outside the stable stored attributes (optuna's ``ExperimentalWarning`` is the model)."""
