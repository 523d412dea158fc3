"""The parent side of a trial: start ``python -m sweeper._worker`` on a config, wait, and map what happened to a
:class:`TrialResult`.

A fresh process per trial is what really frees GPU memory, contains a segfault inside a CUDA kernel, and lets a hung
trial be killed. The worker writes its result as JSON; a worker that dies without one is a ``crash``, one that
outlives ``trial_timeout_s`` is killed and is a ``timeout``.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from sweeper.space import TrialConfig

Status = Literal["complete", "nan", "oom", "predicted_oom", "dominated_oom", "timeout", "crash", "error"]
Phase = Literal["load", "forward", "backward", "optimizer"]

#: Statuses whose trial is PRUNED (a result about the configuration); the others but ``complete`` are FAIL.
PRUNED_STATUSES = ("nan", "oom", "predicted_oom", "dominated_oom")
FAIL_STATUSES = ("timeout", "crash", "error")

#: Lines of the worker's log quoted in a crash's reason when it left no result.
_LOG_TAIL_LINES = 1


@dataclass(kw_only=True)
class TrialResult:
    """What one trial measured. Stored on the optuna trial as user attributes (``SPEC.md``).

    Attributes:
        status: ``complete``; PRUNED: ``nan``, ``oom``, ``predicted_oom``, ``dominated_oom``; FAIL: ``timeout``,
            ``crash``, ``error``.
        reason: One line: what happened, for people.
        fail_step: 1-based optimizer step being run when it failed (0 during load), else None.
        fail_phase: ``load``, ``forward``, ``backward`` or ``optimizer`` for failures inside the worker, else None.
        peak_memory_gib: Peak memory of the trial process in GiB (see ``memory_kind``); known for OOM trials too.
            On the CPU, the peak after the model was loaded (see :mod:`sweeper.memory`).
        load_peak_memory_gib: Peak memory in GiB while loading, quantizing and attaching LoRA.
        memory_kind: ``cuda_max_reserved`` or ``cpu_peak_rss``.
        instability: :func:`sweeper.stability.compute_instability` of the trace, higher = closer to divergence.
        instability_components: Its terms, by name.
        loss_trace: Raw training loss per optimizer step; None where non-finite (the failing step of a NaN trial).
        grad_norm_trace: Gradient norm before clipping per optimizer step; None where non-finite.
        max_activation_trace: Largest |output| of the 4-bit layers per step (for fp16/bf16 compute).
        skipped_steps: 1-based steps the fp16 loss scaler skipped.
        steps_done: Optimizer steps finished.
        wall_time_s: Seconds from process start to result, as the parent saw it.
        import_time_s: Seconds the worker spent importing torch/transformers/peft/bitsandbytes.
        load_time_s: Seconds to read the data, load and quantize the model and attach LoRA.
        train_time_s: Seconds inside ``Trainer.train``.
        tokens_per_s: Non-padding tokens trained per second of ``train_time_s``.
        quantized_linear_count: ``bitsandbytes.nn.Linear4bit`` modules found after loading.
        lora_alpha: ``lora_alpha_ratio * r``.
        effective_batch_size: ``per_device_train_batch_size * gradient_accumulation_steps``.
        device: ``cpu`` or ``cuda:<i> (<name>)``.
        versions: torch, transformers, peft, bitsandbytes, optuna, CUDA.
        nan_cause: After a NaN: ``data``, ``precision`` or ``optimization`` (:mod:`sweeper.diagnosis`), or None
            when the replay could not decide.
        nan_samples: After a NaN: dataset indices to blame (the faulty rows for ``data``, else the failing step's).
        nan_module: After a ``precision`` NaN: the first module whose output overflowed.
        supervised_tokens_trace: Tokens the loss was computed on, per optimizer step (the failing step included).
        min_supervised_tokens: Its minimum; 0 means a step had nothing to learn from and its loss was 0/0.
        longest_sample_tokens: Tokens (before truncation) of the longest sample the trial trained on.
        longest_sample_index: Its dataset index.
        truncated_sample_fraction: Share of the samples trained on that ``max_seq_length`` cut, 0-1.
        predicted_peak_gib: The memory model's prediction for this trial (:mod:`sweeper.estimate`), in the same
            kind as ``peak_memory_gib`` (CUDA reserved, or CPU resident set), set by the sweep before it runs.
    """

    status: Status
    reason: str = ""
    fail_step: int | None = None
    fail_phase: Phase | None = None
    peak_memory_gib: float | None = None
    load_peak_memory_gib: float | None = None
    memory_kind: str | None = None
    instability: float | None = None
    instability_components: dict[str, float] = field(default_factory=dict)
    loss_trace: list[float | None] = field(default_factory=list)
    grad_norm_trace: list[float | None] = field(default_factory=list)
    max_activation_trace: list[float | None] = field(default_factory=list)
    skipped_steps: list[int] = field(default_factory=list)
    steps_done: int = 0
    wall_time_s: float | None = None
    import_time_s: float | None = None
    load_time_s: float | None = None
    train_time_s: float | None = None
    tokens_per_s: float | None = None
    quantized_linear_count: int | None = None
    lora_alpha: float | None = None
    effective_batch_size: int | None = None
    device: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    nan_cause: Literal["data", "precision", "optimization"] | None = None
    nan_samples: list[int] = field(default_factory=list)
    nan_module: str | None = None
    supervised_tokens_trace: list[int] = field(default_factory=list)
    min_supervised_tokens: int | None = None
    longest_sample_tokens: int | None = None
    longest_sample_index: int | None = None
    truncated_sample_fraction: float | None = None
    predicted_peak_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (results of newer workers)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def die_with_parent() -> None:
    """In the worker, first thing: be killed with SIGKILL when the sweep that started it dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``), so a sweep killed with ``kill -9`` does not leave its worker training on, holding
    the GPU. Set by the worker itself rather than in a ``preexec_fn`` (unsafe in a process with threads, as the
    sweep is: heartbeats, workers); a sweep that died before this call is seen by the parent pid check.
    """
    expected = os.environ.get("SWEEPER_PARENT_PID")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if expected is not None and os.getppid() != int(expected):
        os._exit(1)


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
    on_start: Any = None,
) -> TrialResult:
    """Run one trial in a fresh worker process and return what it measured.

    Writes ``config.json``, ``result.json`` and ``worker.log`` (the worker's stdout and stderr) into ``trial_dir``.

    Args:
        config: The trial's settings.
        trial_dir: Folder for this trial's files (created).
        model_path: Resolved by :func:`sweeper.model.resolve_model`.
        env: Environment of the worker (default: this process's).
        on_start: Called with the worker's pid once it runs (for bookkeeping), or None.

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
            [sys.executable, "-m", "sweeper._worker", str(config_path), str(result_path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the sweep, which kills the worker's whole group itself
            # PYTHONSAFEPATH: `-m` would put the working directory first on sys.path, and a folder named sweeper/
            # there (a checkout of another version) would be imported instead of the installed package.
            env={**(env if env is not None else os.environ), "SWEEPER_PARENT_PID": str(os.getpid()),
                 "PYTHONSAFEPATH": "1"},
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
