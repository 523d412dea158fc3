"""How a trial process that left no result ended, read by the parent: its signal, the last line of its log that may
say why, and whether an allocation that failed in a library that aborts on it (Rust's tokenizers and safetensors)
killed it (:mod:`sweeper.trial._launch` maps these to ``crash`` or ``oom``)."""

from __future__ import annotations

import signal
from pathlib import Path

from sweeper.trial._result import TrialResult
from sweeper.trial._status import TrialStatus

#: Lines of the trial process's log quoted in a crash's reason when it left no result.
_LOG_TAIL_LINES = 1


#: Log lines that never say why a process died: library warnings and the source lines Python prints under them.
_NOISE = ("warning", "warnings.warn", "state[", "  ")


def log_tail(log: Path) -> str:
    """The log's last line that may say why the process died (not a library warning or the code line under one)."""
    try:
        raw = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln.strip() for ln in raw if not any(n in ln.lower() or ln.startswith(n) for n in _NOISE)]
    return " | ".join(lines[-_LOG_TAIL_LINES:])[:300]


#: Why a worker killed by SIGKILL died: nothing in the trial sends it.
SIGKILL_CAUSE = (
    "nothing in the trial sends SIGKILL: most likely the kernel's OOM killer (the machine ran out of memory; "
    "'dmesg' or 'journalctl -k' says so), else a person or a job scheduler"
)


def signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


#: What Rust's allocation-failure handler writes before it aborts the process (tokenizers and safetensors are Rust):
#: a warm process whose data segment is already above the next trial's cap can fail its first allocation there.
RUST_ALLOCATION_FAILURE = "memory allocation of "


def allocation_abort(result: TrialResult, log: Path) -> bool:
    """Whether ``result`` is a ``crash`` of a process aborted (SIGABRT) by an allocation that failed in a Rust
    library (its log holds Rust's ``memory allocation of N bytes failed``): under a CPU cap, an out-of-memory that the
    library could not report (CI at 1171e44: a warm process holding 0.50 GiB of data segment, given a trial capped at
    0.3 GiB, aborted in the tokenizer instead of raising an OOM while loading)."""
    if result.status != TrialStatus.CRASH or "SIGABRT" not in result.reason:
        return False
    return mentions_allocation_abort(log)


def mentions_allocation_abort(log: Path) -> bool:
    """Whether the trial's log holds Rust's allocation-failure message (:data:`RUST_ALLOCATION_FAILURE`)."""
    try:
        return RUST_ALLOCATION_FAILURE in log.read_text(errors="replace")
    except OSError:
        return False
