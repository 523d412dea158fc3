"""How a trial process that left no result ended, read by the parent: its signal, the last line of its log that may
say why, and whether an allocation that failed in a library that aborts on it (Rust's tokenizers and safetensors)
killed it (:mod:`sweeper.trial._launch` maps these to ``crash`` or ``oom``)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from sweeper.trial._result import TrialResult
from sweeper.trial._status import TrialStatus

#: Lines of the trial process's log quoted in a crash's reason when it left no result.
_LOG_TAIL_LINES = 1


#: Log lines that never say why a process died: library warnings and the source lines Python prints under them.
_NOISE = ("warning", "warnings.warn", "state[", "  ")


def log_tail(log: Path) -> str:
    """The log's last line that may say why the process died (not a library warning or the code line under one, nor
    the traceback :mod:`faulthandler` writes when the process dies of a signal: :func:`fault_frames` reads that)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    text = text.split(_FAULT_HEADER, 1)[0]
    raw = [ln for ln in text.splitlines() if ln.strip()]
    lines = [ln.strip() for ln in raw if not any(n in ln.lower() or ln.startswith(n) for n in _NOISE)]
    return " | ".join(lines[-_LOG_TAIL_LINES:])[:300]


#: How :mod:`faulthandler` (enabled in every trial process) begins what it writes when the process dies of SIGSEGV,
#: SIGBUS, SIGFPE, SIGILL or SIGABRT; the thread that received the signal follows as ``Current thread``.
_FAULT_HEADER = "Fatal Python error: "
#: A frame of :mod:`faulthandler`'s traceback: ``  File "PATH", line N in FUNCTION``.
_FAULT_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
#: Frames of the dying thread named in a crash's reason, innermost first.
_FAULT_FRAMES = 3


def fault_frames(log: Path) -> str:
    """Where the Python code of a process that died of a signal was, from the traceback :mod:`faulthandler` wrote to
    its log: ``in FUNCTION (FOLDER/FILE:LINE) < CALLER (...) < ...``, the innermost :data:`_FAULT_FRAMES` frames of
    the thread that received the signal; empty when the log holds no such traceback (a process killed with SIGKILL,
    or one that died before its first import). Python frames only: a fault inside a C library shows the Python call
    that entered it (``forward`` of a module, ``backward``), which is what tells a fault in a step from one while
    loading."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    _, _, fault = text.rpartition(_FAULT_HEADER)
    if not fault:
        return ""
    lines = fault.splitlines()
    current = next((i for i, ln in enumerate(lines) if ln.startswith("Current thread")), None)
    if current is None:
        return ""
    frames = []
    for line in lines[current + 1 :]:
        if not line.strip():  # the thread's traceback ends here (other threads' follow)
            break
        match = _FAULT_FRAME.match(line)
        if match is None:  # a state line, such as "  Garbage-collecting"
            continue
        where = "/".join(Path(match["path"]).parts[-2:])
        frames.append(f"{match['function']} ({where}:{match['line']})")
    return "in " + " < ".join(frames[:_FAULT_FRAMES]) if frames else ""


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
