"""What a sweep tells as it runs (:class:`SweepCallback`, :class:`SweepEvent`, in the manner of optuna's
``Study.optimize`` callbacks), and :class:`SweepStop`, which ends a worker slot."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.study import StoredTrial
from sweeper.trial import TrialProgress


@dataclass(frozen=True, kw_only=True)
class SweepEvent:
    """What the run loop reports after each trial.

    Attributes:
        trial: The trial as stored (:func:`sweeper.study.stored_trial` of it): its status, params and result
            (measured, reused from the trial it repeats, or the preflight's).
        finished: Finished trials in the study now (:attr:`sweeper.study.StoredTrial.counts`).
        n_trials: The target.
    """

    trial: StoredTrial
    finished: int
    n_trials: int


class SweepCallback:
    """What a sweep tells as it runs, in the manner of the callbacks of optuna's ``Study.optimize``: subclass it and
    override what you need (each method does nothing here). With several worker slots the calls come from their
    threads, one call at a time.
    """

    def trial_started(self, trial: StoredTrial, device: str | None) -> None:
        """A trial's process was handed its configuration (``device``: its ``CUDA_VISIBLE_DEVICES``, or None).
        Repeats and preflight prunes run nothing and are not started."""

    def trial_finished(self, event: SweepEvent) -> None:
        """A trial was told to the study: measured, reused from an earlier trial, or pruned by the preflight."""

    def trial_progress(self, number: int, slot: int, progress: TrialProgress) -> None:
        """The running trial ``number`` of worker slot ``slot`` (0 to workers - 1) sent a progress report
        (:class:`sweeper.trial.TrialProgress`: its phase, step, steps of the phase, loss, peak memory so far), at
        most a few times a second."""

    def note(self, text: str) -> None:
        """A line about the study's bookkeeping (a lost trial failed and retried, a trial marked lost meanwhile)."""


class SweepStop(Exception):
    """Raised in a worker slot that has nothing more to run (the study holds its n_trials, the timeout passed, or
    the sweep was stopped): the slot ends; :func:`sweeper.sweep._running.run_slot` catches it."""
