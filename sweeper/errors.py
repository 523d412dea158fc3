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
