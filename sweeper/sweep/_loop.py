"""The sweep's run loop. Each trial goes through the same steps:

1. **ask** (:meth:`_Sweep.ask`): under the ask lock, fail stale trials (:func:`fail_stale_trials`), stop at
   ``n_trials``, the time budget or too many repeats, else ask the sampler;
2. **settle** without running it: a repeat of a configuration already measured reuses that result
   (:func:`settle_repeat`), a configuration the memory model or a known OOM says cannot fit is pruned
   (:func:`settle_prediction`);
3. **measure** it in a trial process (:func:`measure`, the worker slot's :class:`sweeper.trial.TrialProcess`);
4. **tell** the study its outcome, with its artifacts (:func:`tell`), and **retry** what may go differently
   another time (crash, timeout; :func:`sweeper.study._recovery.retry`).

Several worker slots (threads) may run in one sweep process and several processes on one study (see
:mod:`sweeper.study._coordination`). Resuming is running the same command again: the study is loaded, stale
trials are failed and retried, and the loop stops when the study holds ``n_trials`` finished trials.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.errors import STOP_CAUSE, RunError
from sweeper.memory import preflight
from sweeper.space import TrialConfig
from sweeper.study import StoredTrial, StudyLike, StudySnapshot, artifact_store, snapshot, study_dir
from sweeper.study.writing import (
    CORRECTED_ATTR,
    FAILURE_CONSTRAINT,
    TRIAL_SETUP_ATTR,
    AskLock,
    Heartbeat,
    check_disk,
    count_finished,
    device_kind,
    fail_stale_trials,
    failure_constraint,
    heartbeat_interval,
    make_sampler,
    objective_values,
    record_result,
    retry,
    slot_env,
    storage_of,
    stored_calibration,
    stored_trial,
    study_objectives,
    to_distributions,
    trial_dir,
    trial_id,
    update_calibration,
    upload_trial_artifacts,
)
from sweeper.sweep._plan import SweepPlan
from sweeper.sweep._preflight import known_memory, trial_device
from sweeper.trial import MemoryReading, Provenance, TrialProcess, TrialProgress, TrialResult, TrialStatus

#: Seconds a worker slot waits before looking again when the trials still needed are all running elsewhere.
POLL_S = 2.0

#: User attributes that describe one run of a trial rather than its configuration's result (not copied to repeats).
_BOOKKEEPING_ATTRS = (
    "sweep_host",
    "sweep_pid",
    "worker_pid",
    "retry_of",
    "retry_attempt",
    "retried",
    "interrupted",
    "duplicate_of",
    "cuda_visible_devices",
    "heartbeat_interval_s",
    TRIAL_SETUP_ATTR,
)


def _same_rows(params: Mapping[str, Any], config: TrialConfig | None, longest: int | None) -> dict[str, Any]:
    """``params`` with a searched ``max_seq_length`` at the length its rows are trained at
    (:meth:`TrialConfig.worst_case_length`): values at or above the data's longest sample compare equal."""
    out = dict(params)
    if config is not None and "max_seq_length" in out:
        out["max_seq_length"] = config.worst_case_length(longest)
    return out


def find_duplicate(
    study: StudyLike,
    params: Mapping[str, Any],
    config: TrialConfig | None = None,
    setup: int | None = None,
    longest_sample_tokens: int | None = None,
) -> FrozenTrial | None:
    """A COMPLETE or PRUNED trial with these params (or params that train the same rows) and a result of its own, or
    None.

    TPE re-proposes configurations it already measured, often in small categorical spaces; a trial's outcome is
    deterministic up to measurement noise (fixed seed, same samples), so a repeat costs GPU time and teaches nothing.
    FAIL trials (timeout, crash, error) are not reused: they may go differently another time. With ``config``, the
    earlier trial must also have been measured with the same settings (:meth:`sweeper.space.TrialConfig.measured`:
    run policy such as ``trial_timeout`` or ``max_retries`` aside): a study resumed with another
    ``memory_limit_gib``, learning rate or dataset measures its configurations again. With ``setup``, the earlier
    trial must have been measured under that setup too (:mod:`sweeper.study._setups`: the data file's content may
    have changed under the same path). With ``longest_sample_tokens`` (the data's longest tokenized sample) and
    ``config``, a ``max_seq_length`` at or above it is the same as any other such value
    (:meth:`TrialConfig.as_trained`): the trials pad each micro-batch to its longest row, so both train the same rows
    at the same shapes (not when samples are packed: a packed row fills up to ``max_seq_length``).
    """
    longest = longest_sample_tokens if config is not None else None
    want = config.as_trained(longest).measured() if config is not None else None
    mine = _same_rows(params, config, longest)
    for t in snapshot(study).trials_in((TrialState.COMPLETE, TrialState.PRUNED)):
        if "status" not in t.user_attrs or t.frozen is None:
            continue
        if t.params != params and (longest is None or _same_rows(t.params, t.config, longest) != mine):
            continue
        if setup is not None and t.user_attrs.get(TRIAL_SETUP_ATTR, setup) != setup:
            continue
        if want is not None and config is not None:
            if t.config is None:
                continue
            theirs = t.config
            if setup is not None and t.user_attrs.get(TRIAL_SETUP_ATTR) == setup:
                # The setup compared the data by content and a local checkpoint by fingerprint: the same files
                # under another path (a copied project folder) are the same measurement.
                theirs = replace(
                    theirs,
                    dataset=replace(theirs.dataset, path=config.dataset.path),
                    model=replace(theirs.model, name_or_path=config.model.name_or_path),
                )
            if theirs.as_trained(longest).measured() != want:
                continue
        return t.frozen
    return None


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


class _Stop(Exception):
    """Internal: this worker slot has nothing more to run."""


class _Sweep:
    """One ``sweep run`` process: its worker slots (threads when more than one) share the study, the ask lock, the
    consecutive-repeat count, the running trial processes and Ctrl-C."""

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
                callback.trial_started(stored, trial.user_attrs.get("cuda_visible_devices"))

    def progress(self, number: int, progress: TrialProgress) -> None:
        if not self.callbacks:
            return
        with self.mutex:
            for callback in self.callbacks:
                callback.trial_progress(number, self.local.slot, progress)

    def emit(self, frozen: FrozenTrial) -> StudySnapshot:
        """Tell the callbacks that ``frozen`` ended; returns the study as read once after it (what the event counts,
        and what the caller reuses rather than reading the study again)."""
        view = snapshot(self.study)
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

    def run_slot(self, slot: int) -> None:
        """Run trials in this worker slot until the sweep stops."""
        device = self.devices[slot]
        env = slot_env(device, self.workers)
        # The slot's warm trial process (sweeper.trial.TrialProcess): started at its first trial, reused while
        # trials end complete or diverged, ended with the slot.
        self.local.process = TrialProcess(env, warm=self.warm)
        self.local.slot = slot
        try:
            while not self.stop.is_set():
                check_disk(study_dir(self.name))
                try:
                    trial = self.ask(device)
                except _Stop:
                    return
                if trial is None:
                    self.stop.wait(POLL_S)
                    continue
                heartbeat = Heartbeat(storage_of(self.study), trial_id(trial))
                try:
                    run_one(self, trial)
                finally:
                    heartbeat.stop()
        finally:
            self.local.process.close()

    def slot_main(self, slot: int, done: threading.Event) -> None:
        """A worker slot's thread: an error stops every slot from starting more trials and is raised by the main
        thread; ``done`` is set when the slot has recorded its last trial."""
        try:
            self.run_slot(slot)
        except BaseException as exc:
            with self.mutex:
                self.errors.append(exc)
            self.stop.set()
        finally:
            done.set()

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
            if stale.why == "gone":
                self.note(
                    f"trial {stale.number}: its sweep process is gone; marked interrupted, its configuration runs again"
                )
            else:
                self.note(
                    f"trial {stale.number}: its sweep sent no heartbeat; marked lost, its configuration runs again"
                )

    def ask(self, device: str | None) -> optuna.Trial | None:
        """Under the ask lock: a new trial, or None when this slot should wait (the trials still needed are running
        elsewhere).

        Raises:
            _Stop: ``n_trials`` reached, the time budget spent, too many repeats, or Ctrl-C.
        """
        with self.lock.held():
            if self.stop.is_set():
                raise _Stop
            self.fail_stale()
            view = snapshot(self.study)
            finished = view.finished
            running = sum(1 for t in view.trials if t.status == TrialStatus.RUNNING)
            if (
                finished >= self.target
                or self.repeats >= self.plan.max_consecutive_repeats
                or (self.budget is not None and time.monotonic() - self.start >= self.budget)
            ):
                raise _Stop
            if finished + running >= self.target:
                return None
            trial = self.study.ask(self.distributions)
            if self.plan.setup is not None:
                trial.set_user_attr(TRIAL_SETUP_ATTR, self.plan.setup)
            trial.set_user_attr("sweep_host", socket.gethostname())
            trial.set_user_attr("sweep_pid", os.getpid())
            if device is not None:
                trial.set_user_attr("cuda_visible_devices", device)
            interval = heartbeat_interval(storage_of(self.study))
            if interval is not None:
                trial.set_user_attr("heartbeat_interval_s", interval)
            return trial


# -- the steps of one trial ------------------------------------------------------------------------------------


def run_one(sweep: _Sweep, trial: optuna.Trial) -> None:
    """Settle, or measure and tell, one asked trial."""
    config = sweep.space.trial_config(trial.params)
    if not wait_for_same(sweep, trial):
        return
    view = snapshot(sweep.study)  # read once for the repeat check and the preflight
    if settle_repeat(sweep, trial, view):
        return
    predicted = sweep.predictor(config)
    if settle_prediction(sweep, trial, config, predicted, view):
        return
    result = measure(sweep, trial, config)
    if result is not None:
        result.memory.predicted_peak_gib = predicted
        after = tell(sweep, trial, config, result)
        if result.status == "complete":  # a measured peak: the preflight learns the machine from it
            update_calibration(sweep.study, sweep.predictor, device_kind(), after)


def record_interrupted(sweep: _Sweep, trial: optuna.Trial, reason: str | None = None) -> None:
    """Tell ``trial`` FAIL as not run to its end (``interrupted``, not counted) and queue its params again, without
    using up one of its ``max_retries`` (the configuration did nothing wrong): the next ``sweep run`` measures it.
    The default reason names what stopped the sweep (``interrupted: Ctrl-C``, ``interrupted: SIGTERM``)."""
    trial.set_user_attr("status", TrialStatus.CRASH.value)
    trial.set_user_attr("reason", reason or f"interrupted: {STOP_CAUSE['by']}")
    trial.set_user_attr("interrupted", True)
    retry(sweep.study, trial, sweep.max_retries, count=False)
    sweep.study.tell(trial, state=TrialState.FAIL)


def wait_for_same(sweep: _Sweep, trial: optuna.Trial) -> bool:
    """Wait while an earlier trial with the same params runs (another slot or machine was asked the same
    configuration: a retry, or a sampler without a lie for it); its result is then reused
    (:func:`settle_repeat`) instead of measured twice. Only earlier numbers are waited for, so two such trials
    never wait on each other.

    Returns:
        False when Ctrl-C came meanwhile: the trial is recorded as interrupted.
    """
    params = trial.params
    try:
        while not sweep.interrupted.is_set():
            with sweep.lock.held():
                sweep.fail_stale()  # the earlier trial's sweep may be dead or silent: it would never end
            running = [
                t.number
                for t in sweep.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.number < trial.number and t.params == params
            ]
            if not running:
                break
            sweep.interrupted.wait(POLL_S)
    except KeyboardInterrupt:
        record_interrupted(sweep, trial)
        raise
    if sweep.interrupted.is_set():
        record_interrupted(sweep, trial)
        return False
    return True


def settle_repeat(sweep: _Sweep, trial: optuna.Trial, view: StudySnapshot) -> bool:
    """Tell a repeat of a measured configuration with that trial's state, values and attributes, marked
    ``duplicate_of``; count consecutive repeats.

    Returns:
        Whether ``trial`` was a repeat (and is now told).
    """
    longest = sweep.plan.longest_sample_tokens
    same = find_duplicate(view, trial.params, sweep.space.trial_config(trial.params), sweep.plan.setup, longest)
    with sweep.mutex:
        sweep.repeats = sweep.repeats + 1 if same is not None else 0
    if same is None:
        return False
    for key, value in same.user_attrs.items():
        if key not in _BOOKKEEPING_ATTRS:
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", same.number)
    reason = f"same configuration as trial {same.number}: its result is reused"
    mine, theirs = trial.params.get("max_seq_length"), same.params.get("max_seq_length")
    if mine != theirs and longest is not None:
        reason = (
            f"max_seq_length {mine} trains the same rows as {theirs} on this data (longest {longest:,} tokens): "
            f"trial {same.number}'s result is reused"
        )
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("wall_time_s", 0.0)
    trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(same.user_attrs["status"]))
    frozen = sweep.study.tell(trial, same.values if same.state == TrialState.COMPLETE else None, state=same.state)
    sweep.emit(frozen)
    return True


def settle_prediction(
    sweep: _Sweep, trial: optuna.Trial, config: TrialConfig, predicted: float | None, view: StudySnapshot
) -> bool:
    """Prune a configuration that cannot fit, without running it (:func:`sweeper.memory.preflight`): its
    prediction corrected by the study's measured/predicted ratio (:class:`sweeper.memory.Calibration`, recorded as
    ``corrected_peak_gib``), the dominance rule of this machine's device.

    Returns:
        Whether ``trial`` was pruned (and is now told).
    """
    kind = device_kind()
    calibration = stored_calibration(view, kind)
    if calibration is not None and predicted is not None:
        trial.set_user_attr(CORRECTED_ATTR, calibration.correct(config, predicted))
    decision = preflight(config, predicted, known_memory(view, kind), device=trial_device(), calibration=calibration)
    if decision is None:
        return False
    result = TrialResult(
        status=TrialStatus(decision[0]),
        reason=decision[1],
        memory=MemoryReading(predicted_peak_gib=predicted),
        provenance=Provenance(
            wall_time_s=0.0, lora_alpha=config.lora_alpha, effective_batch_size=config.effective_batch_size
        ),
    )
    record_result(trial, result, config)
    trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(result.status))
    sweep.emit(sweep.study.tell(trial, state=TrialState.PRUNED))
    return True


def measure(sweep: _Sweep, trial: optuna.Trial, config: TrialConfig) -> TrialResult | None:
    """Run the trial in this worker slot's trial process (:class:`sweeper.trial.TrialProcess`, warm or fresh).

    Returns:
        Its result, or None when Ctrl-C killed it (it is then recorded as interrupted).

    Raises:
        RunError: The trial's files cannot be written (it is recorded as not run and queued again).
        KeyboardInterrupt: Ctrl-C with one worker slot, after recording the trial as interrupted.
    """
    pids: list[int] = []

    def started(pid: int) -> None:
        trial.set_user_attr("worker_pid", pid)
        pids.append(pid)
        with sweep.mutex:
            sweep.trial_pids.add(pid)
        if sweep.interrupted.is_set():  # Ctrl-C came while this trial process was starting
            os.killpg(pid, signal.SIGKILL)

    folder = trial_dir(sweep.name, trial.number)
    sweep.started(trial)
    process: TrialProcess = sweep.local.process  # set by run_slot for this thread
    try:
        result = process.run(
            config,
            folder,
            model_path=sweep.model_path,
            on_start=started,
            on_progress=lambda progress: sweep.progress(trial.number, progress),
        )
    except KeyboardInterrupt:  # one slot, in the main thread: the trial process was killed
        record_interrupted(sweep, trial)
        raise
    except OSError as exc:  # the trial's files cannot be written: disk full, folder made read-only meanwhile
        record_interrupted(sweep, trial, f"not run: cannot write {folder} ({exc.strerror})")
        raise RunError(
            f"{folder}: cannot write the trial's files ({exc.strerror}); trial {trial.number} is "
            "recorded as not run and queued again; fix the disk and run the same command: finished "
            "trials are kept"
        ) from None
    finally:
        with sweep.mutex:
            sweep.trial_pids.difference_update(pids)
    if sweep.interrupted.is_set():  # Ctrl-C with worker threads: interrupt() killed this trial process
        record_interrupted(sweep, trial)
        return None
    return result


def tell(sweep: _Sweep, trial: optuna.Trial, config: TrialConfig, result: TrialResult) -> StudySnapshot | None:
    """Store the result and its artifacts, tell the study (COMPLETE with its objectives' values, PRUNED for a result
    about the configuration, FAIL otherwise) and queue a retry of a crash or timeout.

    Returns:
        The study as read once after the trial was told (:meth:`_Sweep.emit`), or None when another sweep had
        ended the trial meanwhile."""
    try:
        record_result(trial, result, config)
        _upload_artifacts(sweep.name, trial, result)
        trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(result.status))
        if result.status == "complete":
            frozen = sweep.study.tell(trial, sweep.objective_values(result))
        elif result.status.pruned:
            frozen = sweep.study.tell(trial, state=TrialState.PRUNED)
        else:
            if result.status.retried and retry(sweep.study, trial, sweep.max_retries):
                trial.set_user_attr("retried", True)
            frozen = sweep.study.tell(trial, state=TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        sweep.note(
            f"trial {trial.number}: another sweep marked it lost while it ran (this process sent no "
            "heartbeat: was it frozen?); its retry measures it again; this run's files are in "
            f"{trial_dir(sweep.name, trial.number)}"
        )
        return None
    return sweep.emit(frozen)


def _upload_artifacts(study_name: str, trial: optuna.Trial, result: TrialResult) -> None:
    """The trial's trace, loss curve and failing batch to the study's artifact store (:mod:`sweeper.study._artifacts`);
    a full or read-only disk loses the artifacts, not the trial."""
    try:
        upload_trial_artifacts(trial, result, trial_dir(study_name, trial.number), artifact_store(study_name))
    except OSError as exc:
        warnings.warn(f"trial {trial.number}: artifacts not stored ({exc})", stacklevel=2)


def run_study(plan: SweepPlan, callbacks: Sequence[SweepCallback] = ()) -> optuna.Study:
    """Run the planned sweep (:func:`sweeper.study.plan_sweep`) until its study holds ``n_trials`` finished trials,
    or its ``timeout_s`` has passed, or the sampler proposed only configurations already measured
    ``plan.max_consecutive_repeats`` times in a row.

    Several ``run_study`` calls (processes, machines) may share one study: they never start more than ``n_trials``
    trials between them (:class:`sweeper.study._coordination.AskLock`), and find each other's dead or silent trials
    (:func:`sweeper.study._recovery.fail_stale_trials`).

    Args:
        plan: The checked sweep, its study opened.
        callbacks: Told of each trial started and finished, and of bookkeeping notes (:class:`SweepCallback`).

    Returns:
        The plan's study.

    Raises:
        StudyError: The storage cannot be written.
        RunError: The studies folder's disk is full, or a trial's files cannot be written.
        KeyboardInterrupt: After the running trials were killed and recorded as interrupted.
    """
    study, space = plan.study, plan.space
    if "space_path" not in study.user_attrs:
        study.set_user_attr("space_path", space.path)
        study.set_user_attr("searched", list(space.search))
    if study.user_attrs.get("model_path") != plan.model_path:
        study.set_user_attr("model_path", plan.model_path)  # the local checkpoint the trials loaded (for exports)
    sweep = _Sweep(plan, callbacks)
    with sweep.lock.held():
        starts = int(study.user_attrs.get("sweep_starts", 0))
        if count_finished(study) < plan.n_trials:  # a run with nothing to start does not shift later runs' seeds
            study.set_user_attr("sweep_starts", starts + 1)
    if starts and space.study.seed is not None:
        # Every sweep of the study (started together on several machines, or resuming) samples from its own seed:
        # with one seed they would all propose the same first configurations.
        study.sampler = make_sampler(space.study, plan.n_trials, seed=space.study.seed + starts)
    if plan.workers == 1:
        sweep.run_slot(0)  # in this thread: Ctrl-C reaches TrialProcess.run, which kills the trial process
    else:
        _run_slots(sweep)
    return study


def _run_slots(sweep: _Sweep) -> None:
    """Run the sweep's worker slots in threads until each has recorded its last trial; Ctrl-C kills the running
    trial processes, waits for each slot to record its trial as interrupted, and is raised again."""
    done = [threading.Event() for _ in range(sweep.workers)]
    threads = [
        threading.Thread(target=sweep.slot_main, args=(i, done[i]), name=f"sweep-slot-{i}")
        for i in range(sweep.workers)
    ]
    for thread in threads:
        thread.start()
    # The main thread waits by polling, never inside Thread.join: in CPython 3.11 a KeyboardInterrupt that lands
    # in join can mark a running thread as stopped, and the interpreter would then exit without it.
    try:
        while not all(d.is_set() for d in done):
            time.sleep(0.2)
    except KeyboardInterrupt:
        sweep.interrupt()
        while not all(d.is_set() for d in done):  # each slot records its killed trial as interrupted
            try:
                time.sleep(0.1)
            except KeyboardInterrupt:
                continue  # a second Ctrl-C: the trials are being recorded, which takes a moment
        raise
    for thread in threads:
        thread.join()
    if sweep.errors:
        raise sweep.errors[0]
