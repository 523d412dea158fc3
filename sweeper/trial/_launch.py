"""The parent side of a trial: hand a config to a trial process (``python -m sweeper.trial._child.worker --serve``),
wait, and map what happened to a :class:`TrialResult`.

A :class:`TrialProcess` serves trial after trial (a *warm* process: imports paid once, the 4-bit model kept when the
next trial's model-level settings match), and is replaced by a fresh one whenever a trial ends in anything but
``complete`` or ``diverged``: a process is what really frees GPU memory, contains a segfault inside a CUDA kernel, and
lets a hung trial be killed. The worker sends :class:`~sweeper.trial._job.TrialProgress` lines on a control pipe
while a trial runs, then writes its result as JSON and a :class:`~sweeper.trial._job.TrialDone` line; a process that
dies without one is a ``crash``, one whose trial outlives ``trial_timeout_s`` is killed and is a ``timeout``.
:func:`run_trial` runs one trial in a fresh process.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sweeper.space import TrialConfig
from sweeper.trial._ended import (
    SIGKILL_CAUSE,
    allocation_abort,
    fault_frames,
    log_tail,
    mentions_allocation_abort,
    signal_name,
)
from sweeper.trial._job import DEFAULT_MEASURES, Measures, TrialDone, TrialJob, TrialProgress
from sweeper.trial._result import Provenance, TrialResult
from sweeper.trial._status import TrialStatus
from sweeper.trial._zygote import ForkedProcess, fork_trial_process, start_zygote

#: The module the trial process runs (``python -m``).
CHILD_MODULE = "sweeper.trial._child.worker"


class TrialStartError(RuntimeError):
    """A trial process could not be started: the interpreter cannot be executed by this user or is gone. Not a write
    of the trial's files (an ``OSError``): its fix is the Python environment, not the disk."""


def _kill_group(proc: subprocess.Popen | ForkedProcess) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _made_here(config: TrialConfig, status: str, reason: str, wall: float, warm: bool) -> TrialResult:
    return TrialResult(
        status=TrialStatus(status),
        reason=reason,
        provenance=Provenance(
            wall_time_s=wall,
            warm=warm,
            lora_alpha=config.lora_alpha,
            effective_batch_size=config.effective_batch_size,
        ),
    )


def trial_env(env: Mapping[str, str] | None, control_fd: int | None = None) -> dict[str, str]:
    """A trial process's environment: ``env`` (default: this process's) with the sweep's pid, the control pipe
    (``control_fd``) and ``PYTHONSAFEPATH``."""
    return {
        **(env if env is not None else os.environ),
        "SWEEPER_PARENT_PID": str(os.getpid()),
        "SWEEPER_CONTROL_FD": str(control_fd if control_fd is not None else -1),
        # `-m` would put the working directory first on sys.path, and a folder named sweeper/ there (a checkout of
        # another version) would be imported instead of the installed package.
        "PYTHONSAFEPATH": "1",
    }


def prestart(env: Mapping[str, str] | None = None) -> None:
    """Start the zygote that will fork trial processes with environment ``env`` (default: this process's), so that
    its imports (seconds) overlap what the caller does before the first trial (:mod:`sweeper.trial._zygote`); nothing
    where trial processes are started with ``python -m``."""
    start_zygote(trial_env(env))


class TrialProcess:
    """A trial process that serves trials one after another; started at the first :meth:`run`, replaced by a fresh
    one after a trial that leaves it unfit (anything but ``complete``/``diverged``), and ended by :meth:`close`.

    Its stdout and stderr go to each trial's ``worker.log``. It dies with the sweep (``PR_SET_PDEATHSIG``, see
    :mod:`sweeper.trial._child._process`) and runs in its own process group, which a timeout or Ctrl-C kills whole.

    Args:
        env: Environment of the trial process (default: this process's), e.g. its ``CUDA_VISIBLE_DEVICES``.
        warm: False to start a fresh process for every trial (the cold path, as before warm processes).
    """

    def __init__(self, env: Mapping[str, str] | None = None, *, warm: bool = True):
        self.env, self.warm = env, warm
        self._proc: subprocess.Popen | ForkedProcess | None = None
        self._control: int | None = None
        self._buffer = b""
        self.trials = 0  # trials served by the current process
        self._on_progress: Callable[[TrialProgress], None] | None = None
        #: The running trial's last progress report (None before its first): where a process that died stopped.
        self._last_progress: TrialProgress | None = None

    @property
    def pid(self) -> int | None:
        """The running trial process's pid, or None."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self, log_path: Path, wait_s: float) -> subprocess.Popen | ForkedProcess:
        """A fresh trial process: forked by this environment's zygote where there is one
        (:func:`sweeper.trial._zygote.fork_trial_process`, waited for ``wait_s`` seconds at most), else started with
        ``python -m``."""
        read_fd, write_fd = os.pipe()
        env = trial_env(self.env, write_fd)
        try:
            proc = fork_trial_process(env, log_path, write_fd, wait_s) or self._exec(env, log_path, write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        self._proc, self._control, self._buffer, self.trials = proc, read_fd, b"", 0
        return proc

    @staticmethod
    def _exec(env: dict[str, str], log_path: Path, write_fd: int) -> subprocess.Popen:
        """A trial process started with ``python -m`` (:data:`CHILD_MODULE`).

        Raises:
            TrialStartError: The interpreter cannot be executed (a user who may not run it, a venv moved or gone).
            OSError: The trial's log cannot be opened (its folder's disk or permissions).
        """
        with open(log_path, "ab") as log:
            try:
                return subprocess.Popen(
                    [sys.executable, "-m", CHILD_MODULE, "--serve"],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C reaches the sweep, which kills the process's whole group itself
                    pass_fds=(write_fd,),
                    env=env,
                )
            except OSError as exc:
                raise TrialStartError(
                    f"{sys.executable}: cannot start a trial process ({exc.strerror or exc})"
                ) from exc

    def _read_done(self, deadline: float) -> TrialDone | None:
        """The trial's :class:`TrialDone` line, the progress lines before it handed to the run's ``on_progress`` as
        they come (:mod:`sweeper.trial._child.progress`); None at EOF (the process died). Raises TimeoutError past
        ``deadline``."""
        while True:
            line = self._next_line(deadline)
            if line is None:
                return None
            try:
                progress = TrialProgress.from_line(line)
            except ValueError:
                continue  # a garbled progress line is not worth a trial
            if progress is None:
                return TrialDone.from_line(line)
            self._last_progress = progress
            if self._on_progress is not None:
                self._on_progress(progress)

    def _next_line(self, deadline: float) -> bytes | None:
        assert self._control is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._control], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self._control, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def close(self) -> None:
        """End the trial process (closing its stdin lets it exit; its group is killed if it does not at once)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
            _kill_group(proc)
        if self._control is not None:
            os.close(self._control)
            self._control = None

    def _hand_over(self, job: TrialJob, log_path: Path, wait_s: float) -> subprocess.Popen | ForkedProcess:
        """The trial process that takes ``job`` (started first when there is none, or when not warm; a zygote still
        importing is waited for ``wait_s`` seconds at most), its pid written to ``worker.pid`` in the job's folder."""
        if self._proc is None or self._proc.poll() is not None or not self.warm:
            self.close()
            self._start(log_path, wait_s)
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        (Path(job.trial_dir) / "worker.pid").write_text(str(proc.pid))
        return proc

    def _died(
        self, config: TrialConfig, proc: subprocess.Popen | ForkedProcess, log_path: Path, wall: float, warm: bool
    ) -> TrialResult:
        """The ``crash`` result of a process that died without a result: its exit, the step it last reported, the
        log's last line and, for a signal, where its Python code was (:func:`sweeper.trial._ended.fault_frames`)."""
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = 0
        self.close()
        why = f"killed by {signal_name(rc)}" if rc < 0 else f"exited with code {rc}"
        said = [SIGKILL_CAUSE] if rc == -signal.SIGKILL else [log_tail(log_path), fault_frames(log_path)]
        progress = self._last_progress
        if progress is not None and progress.step is not None:  # where the trial was: a step, or past its last
            said.insert(0, f"last reported {progress.phase} step {progress.step} of {progress.of}")
        tail = "; ".join(s for s in said if s)
        reason = f"worker {why} without a result" + (f": {tail}" if tail else "")
        loading = self._last_progress is None or self._last_progress.phase == "load"
        if rc == -signal.SIGABRT and loading and mentions_allocation_abort(log_path):
            # Before its first step the data segment was already at the cap, and the first allocation to fail was a
            # Rust library's, which aborts: the configuration does not load under this cap (an OOM, as the same
            # failure in torch's allocator would be).
            result = _made_here(config, "oom", f"out of memory while loading, under the cap: {reason}", wall, warm)
            result.fail_phase, result.fail_step = "load", 0  # step 0: while loading, as the worker records it
            result.memory.peak_memory_gib = config.memory_limit_gib  # the least the configuration needs
            return result
        return _made_here(config, "crash", reason, wall, warm)

    def run(
        self,
        config: TrialConfig,
        trial_dir: str | Path,
        *,
        model_path: str,
        on_start: Callable[[int], None] | None = None,
        on_progress: Callable[[TrialProgress], None] | None = None,
        measures: Measures = DEFAULT_MEASURES,
    ) -> TrialResult:
        """Run one trial in this trial process (started first when there is none) and return what it measured.

        Writes ``config.json``, ``result.json``, ``worker.log`` (the trial process's output during this trial) and
        ``worker.pid`` into ``trial_dir``.

        Args:
            config: The trial's settings.
            trial_dir: Folder for this trial's files (created).
            model_path: Resolved by :func:`sweeper.model.resolve_model`.
            on_start: Called with the trial process's pid once it has the trial (for bookkeeping), or None.
            on_progress: Called in this thread with each :class:`~sweeper.trial._job.TrialProgress` of the running
                trial (its phase, the phase's steps done and of, the last loss, the peak memory so far), at most a few
                times a second; None to ignore them.
            measures: What it measures besides training (:class:`~sweeper.trial._job.Measures`, whole: it travels
                in the job, and a warm process takes it per trial): the stress phase (``stress=None``: a
                constant-rate run only, a confirmation or the validity benchmark's long runs), the probe, the
                worst-case step (on the whole file's worst rows with ``worst_case_samples``) and experimental
                instruments.

        Returns:
            The worker's result, or a ``timeout``/``crash`` result made here. An ``oom`` while loading in a warm
            process, or a warm process aborted by an allocation that failed in a library that aborts on it
            (:func:`~sweeper.trial._ended.allocation_abort`), is run once more in a fresh one, whose result is
            returned (its first log kept as ``worker.warm-load-oom.log``): a warm process's heap, left by earlier
            trials, can fail a load that fits a fresh process (the demo's trial #6, batch 2 x 64 at r 16, ran out of
            memory while loading at 1.68 GiB under 1.6 where the same shape at another ``lora_alpha`` had trained at
            1.01 GiB, and the dominance rule then pruned two larger configurations on it).

        Raises:
            KeyboardInterrupt: After killing the trial process, so the caller can record the trial as interrupted.
            OSError: The trial's files cannot be written.
        """
        args = (config, trial_dir, model_path, on_start, on_progress, measures)
        result = self._run_once(*args)
        log = Path(trial_dir) / "worker.log"
        load_oom = result.status == TrialStatus.OOM and result.fail_phase == "load"
        if result.provenance.warm and (load_oom or allocation_abort(result, log)):
            self.close()
            if log.is_file():
                log.replace(log.with_name("worker.warm-load-oom.log"))
            result = self._run_once(*args)
        return result

    def _run_once(
        self,
        config: TrialConfig,
        trial_dir: str | Path,
        model_path: str,
        on_start: Callable[[int], None] | None,
        on_progress: Callable[[TrialProgress], None] | None,
        measures: Measures,
    ) -> TrialResult:
        """One try of :meth:`run`."""
        self._on_progress, self._last_progress = on_progress, None
        job = _write_job(config, Path(trial_dir), model_path, measures)
        log_path, result_path = Path(job.log_path), Path(job.result_path)
        start = time.monotonic()
        proc = self._hand_over(job, log_path, config.trial_timeout_s)
        warm = self.trials > 0
        if on_start is not None:
            on_start(proc.pid)
        assert proc.stdin is not None
        try:
            try:
                proc.stdin.write(job.to_line().encode())
                proc.stdin.flush()
            except BrokenPipeError:
                pass  # it died meanwhile: the control pipe's EOF says so below
            done = self._read_done(start + config.trial_timeout_s)
        except TimeoutError:
            self.close()
            reason = f"killed after trial_timeout={config.trial_timeout_s:g} s"
            return _made_here(config, "timeout", reason, time.monotonic() - start, warm)
        except BaseException:
            self.close()
            raise
        wall = time.monotonic() - start
        if done is None:  # the process died without a result
            return self._died(config, proc, log_path, wall, warm)
        self.trials += 1
        if not done.reusable:
            self.close()
        return _read_result(config, result_path, wall, warm)


def _read_result(config: TrialConfig, result_path: Path, wall: float, warm: bool) -> TrialResult:
    """The result the trial process wrote, with the wall time measured here; a ``crash`` result when it wrote none
    that reads. An OOM's peak is at least the cap: what ran out asked for more than the cap, and the reading (the
    resident set on the CPU, taken before the failed allocation) is below it."""
    try:
        result = TrialResult.from_dict(json.loads(result_path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        return _made_here(config, "crash", f"worker wrote no readable result ({exc})", wall, warm)
    result.provenance.wall_time_s = wall
    peak = result.memory.peak_memory_gib
    if result.status == TrialStatus.OOM and peak is not None and peak < config.memory_limit_gib:
        result.memory.peak_memory_gib = config.memory_limit_gib  # the least the configuration needs
    return result


def _write_job(
    config: TrialConfig, trial_dir: Path, model_path: str, measures: Measures = DEFAULT_MEASURES
) -> TrialJob:
    """Create ``trial_dir`` with the trial's ``config.json`` and an empty ``worker.log`` (no ``result.json``), and
    return the job naming them, with what it measures."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    job = TrialJob(
        config_path=str(trial_dir / "config.json"),
        result_path=str(trial_dir / "result.json"),
        log_path=str(trial_dir / "worker.log"),
        trial_dir=str(trial_dir),
        measures=measures,
    )
    Path(job.result_path).unlink(missing_ok=True)
    Path(job.config_path).write_text(json.dumps({"config": config.to_dict(), "model_path": model_path}, indent=1))
    Path(job.log_path).write_bytes(b"")
    return job


def run_trial(
    config: TrialConfig,
    trial_dir: str | Path,
    *,
    model_path: str,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[TrialProgress], None] | None = None,
    measures: Measures = DEFAULT_MEASURES,
) -> TrialResult:
    """Run one trial in a fresh trial process and return what it measured (:meth:`TrialProcess.run`); the process
    ends with it.

    Args:
        config: The trial's settings.
        trial_dir: Folder for this trial's files (created).
        model_path: Resolved by :func:`sweeper.model.resolve_model`.
        env: Environment of the trial process (default: this process's).
        on_start: Called with the trial process's pid once it runs (for bookkeeping), or None.
        on_progress: The running trial's progress reports (:meth:`TrialProcess.run`), or None.
        measures: What it measures besides training (:meth:`TrialProcess.run`).

    Returns:
        The worker's result, or a ``timeout``/``crash`` result made here.

    Raises:
        KeyboardInterrupt: After killing the worker, so the caller can record the trial as interrupted.
    """
    process = TrialProcess(env, warm=False)
    try:
        return process.run(
            config,
            trial_dir,
            model_path=model_path,
            on_start=on_start,
            on_progress=on_progress,
            measures=measures,
        )
    finally:
        process.close()
