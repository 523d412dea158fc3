"""The sweep's run loop: ask a trial, reuse a repeat, prune a predicted OOM, or run it in a worker process and tell
the study its outcome; retries of what may go differently another time; several worker slots (threads) per process
and several processes per study (see :mod:`sweeper._coordination`).

Resuming: running the same command again loads the study; trials left RUNNING by a sweep that died on this host are
marked failed and their configuration retried (:func:`recover_orphans`), as are those whose sweep stopped sending
heartbeats anywhere (:func:`reap_lost`); the loop stops when the study holds ``n_trials`` finished trials.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from sweeper._coordination import GRACE_INTERVALS, AskLock, Heartbeat, heartbeat_enabled, stale_trial_ids
from sweeper.errors import RunError, StudyError
from sweeper.preflight import preflight
from sweeper.space import SearchSpace
from sweeper.study import (
    FAILURE_CONSTRAINT,
    count_finished,
    default_storage,
    failure_constraint,
    is_finished,
    make_sampler,
    open_study,
    record_result,
    study_dir,
    to_distributions,
    trial_dir,
)
from sweeper.trial import PRUNED_STATUSES, TrialResult, run_trial


#: Consecutive repeats of measured configurations after which the sweep stops: the sampler has nothing new to offer.
MAX_CONSECUTIVE_DUPLICATES = 25


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Statuses whose configuration is run again (up to ``max_retries``): they may go differently another time.
RETRIED_STATUSES = ("crash", "timeout")


def retry(study: optuna.Study, trial: FrozenTrial | optuna.Trial, max_retries: int) -> bool:
    """Queue ``trial``'s params again when it has been retried fewer than ``max_retries`` times; the new trial carries
    ``retry_of`` (the first attempt's number) and ``retry_attempt``.

    Returns:
        Whether a retry was queued.
    """
    attempt = int(trial.user_attrs.get("retry_attempt", 0))
    if attempt >= max_retries:
        return False
    first = trial.user_attrs.get("retry_of", trial.number)
    study.enqueue_trial(trial.params, user_attrs={"retry_of": first, "retry_attempt": attempt + 1},
                        skip_if_exists=False)
    return True


def _fail_running(study: optuna.Study, trial: FrozenTrial, reason: str, max_retries: int) -> bool:
    """Mark another sweep's RUNNING trial failed (``crash``, ``interrupted``, with ``reason``) and queue its retry.

    Returns:
        False when the trial had ended meanwhile (told by its own sweep, or failed by another one): nothing done.
    """
    storage = study._storage  # optuna has no public API to end another process's trial
    try:
        storage.set_trial_user_attr(trial._trial_id, "status", "crash")
        storage.set_trial_user_attr(trial._trial_id, "reason", reason)
        storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
        storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:
        return False
    retry(study, trial, max_retries)
    return True


def recover_orphans(study: optuna.Study, max_retries: int = 1) -> list[int]:
    """Fail the RUNNING trials whose sweep process on this host is gone, and retry their params (up to
    ``max_retries`` times for one configuration).

    Returns:
        The numbers of the trials marked failed.
    """
    host = socket.gethostname()
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get("sweep_pid")
        if t.user_attrs.get("sweep_host") != host or pid is None or _pid_alive(int(pid)):
            continue
        # Its worker died with it (PR_SET_PDEATHSIG, see sweeper.trial); its pid may belong to another process now.
        if _fail_running(study, t, f"interrupted: the sweep process (pid {pid}) stopped while this trial ran",
                         max_retries):
            recovered.append(t.number)
    return recovered


def reap_lost(study: optuna.Study, max_retries: int = 1) -> list[int]:
    """Fail the RUNNING trials whose sweep stopped sending Optuna heartbeats (killed on another machine, frozen,
    its machine gone: see :mod:`sweeper._coordination`), with reason ``lost``, and retry their params. Only trials
    whose sweep beats at least as often as this one (``heartbeat_interval_s``) are judged here.

    Returns:
        The numbers of the trials marked failed.
    """
    stale = set(stale_trial_ids(study))
    if not stale:
        return []
    interval = study._storage.get_heartbeat_interval()  # stale_trial_ids found some: the storage beats
    grace = GRACE_INTERVALS * interval
    lost = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        # A sweep that beats less often than this one is judged by its own, longer grace period: by a sweep with
        # its interval or longer, or by its pid on its own host.
        if t._trial_id not in stale or t.user_attrs.get("heartbeat_interval_s", interval) > interval:
            continue
        who = f"pid {t.user_attrs.get('sweep_pid', '?')} on {t.user_attrs.get('sweep_host', '?')}"
        if _fail_running(study, t, f"lost: its sweep ({who}) sent no heartbeat for {grace} s", max_retries):
            lost.append(t.number)
    return lost


#: User attributes that describe one run of a trial rather than its configuration's result (not copied to duplicates).
_BOOKKEEPING_ATTRS = ("sweep_host", "sweep_pid", "worker_pid", "retry_of", "retry_attempt", "retried", "interrupted",
                      "duplicate_of", "cuda_visible_devices", "heartbeat_interval_s")


def find_duplicate(study: optuna.Study, params: dict[str, Any]) -> FrozenTrial | None:
    """A COMPLETE or PRUNED trial with exactly these params, or None.

    TPE re-proposes configurations it already measured, often in small categorical spaces; a trial's outcome is
    deterministic up to measurement noise (fixed seed, same samples), so a repeat costs GPU time and teaches nothing.
    FAIL trials (timeout, crash, error) are not reused: they may go differently another time.
    """
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if t.params == params and "status" in t.user_attrs:
            return t
    return None


def _reuse(study: optuna.Study, trial: optuna.Trial, same: FrozenTrial) -> tuple[FrozenTrial, TrialResult]:
    """Tell ``trial`` with the state, values and attributes of ``same`` (same params), marked ``duplicate_of``."""
    reason = f"same configuration as trial {same.number}: its result is reused"
    for key, value in same.user_attrs.items():
        if key not in _BOOKKEEPING_ATTRS:
            trial.set_user_attr(key, value)
    trial.set_user_attr("duplicate_of", same.number)
    trial.set_user_attr("reason", reason)
    trial.set_user_attr("wall_time_s", 0.0)
    trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(same.user_attrs["status"]))
    frozen = study.tell(trial, same.values if same.state == TrialState.COMPLETE else None, state=same.state)
    return frozen, TrialResult.from_dict(frozen.user_attrs)


@dataclass(frozen=True, kw_only=True)
class SweepEvent:
    """What the run loop reports after each trial.

    Attributes:
        trial: The trial as stored (state, params, user attributes).
        result: The worker's result.
        finished: Finished trials in the study now.
        n_trials: The target.
    """

    trial: FrozenTrial
    result: TrialResult
    finished: int
    n_trials: int


#: Free space (MiB) the studies folder's disk must have before a trial starts: a trial writes its log, result,
#: trace and artifacts (tens of KiB on the demo, up to a few MiB with a long nan_batch.jsonl) and SQLite grows.
MIN_FREE_MIB = 64

#: Seconds a worker waits before looking again when the trials still needed are all running elsewhere.
POLL_S = 2.0


def check_disk(folder: Path, min_free_mib: float = MIN_FREE_MIB) -> None:
    """Raise before a trial starts when ``folder``'s disk (or its nearest existing parent's) is nearly full.

    Raises:
        RunError: Less than ``min_free_mib`` MiB free.
    """
    probe = Path(folder).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_mib = shutil.disk_usage(probe).free / 2**20
    if free_mib < min_free_mib:
        raise RunError(f"{folder}: only {free_mib:.0f} MiB free on its disk (a trial needs {min_free_mib} MiB for its "
                       "files); free some space and run the same command: finished trials are kept")


def check_writable(folder: Path) -> None:
    """Create ``folder`` (the study's folder under ``studies/``) and check it can be written, before any trial.

    Raises:
        StudyError: It cannot be created or written (permissions, a read-only mount).
    """
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StudyError(f"{folder}: cannot create the study's folder ({exc.strerror}); run from a folder you can "
                         "write, or fix its permissions") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StudyError(f"{folder}: the study's folder is not writable (trial logs, results and artifacts go "
                         "there); fix its permissions or run from another folder")


def slot_devices(workers: int, devices: list[str] | None) -> list[str | None]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each of ``workers`` worker slots (None: leave the environment as is).

    ``devices`` given: slot i gets ``devices[i % len(devices)]``. Not given, with several workers and GPUs visible:
    the GPUs this process may use (its own ``CUDA_VISIBLE_DEVICES``, else every ``/dev/nvidiaN``), in turn. One
    worker and no ``--devices`` keeps the environment: the worker sees what the sweep sees.
    """
    from sweeper._worker import _cuda_visible

    if devices:
        return [devices[i % len(devices)] for i in range(workers)]
    if workers > 1 and _cuda_visible():
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if not visible:
            visible = sorted((p.name.removeprefix("nvidia") for p in Path("/dev").glob("nvidia[0-9]*")), key=int)
        if visible:
            return [visible[i % len(visible)] for i in range(workers)]
    return [None] * workers


def slot_env(device: str | None, workers: int) -> dict[str, str] | None:
    """A worker slot's environment: its device in ``CUDA_VISIBLE_DEVICES``, and with several workers an equal share
    of the CPU cores in ``OMP_NUM_THREADS`` (unless set), so that N CPU trials do not each start a thread per core."""
    if device is None and workers == 1:
        return None
    env = dict(os.environ)
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    if workers > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    return env


class _Stop(Exception):
    """Internal: this worker slot has nothing more to run."""


class _Sweep:
    """One ``sweep run`` process: its worker slots (threads when more than one) share the study, the ask lock, the
    consecutive-repeat count and Ctrl-C."""

    def __init__(self, space: SearchSpace, study: optuna.Study, *, url: str, name: str, model_path: str, target: int,
                 budget: float | None, on_trial, on_note, on_start, workers: int, devices: list[str | None]):
        self.space, self.study, self.name, self.model_path = space, study, name, model_path
        self.target, self.budget, self.on_trial, self.on_note = target, budget, on_trial, on_note
        self.on_start = on_start
        self.workers, self.devices = workers, devices
        self.max_retries = int(space.fixed.get("max_retries", 1))
        self.predictor = memory_predictor(model_path, space.model.name_or_path, space.model.attn_implementation)
        self.distributions = to_distributions(space)
        self.lock = AskLock(url, name)
        self.mutex = threading.Lock()  # repeats, printing, the set of running workers
        self.start = time.monotonic()
        self.repeats = 0
        self.stop = threading.Event()
        self.interrupted = threading.Event()
        self.worker_pids: set[int] = set()
        self.errors: list[BaseException] = []

    def note(self, text: str) -> None:
        if self.on_note is not None:
            with self.mutex:
                self.on_note(text)

    def emit(self, event: SweepEvent) -> None:
        if self.on_trial is not None:
            with self.mutex:
                self.on_trial(event)

    def reap(self) -> None:
        """Fail and retry the trials of sweeps that died on this host or went silent anywhere (under the lock)."""
        for number in recover_orphans(self.study, self.max_retries):
            self.note(f"trial {number}: its sweep process is gone; marked interrupted, its configuration runs again")
        for number in reap_lost(self.study, self.max_retries):
            self.note(f"trial {number}: its sweep sent no heartbeat; marked lost, its configuration runs again")

    def next_trial(self, device: str | None) -> tuple[optuna.Trial, int] | None:
        """Under the ask lock: a new trial and the finished count, or None when this slot should wait (the trials
        still needed are running elsewhere).

        Raises:
            _Stop: ``n_trials`` reached, the time budget spent, too many repeats, or Ctrl-C.
        """
        with self.lock.held():
            if self.stop.is_set():
                raise _Stop
            self.reap()
            trials = self.study.get_trials(deepcopy=False)
            finished = sum(1 for t in trials if is_finished(t))
            running = sum(1 for t in trials if t.state == TrialState.RUNNING)
            if (finished >= self.target or self.repeats >= MAX_CONSECUTIVE_DUPLICATES
                    or (self.budget is not None and time.monotonic() - self.start >= self.budget)):
                raise _Stop
            if finished + running >= self.target:
                return None
            trial = self.study.ask(self.distributions)
            trial.set_user_attr("sweep_host", socket.gethostname())
            trial.set_user_attr("sweep_pid", os.getpid())
            if device is not None:
                trial.set_user_attr("cuda_visible_devices", device)
            if heartbeat_enabled(self.study._storage):
                trial.set_user_attr("heartbeat_interval_s", self.study._storage.get_heartbeat_interval())
            return trial, finished

    def run_slot(self, slot: int) -> None:
        """Run trials in this slot until the sweep stops."""
        device = self.devices[slot]
        env = slot_env(device, self.workers)
        while not self.stop.is_set():
            check_disk(study_dir(self.name))
            try:
                asked = self.next_trial(device)
            except _Stop:
                return
            if asked is None:
                self.stop.wait(POLL_S)
                continue
            trial, finished = asked
            heartbeat = Heartbeat(self.study._storage, trial._trial_id)
            try:
                self.run_one(trial, finished, env)
            finally:
                heartbeat.stop()

    def slot_main(self, slot: int, done: threading.Event) -> None:
        """A worker thread's body: an error stops every slot from starting more trials and is raised by the main
        thread; ``done`` is set when the slot has recorded its last trial."""
        try:
            self.run_slot(slot)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            with self.mutex:
                self.errors.append(exc)
            self.stop.set()
        finally:
            done.set()

    def interrupt(self) -> None:
        """Ctrl-C with worker threads: stop starting trials and kill every running worker's process group; each
        slot then records its trial as interrupted."""
        self.interrupted.set()
        self.stop.set()
        with self.mutex:
            pids = list(self.worker_pids)
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _record_interrupted(self, trial: optuna.Trial, reason: str = "interrupted: Ctrl-C") -> None:
        """Tell ``trial`` FAIL as not run to its end (``interrupted``, not counted) and queue its params again: the
        next `sweep run` measures it."""
        trial.set_user_attr("status", "crash")
        trial.set_user_attr("reason", reason)
        trial.set_user_attr("interrupted", True)
        retry(self.study, trial, self.max_retries)
        self.study.tell(trial, state=TrialState.FAIL)

    def wait_for_same(self, trial: optuna.Trial) -> None:
        """Wait while an earlier trial with the same params runs (another worker or machine was asked the same
        configuration: a retry, or a sampler without a lie for it); its result is then reused (:func:`find_duplicate`)
        instead of measured twice. Only earlier numbers are waited for, so two such trials never wait on each other.
        """
        params = trial.params
        while not self.interrupted.is_set():
            with self.lock.held():
                self.reap()  # the earlier trial's sweep may be dead or silent: it would never end on its own
            running = [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                       if t.number < trial.number and t.params == params]
            if not running:
                return
            self.interrupted.wait(POLL_S)

    def run_one(self, trial: optuna.Trial, finished: int, env: dict[str, str] | None) -> None:
        """Reuse, prune or run one asked trial and tell the study its outcome."""
        study, target = self.study, self.target
        config = self.space.trial_config(trial.params)
        try:
            self.wait_for_same(trial)
        except KeyboardInterrupt:
            self._record_interrupted(trial)
            raise
        if self.interrupted.is_set():
            self._record_interrupted(trial)
            return
        same = find_duplicate(study, trial.params)
        with self.mutex:
            self.repeats = self.repeats + 1 if same is not None else 0
        if same is not None:
            frozen, result = _reuse(study, trial, same)
            self.emit(SweepEvent(trial=frozen, result=result, finished=finished, n_trials=target))
            return
        predicted = self.predictor(config.to_dict())
        decision = preflight(config.to_dict(), predicted, _known_memory(study))
        if decision is not None:
            result = TrialResult(status=decision[0], reason=decision[1], predicted_peak_gib=predicted,
                                 wall_time_s=0.0, lora_alpha=config.lora_alpha,
                                 effective_batch_size=config.effective_batch_size)
            record_result(trial, result, config.to_dict())
            trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(result.status))
            frozen = study.tell(trial, state=TrialState.PRUNED)
            self.emit(SweepEvent(trial=frozen, result=result, finished=count_finished(study), n_trials=target))
            return

        pids: list[int] = []

        def started(pid: int) -> None:
            trial.set_user_attr("worker_pid", pid)
            pids.append(pid)
            with self.mutex:
                self.worker_pids.add(pid)
            if self.interrupted.is_set():  # Ctrl-C came while this worker was starting
                os.killpg(pid, signal.SIGKILL)

        folder = trial_dir(self.name, trial.number)
        if self.on_start is not None:
            with self.mutex:
                self.on_start(trial.number, dict(trial.params), trial.user_attrs.get("cuda_visible_devices"))
        try:
            result = run_trial(config, folder, model_path=self.model_path, env=env, on_start=started)
        except KeyboardInterrupt:  # one worker, in the main thread: run_trial killed it
            self._record_interrupted(trial)
            raise
        except OSError as exc:  # the trial's files cannot be written: disk full, folder made read-only meanwhile
            self._record_interrupted(trial, f"not run: cannot write {folder} ({exc.strerror})")
            raise RunError(f"{folder}: cannot write the trial's files ({exc.strerror}); trial {trial.number} is "
                           "recorded as not run and queued again; fix the disk and run the same command: finished "
                           "trials are kept") from None
        finally:
            with self.mutex:
                self.worker_pids.difference_update(pids)
        if self.interrupted.is_set():  # Ctrl-C with worker threads: interrupt() killed this worker
            self._record_interrupted(trial)
            return
        result.predicted_peak_gib = predicted
        try:
            record_result(trial, result, config.to_dict())
            _upload_artifacts(self.name, trial, result)
            trial.set_constraint(FAILURE_CONSTRAINT, failure_constraint(result.status))
            if result.status == "complete":
                frozen = study.tell(trial, [result.peak_memory_gib, result.instability])
            elif result.status in PRUNED_STATUSES:
                frozen = study.tell(trial, state=TrialState.PRUNED)
            else:
                retried = result.status in RETRIED_STATUSES and retry(study, trial, self.max_retries)
                if retried:
                    trial.set_user_attr("retried", True)
                frozen = study.tell(trial, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            self.note(f"trial {trial.number}: another sweep marked it lost while it ran (this process sent no "
                      f"heartbeat: was it frozen?); its retry measures it again; this run's files are in {folder}")
            return
        self.emit(SweepEvent(trial=frozen, result=result, finished=count_finished(study), n_trials=target))


def run_study(
    space: SearchSpace,
    *,
    model_path: str,
    storage: str | None = None,
    study_name: str | None = None,
    n_trials: int | None = None,
    timeout_s: float | None = None,
    on_trial: Callable[[SweepEvent], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    on_start: Callable[[int, dict, str | None], None] | None = None,
    study: optuna.Study | None = None,
    workers: int = 1,
    devices: list[str] | None = None,
) -> optuna.Study:
    """Run trials until the study holds ``n_trials`` finished ones, or ``timeout_s`` has passed, or the sampler
    proposed only configurations already measured ``MAX_CONSECUTIVE_DUPLICATES`` times in a row.

    Several ``run_study`` calls (processes, machines) may share one study: they never start more than ``n_trials``
    trials between them (:class:`sweeper._coordination.AskLock`), and find each other's dead or silent trials
    (:func:`recover_orphans`, :func:`reap_lost`).

    Args:
        space: The validated space.
        model_path: From :func:`sweeper.model.resolve_model`.
        storage: Optuna storage URL; default ``space.study.storage`` or ``sqlite:///studies/<name>.db``.
        study_name: Default ``space.study.name``.
        n_trials: Default ``space.study.n_trials``; counted over the whole study.
        timeout_s: Default ``space.study.timeout_s``; checked between trials (a trial has its own timeout).
        on_trial: Called after each trial (from the worker's thread, one call at a time).
        on_note: Called with a line about the study's bookkeeping (a lost trial failed and retried).
        on_start: Called with a trial's number, params and device when its worker starts.
        study: The study, when the caller already opened it with :func:`open_study`; else it is opened here.
        workers: Trials run at once by this process (1 to 64), each in its own worker process.
        devices: ``CUDA_VISIBLE_DEVICES`` values given to the workers in turn (:func:`slot_devices`).

    Raises:
        StudyError: The storage cannot be opened or written.
        RunError: The studies folder's disk is full, or a trial's files cannot be written.
        KeyboardInterrupt: After the running trials were killed and recorded as interrupted.
    """
    name = study_name or space.study.name
    target = n_trials or space.study.n_trials
    budget = timeout_s if timeout_s is not None else space.study.timeout_s
    url = storage or space.study.storage or default_storage(name)
    if study is None:
        study = open_study(space, url, name, target)
    check_writable(study_dir(name))
    check_disk(study_dir(name))  # before any trial starts, and again before each
    if "space_path" not in study.user_attrs:
        study.set_user_attr("space_path", space.path)
        study.set_user_attr("searched", list(space.search))
    if study.user_attrs.get("model_path") != model_path:
        study.set_user_attr("model_path", model_path)  # the local checkpoint the trials loaded (for exports)
    sweep = _Sweep(space, study, url=url, name=name, model_path=model_path, target=target, budget=budget,
                   on_trial=on_trial, on_note=on_note, on_start=on_start, workers=workers,
                   devices=slot_devices(workers, devices))
    with sweep.lock.held():
        starts = int(study.user_attrs.get("sweep_starts", 0))
        study.set_user_attr("sweep_starts", starts + 1)
    if starts and space.study.seed is not None:
        # Every sweep of the study (started together on several machines, or resuming) samples from its own seed:
        # with one seed they would all propose the same first configurations.
        study.sampler = make_sampler(space.study, target, seed=space.study.seed + starts)
    if workers == 1:
        sweep.run_slot(0)  # in this thread: Ctrl-C reaches run_trial, which kills the worker
        return study
    done = [threading.Event() for _ in range(workers)]
    threads = [threading.Thread(target=sweep.slot_main, args=(i, done[i]), name=f"sweep-worker-{i}")
               for i in range(workers)]
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
    return study


def memory_predictor(model_path: str, name: str, attn_implementation: str) -> Callable[[dict], float | None]:
    """A function from a trial config (dict) to its predicted peak in GiB, on the device the trials will use (CUDA when
    a GPU is visible, else the CPU); it returns None when the model's shape is unknown (no readable config.json)."""
    from sweeper._worker import _cuda_visible
    from sweeper.estimate import KNOWN_SHAPES, ModelShape, estimate_memory, settings_from

    try:
        shape = (ModelShape.from_config(KNOWN_SHAPES[name]) if name in KNOWN_SHAPES
                 else ModelShape.from_dir(model_path))
    except (OSError, ValueError, KeyError):
        return lambda config: None
    device = "cuda" if _cuda_visible() else "cpu"

    def predict(config: dict) -> float | None:
        return estimate_memory(shape, settings_from(config, attn_implementation, device)).predicted_peak_gib

    return predict


def _known_memory(study: optuna.Study) -> list:
    """What the study knows about memory: each measured trial's config, and whether it fit (complete or NaN) or ran
    out of memory, for :func:`sweeper.preflight.preflight`."""
    from sweeper.preflight import Known

    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        status = t.user_attrs.get("status")
        if "duplicate_of" in t.user_attrs or "config" not in t.user_attrs or status not in ("complete", "nan", "oom"):
            continue
        out.append(Known(number=t.number, config=t.user_attrs["config"], fits=status != "oom"))
    return out


def _upload_artifacts(study_name: str, trial: optuna.Trial, result: TrialResult) -> None:
    """The trial's trace, loss curve and failing batch to the study's artifact store (see :mod:`sweeper.dashboard`);
    a full or read-only disk loses the artifacts, not the trial."""
    from sweeper.dashboard import artifact_store, upload_trial_artifacts

    try:
        upload_trial_artifacts(trial, result, trial_dir(study_name, trial.number), artifact_store(study_name))
    except OSError as exc:
        warnings.warn(f"trial {trial.number}: artifacts not stored ({exc})", stacklevel=2)
