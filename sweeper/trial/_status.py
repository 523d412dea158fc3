"""A trial's status: what a trial ended as (:class:`TrialStatus`), and which statuses are pruned (a result about the
configuration) or failed (about the machine or the run)."""

from __future__ import annotations

import enum


class TrialStatus(str, enum.Enum):
    """How a trial ended (its ``status`` user attribute), or that it has not yet: the one list of statuses, which
    every status set of the sweep and of the trial process derives from.

    ``COMPLETE`` trials have both objectives. ``NAN``, ``DIVERGED``, ``OOM``, ``PREDICTED_OOM`` and ``DOMINATED_OOM``
    are results about the configuration: the trial is PRUNED and infeasible for the sampler. ``TIMEOUT``, ``CRASH``
    and ``ERROR`` are failures of the run (FAIL), retried where they may go differently. ``RUNNING`` and
    ``WAITING`` have not ended; ``UNKNOWN`` is a finished trial without a status sweeper knows (a study edited by
    hand, or a newer version's status). A result carries one of the first nine.

    A ``str`` enum: it compares equal to, formats and serializes (JSON, Optuna user attributes) as its value.
    """

    COMPLETE = "complete"
    NAN = "nan"
    DIVERGED = "diverged"
    OOM = "oom"
    PREDICTED_OOM = "predicted_oom"
    DOMINATED_OOM = "dominated_oom"
    TIMEOUT = "timeout"
    CRASH = "crash"
    ERROR = "error"
    RUNNING = "running"
    WAITING = "waiting"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def pruned(self) -> bool:
        """A result about the configuration (PRUNED, infeasible): NaN, divergence or out of memory, measured or
        predicted."""
        return self in (
            TrialStatus.NAN,
            TrialStatus.DIVERGED,
            TrialStatus.OOM,
            TrialStatus.PREDICTED_OOM,
            TrialStatus.DOMINATED_OOM,
        )

    @property
    def failed(self) -> bool:
        """A failure of the run, not of the configuration (FAIL): timeout, crash or error."""
        return self in (TrialStatus.TIMEOUT, TrialStatus.CRASH, TrialStatus.ERROR)

    @property
    def retried(self) -> bool:
        """Its configuration is run again (up to ``max_retries``): a crash or a timeout may go differently another
        time; a NaN or an OOM is a result and is never retried."""
        return self in (TrialStatus.CRASH, TrialStatus.TIMEOUT)

    @property
    def fits(self) -> bool | None:
        """Whether the configuration's memory fit the cap, as measured: True for ``complete``, ``nan`` and ``diverged``
        (they ran steps within it), False for ``oom``, None when the trial measured nothing about it."""
        if self in (TrialStatus.COMPLETE, TrialStatus.NAN, TrialStatus.DIVERGED):
            return True
        return False if self is TrialStatus.OOM else None

    @property
    def optuna_state(self) -> str:
        """The name of the ``optuna.trial.TrialState`` a trial of this status is told (or is in): ``COMPLETE``,
        ``PRUNED``, ``FAIL``, ``RUNNING`` or ``WAITING`` (``UNKNOWN``: ``FAIL``, the state of a trial that ended
        without a result sweeper wrote). A name, so that this module imports no optuna (the trial process
        imports it)."""
        if self is TrialStatus.COMPLETE:
            return "COMPLETE"
        if self.pruned:
            return "PRUNED"
        if self in (TrialStatus.RUNNING, TrialStatus.WAITING):
            return self.name
        return "FAIL"


#: Statuses whose trial is PRUNED (a result about the configuration); the other results but ``complete`` are FAIL.
PRUNED_STATUSES = frozenset(s for s in TrialStatus if s.pruned)


FAIL_STATUSES = frozenset(s for s in TrialStatus if s.failed)
