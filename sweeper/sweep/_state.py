"""A running sweep's state, shared by its worker slots: the plan, the study, the ask lock and heartbeats, the
callbacks it tells (:class:`SweepCallback`, :class:`SweepEvent`), and asking the sampler (:meth:`RunningSweep.ask`).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial

from sweeper.storage import AskLock, TrialAttr, fail_stale_trials, heartbeat_interval, storage_of, trial_id
from sweeper.study import (
    StoredTrial,
    StudySnapshot,
    objective_values,
    snapshot,
    stored_trial,
    study_objectives,
    to_distributions,
)
from sweeper.sweep._plan import SweepPlan
from sweeper.trial import TrialProgress, TrialResult, TrialStatus

#: Seconds a worker slot waits before looking again when the trials still needed are all running elsewhere.
POLL_S = 2.0


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
    the sweep was stopped): the slot ends; :func:`sweeper.sweep._trial_steps.run_slot` catches it."""


class RunningSweep:
    """One ``sweep run`` process while it runs: its worker slots (threads when more than one) share the study, the ask
    lock, the consecutive-repeat count, the running trial processes and Ctrl-C. The steps of a trial
    (:mod:`sweeper.sweep._trial_steps`) take it as their one argument; it is the sweep package's own (not on its
    face)."""

    def __init__(self, plan: SweepPlan, callbacks: Sequence[SweepCallback]):
        self.plan, self.callbacks = plan, list(callbacks)
        self.space, self.study, self.name, self.model_path = plan.space, plan.study, plan.name, plan.model_path
        self.target, self.budget = plan.n_trials, plan.timeout_s
        self.workers, self.devices = plan.workers, plan.devices
        self.max_retries = plan.space.base.max_retries
        self.predictor = plan.predict_peak_gib
        self.distributions = to_distributions(plan.space)
        self.lock = AskLock(plan.storage, plan.name)
        self.mutex = threading.Lock()  # repeats, callbacks, the set of running trial processes
        self.start = time.monotonic()
        self.repeats = 0
        self.stop = threading.Event()
        self.interrupted = threading.Event()
        self.trial_pids: set[int] = set()
        self.local = threading.local()  # per worker slot: its TrialProcess
        self.warm = os.environ.get("SWEEPER_WARM", "1") != "0"
        self.errors: list[BaseException] = []
        self.objectives = study_objectives(plan.study)
        # The study as this sweep last saw it: read once a trial, under the ask lock (:meth:`ask`), and updated with
        # each trial this process tells (:meth:`emit`) instead of read again.
        self.view: StudySnapshot = snapshot(plan.study, stale=False)

    def objective_values(self, result: TrialResult) -> list[float]:
        """What a complete trial tells Optuna: each of the study's objectives (:mod:`sweeper.study._objectives`)
        computed from its result."""
        return objective_values(self.objectives, result)

    # -- reporting ----------------------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        with self.mutex:
            for callback in self.callbacks:
                callback.note(text)

    def started(self, trial: optuna.Trial) -> None:
        if not self.callbacks:
            return
        stored = stored_trial(storage_of(self.study).get_trial(trial_id(trial)))
        with self.mutex:
            for callback in self.callbacks:
                callback.trial_started(stored, trial.user_attrs.get(TrialAttr.CUDA_VISIBLE_DEVICES))

    def progress(self, number: int, progress: TrialProgress) -> None:
        if not self.callbacks:
            return
        with self.mutex:
            for callback in self.callbacks:
                callback.trial_progress(number, self.local.slot, progress)

    def emit(self, frozen: FrozenTrial) -> StudySnapshot:
        """Tell the callbacks that ``frozen`` ended; returns the sweep's view of the study with it (:attr:`view`,
        updated, not read again: what the event counts, and what the caller reuses)."""
        with self.mutex:
            self.view = view = self.view.with_trial(frozen)
        if not self.callbacks:
            return view
        event = SweepEvent(
            trial=view.by_number.get(frozen.number) or stored_trial(frozen),
            finished=view.finished,
            n_trials=self.target,
        )
        with self.mutex:
            for callback in self.callbacks:
                callback.trial_finished(event)
        return view

    # -- slots --------------------------------------------------------------------------------------------------

    def interrupt(self) -> None:
        """Ctrl-C with worker threads: stop starting trials and kill every running trial process's group; each
        slot then records its trial as interrupted."""
        self.interrupted.set()
        self.stop.set()
        with self.mutex:
            pids = list(self.trial_pids)
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # -- step 1: ask --------------------------------------------------------------------------------------------

    def fail_stale(self) -> None:
        """Fail and retry the trials of sweeps that died on this host or went silent anywhere (under the lock)."""
        for stale in fail_stale_trials(self.study, self.max_retries):
            then = (
                "its configuration runs again"
                if stale.retried
                else f"its configuration ran {self.max_retries + 1} times and is not retried again (max_retries)"
            )
            if stale.why == "gone":
                self.note(f"trial {stale.number}: its sweep process is gone; marked interrupted, {then}")
            else:
                self.note(f"trial {stale.number}: its sweep sent no heartbeat; marked lost, {then}")

    def ask(self, device: str | None) -> optuna.Trial | None:
        """Under the ask lock: a new trial, or None when this slot should wait (the trials still needed are running
        elsewhere).

        Raises:
            SweepStop: ``n_trials`` reached, the time budget spent, too many repeats, or Ctrl-C.
        """
        with self.lock.held():
            if self.stop.is_set():
                raise SweepStop
            self.fail_stale()
            view = snapshot(self.study, stale=False)  # the loop's one reading of the study for this trial
            with self.mutex:
                self.view = view
            finished = view.finished
            running = sum(1 for t in view.trials if t.status == TrialStatus.RUNNING)
            if (
                finished >= self.target
                or self.repeats >= self.plan.max_consecutive_repeats
                or (self.budget is not None and time.monotonic() - self.start >= self.budget)
            ):
                raise SweepStop
            if finished + running >= self.target:
                return None
            trial = self.study.ask(self.distributions)
            if self.plan.setup is not None:
                trial.set_user_attr(TrialAttr.SETUP, self.plan.setup)
            trial.set_user_attr(TrialAttr.SWEEP_HOST, socket.gethostname())
            trial.set_user_attr(TrialAttr.SWEEP_PID, os.getpid())
            if device is not None:
                trial.set_user_attr(TrialAttr.CUDA_VISIBLE_DEVICES, device)
            interval = heartbeat_interval(storage_of(self.study))
            if interval is not None:
                trial.set_user_attr(TrialAttr.HEARTBEAT_INTERVAL_S, interval)
            return trial
