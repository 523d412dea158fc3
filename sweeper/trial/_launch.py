"""The parent side of a trial: start ``python -m sweeper.trial._child.worker`` on a config, wait, and map what
happened to a :class:`TrialResult`.

A fresh process per trial is what really frees GPU memory, contains a segfault inside a CUDA kernel, and lets a hung
trial be killed. The worker writes its result as JSON; a worker that dies without one is a ``crash``, one that
outlives ``trial_timeout_s`` is killed and is a ``timeout``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sweeper.space import TrialConfig
from sweeper.trial._result import TrialResult

#: The module the trial process runs (``python -m``).
CHILD_MODULE = "sweeper.trial._child.worker"

#: Lines of the trial process's log quoted in a crash's reason when it left no result.
_LOG_TAIL_LINES = 1


def _log_tail(log: Path) -> str:
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-_LOG_TAIL_LINES:])[:300]


def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_trial(
    config: TrialConfig,
    trial_dir: str | Path,
    *,
    model_path: str,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> TrialResult:
    """Run one trial in a fresh trial process and return what it measured.

    Writes ``config.json``, ``result.json`` and ``worker.log`` (the trial process's stdout and stderr) into
    ``trial_dir``.

    Args:
        config: The trial's settings.
        trial_dir: Folder for this trial's files (created).
        model_path: Resolved by :func:`sweeper.model.resolve_model`.
        env: Environment of the trial process (default: this process's).
        on_start: Called with the trial process's pid once it runs (for bookkeeping), or None.

    Returns:
        The worker's result, or a ``timeout``/``crash`` result made here.

    Raises:
        KeyboardInterrupt: After killing the worker, so the caller can record the trial as interrupted.
    """
    trial_dir = Path(trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    config_path, result_path, log_path = trial_dir / "config.json", trial_dir / "result.json", trial_dir / "worker.log"
    result_path.unlink(missing_ok=True)
    config_path.write_text(json.dumps({"config": config.to_dict(), "model_path": model_path}, indent=1))
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, str(config_path), str(result_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the sweep, which kills the worker's whole group itself
            # PYTHONSAFEPATH: `-m` would put the working directory first on sys.path, and a folder named sweeper/
            # there (a checkout of another version) would be imported instead of the installed package.
            env={
                **(env if env is not None else os.environ),
                "SWEEPER_PARENT_PID": str(os.getpid()),
                "PYTHONSAFEPATH": "1",
            },
        )
        (trial_dir / "worker.pid").write_text(str(proc.pid))
        if on_start is not None:
            on_start(proc.pid)
        try:
            rc = proc.wait(timeout=config.trial_timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return TrialResult(
                status="timeout",
                reason=f"killed after trial_timeout={config.trial_timeout_s:g} s",
                wall_time_s=time.monotonic() - start,
                lora_alpha=config.lora_alpha,
                effective_batch_size=config.effective_batch_size,
            )
        except BaseException:
            _kill_group(proc)
            raise
    wall = time.monotonic() - start
    if result_path.is_file():
        try:
            result = TrialResult.from_dict(json.loads(result_path.read_text()))
            result.wall_time_s = wall
            return result
        except (ValueError, TypeError):
            pass
    why = f"killed by {_signal_name(rc)}" if rc < 0 else f"exited with code {rc}"
    tail = _log_tail(log_path)
    return TrialResult(
        status="crash",
        reason=f"worker {why} without a result" + (f": {tail}" if tail else ""),
        wall_time_s=wall,
        lora_alpha=config.lora_alpha,
        effective_batch_size=config.effective_batch_size,
    )
