"""A running sweep, in one home: :class:`RunningSweep`, the state its worker slots share (the plan, the study, the
ask lock and heartbeats, the callbacks it tells, asking the sampler), and the steps of one asked trial and a worker
slot's loop over them (:func:`run_slot`): wait for a running trial of the same configuration, settle a repeat without
running it, settle what the preflight prunes, measure it in a trial process, and tell the study. A trial's path
(:func:`run_slot` -> :meth:`RunningSweep.ask` -> :func:`run_one` -> :func:`measure` -> :func:`tell`) stays in this
module.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper.devices import device_kind
from sweeper.errors import STOP_CAUSE, RunError
from sweeper.memory import preflight
from sweeper.notation import repeat_reason
from sweeper.space import TrialConfig
from sweeper.storage import (
    AskLock,
    Heartbeat,
    TrialAttr,
    check_disk,
    fail_stale_trials,
    retry,
    storage_of,
    study_dir,
    trial_dir,
    trial_id,
)
from sweeper.study import (
    StudySnapshot,
    artifact_store,
    record_repeat,
    record_result,
    snapshot,
    stored_calibration,
    stored_trial,
    study_objectives,
    to_distributions,
    update_calibration,
    upload_trial_artifacts,
)
from sweeper.sweep._callbacks import SweepCallback, SweepEvent, SweepStop
from sweeper.sweep._duplicates import CUDA_ONLY_KEYS, find_duplicate
from sweeper.sweep._plan import SweepPlan
from sweeper.sweep._preflight import known_memory, trial_device
from sweeper.sweep._slots import slot_env
from sweeper.trial import (
    Measures,
    MemoryReading,
    Provenance,
    TrialProcess,
    TrialProgress,
    TrialResult,
    TrialStartError,
    TrialStatus,
)

#: Seconds a worker slot waits before looking again when the trials still needed are all running elsewhere.
POLL_S = 2.0


class RunningSweep:
    """One ``sweep run`` process while it runs: its worker slots (threads when more than one) share the study, the ask
    lock, the consecutive-repeat count, the running trial processes and Ctrl-C. The steps of a trial
    (the functions of this module) take it as their one argument; it is the sweep package's own (not on its
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
        return [o.value_of(result) for o in self.objectives]

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
            interval = Heartbeat.interval_s(self.study)
            if interval is not None:
                trial.set_user_attr(TrialAttr.HEARTBEAT_INTERVAL_S, interval)
            return trial


def run_one(sweep: RunningSweep, trial: optuna.Trial) -> None:
    """Settle, or measure and tell, one asked trial."""
    config = sweep.space.trial_config(trial.params)
    if not wait_for_same(sweep, trial):
        return
    view = sweep.view  # as read when this trial was asked, or after it waited: for the repeat check and the preflight
    if settle_repeat(sweep, trial, view):
        return
    predicted = sweep.predictor(config)
    if settle_prediction(sweep, trial, config, predicted, view):
        return
    result = measure(sweep, trial, config)
    if result is not None:
        result.memory.predicted_peak_gib = predicted
        after = tell(sweep, trial, config, result)
        if result.status == TrialStatus.COMPLETE:  # a measured peak: the preflight learns the machine from it
            update_calibration(sweep.study, sweep.predictor, device_kind(), after)


def record_interrupted(sweep: RunningSweep, trial: optuna.Trial, reason: str | None = None) -> None:
    """Tell ``trial`` FAIL as not run to its end (``interrupted``, not counted) and queue its params again, without
    using up one of its ``max_retries`` (the configuration did nothing wrong): the next ``sweep run`` measures it.
    The default reason names what stopped the sweep (``interrupted: Ctrl-C``, ``interrupted: SIGTERM``)."""
    trial.set_user_attr(TrialAttr.STATUS, TrialStatus.CRASH.value)
    trial.set_user_attr(TrialAttr.REASON, reason or f"interrupted: {STOP_CAUSE['by']}")
    trial.set_user_attr(TrialAttr.INTERRUPTED, True)
    retry(sweep.study, trial, sweep.max_retries, count=False)
    sweep.study.tell(trial, state=TrialState.FAIL)


def wait_for_same(sweep: RunningSweep, trial: optuna.Trial) -> bool:
    """Wait while an earlier trial with the same params runs (another slot or machine was asked the same
    configuration: a retry, or a sampler without a lie for it); its result is then reused
    (:func:`settle_repeat`) instead of measured twice: after a wait the sweep's view of the study is read again. Only
    earlier numbers are waited for, so two such trials never wait on each other.

    Returns:
        False when Ctrl-C came meanwhile: the trial is recorded as interrupted.
    """
    params = trial.params
    if not any(t.number < trial.number and t.params == params for t in sweep.view.trials_in((TrialState.RUNNING,))):
        return True  # none ran when this trial was asked: nothing to wait for, and nothing read
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
    # the earlier trial ended while this one waited, here or on another machine: the view as read at the ask does
    # not hold it, and the repeat check must see it to reuse its result
    view = snapshot(sweep.study, stale=False)
    with sweep.mutex:
        sweep.view = view
    return True


def settle_repeat(sweep: RunningSweep, trial: optuna.Trial, view: StudySnapshot) -> bool:
    """Tell a repeat of a measured configuration with that trial's state, values and attributes, marked
    ``duplicate_of``; count consecutive repeats.

    Returns:
        Whether ``trial`` was a repeat (and is now told).
    """
    longest = sweep.plan.longest_sample_tokens
    cpu = device_kind() == "cpu_peak_rss"
    same = find_duplicate(view, trial.params, sweep.space.trial_config(trial.params), sweep.plan.setup, longest, cpu)
    with sweep.mutex:
        sweep.repeats = sweep.repeats + 1 if same is not None else 0
    if same is None:
        return False
    mine, theirs = trial.params.get("max_seq_length"), same.params.get("max_seq_length")
    reason = repeat_reason(same.number, mine, theirs, longest)
    moved = [k for k in CUDA_ONLY_KEYS if trial.params.get(k) != same.params.get(k)]
    if cpu and moved:  # the same measurement on the CPU: say why, not "the same configuration"
        reason = f"{', '.join(moved)} moves only the CUDA allocator, nothing on the CPU: " + reason
    record_repeat(trial, same, reason)
    frozen = sweep.study.tell(trial, same.values if same.state == TrialState.COMPLETE else None, state=same.state)
    sweep.emit(frozen)
    return True


def settle_prediction(
    sweep: RunningSweep, trial: optuna.Trial, config: TrialConfig, predicted: float | None, view: StudySnapshot
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
        trial.set_user_attr(TrialAttr.CORRECTED_PEAK_GIB, calibration.correct(config, predicted))
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
    sweep.emit(sweep.study.tell(trial, state=TrialState.PRUNED))
    return True


def measure(sweep: RunningSweep, trial: optuna.Trial, config: TrialConfig) -> TrialResult | None:
    """Run the trial in this worker slot's trial process (:class:`sweeper.trial.TrialProcess`, warm or fresh).

    Returns:
        Its result, or None when Ctrl-C killed it (it is then recorded as interrupted).

    Raises:
        RunError: The trial's files cannot be written (it is recorded as not run and queued again).
        KeyboardInterrupt: Ctrl-C with one worker slot, after recording the trial as interrupted.
    """
    pids: list[int] = []

    def started(pid: int) -> None:
        trial.set_user_attr(TrialAttr.WORKER_PID, pid)
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
            measures=Measures(worst_case_samples=sweep.plan.worst_case_samples(config) or ()),
        )
    except KeyboardInterrupt:  # one slot, in the main thread: the trial process was killed
        record_interrupted(sweep, trial)
        raise
    except TrialStartError as exc:  # not the disk: this user cannot run the interpreter, or the venv is gone
        record_interrupted(sweep, trial, f"not run: {exc}")
        raise RunError(
            f"{exc}; trial {trial.number} is recorded as not run and queued again; run the sweep as a user who may "
            "execute that Python (and read its packages), or reinstall the environment, then the same command: "
            "finished trials are kept"
        ) from None
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


def tell(sweep: RunningSweep, trial: optuna.Trial, config: TrialConfig, result: TrialResult) -> StudySnapshot | None:
    """Store the result and its artifacts, tell the study (COMPLETE with its objectives' values, PRUNED for a result
    about the configuration, FAIL otherwise) and queue a retry of a crash or timeout.

    Returns:
        The study as read once after the trial was told (:meth:`RunningSweep.emit`), or None when another sweep had
        ended the trial meanwhile."""
    try:
        record_result(trial, result, config)
        _upload_artifacts(sweep.name, trial, result)
        if result.status == TrialStatus.COMPLETE:
            frozen = sweep.study.tell(trial, sweep.objective_values(result))
        elif result.status.pruned:
            frozen = sweep.study.tell(trial, state=TrialState.PRUNED)
        else:
            if result.status.retried and retry(sweep.study, trial, sweep.max_retries):
                trial.set_user_attr(TrialAttr.RETRIED, True)
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


def run_slot(sweep: RunningSweep, slot: int) -> None:
    """Run trials in this worker slot until the sweep stops."""
    device = sweep.devices[slot]
    env = slot_env(device, sweep.workers)
    # The slot's warm trial process (sweeper.trial.TrialProcess): started at its first trial, reused while
    # trials end complete or diverged, ended with the slot.
    sweep.local.process = TrialProcess(env, warm=sweep.warm)
    sweep.local.slot = slot
    try:
        while not sweep.stop.is_set():
            check_disk(study_dir(sweep.name), storage=sweep.plan.storage)
            try:
                trial = sweep.ask(device)
            except SweepStop:
                return
            if trial is None:
                sweep.stop.wait(POLL_S)
                continue
            heartbeat = Heartbeat.of(sweep.study, trial)
            try:
                run_one(sweep, trial)
            finally:
                heartbeat.stop()
    finally:
        sweep.local.process.close()


def slot_main(sweep: RunningSweep, slot: int, done: threading.Event) -> None:
    """A worker slot's thread: an error stops every slot from starting more trials and is raised by the main
    thread; ``done`` is set when the slot has recorded its last trial."""
    try:
        run_slot(sweep, slot)
    except BaseException as exc:
        with sweep.mutex:
            sweep.errors.append(exc)
        sweep.stop.set()
    finally:
        done.set()
