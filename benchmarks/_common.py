"""What the benchmarks share: where the repository is, the ``sweep`` command of this checkout, the commit and date a
result was measured at, and the product's CPU peak counting for a child process.

Every script starts with the two lines that find this module (a script is run by its path, from any folder)::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common
    from _common import REPO

Importing it puts the repository root first on ``sys.path``, so ``import sweeper`` is this checkout's. The scripts
reach ``sweeper`` through its public names only: the package faces and :mod:`sweeper.benchmarking`
(``tests/test_architecture.py`` holds it).
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from datetime import date
from pathlib import Path

#: The benchmarks' folder (``benchmarks/``) and the repository root above it.
BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: The CLI of this checkout, as ``sweep`` (``python -m sweeper.cli``: no console script needed).
SWEEP = [sys.executable, "-m", "sweeper.cli"]


def commit(short: bool = True) -> str:
    """The checkout's commit (``git rev-parse``), ``-dirty`` appended where the work tree has changes; ``unknown``
    outside git."""
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", *(["--short"] if short else []), "HEAD"],
        capture_output=True,
        text=True,
    )
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return head.stdout.strip() + ("-dirty" if dirty else "")


def result_header() -> str:
    """The first line of a result file: the commit and date it was measured at (``results: <commit>, <date>``)."""
    return f"results: {commit()}, {date.today().isoformat()}"


def cpu_counting_source() -> str:
    """The trial's own CPU peak counting, as source text for a child process that may not import ``sweeper`` (a
    tool's venv): :func:`sweeper.benchmarking.reset_cpu_peak` (resets the resident set's high-water mark),
    :func:`~sweeper.benchmarking.peak_memory_gib` (reads it, ``VmHWM``) and
    :func:`~sweeper.benchmarking.process_memory_gib` (``VmRSS``, ``VmData``), the product's functions themselves;
    and ``restart_cpu_peak()``, what the trial does when a phase starts (hands glibc's free heap back, then resets
    the peak), ``status(key)``: one ``/proc/self/status`` line in GiB (``peak_memory_gib`` reads ``VmHWM:``)."""
    from sweeper.benchmarking import peak_memory_gib, process_memory_gib, reset_cpu_peak
    from sweeper.memory import GIB

    functions = "\n\n".join(inspect.getsource(f) for f in (reset_cpu_peak, peak_memory_gib, process_memory_gib))
    return (
        f"import ctypes, gc, resource, sys\nGIB = {GIB!r}\n\n{textwrap.dedent(functions)}\n"
        "def status(key):\n"
        "    if key == 'VmHWM:':\n"
        "        return peak_memory_gib('cpu')\n"
        "    return process_memory_gib()[key.rstrip(':')]\n\n"
        "def restart_cpu_peak():\n"
        "    gc.collect()\n"
        "    ctypes.CDLL(None).malloc_trim(0)\n"
        "    reset_cpu_peak()\n"
    )


def _autogroup_nice() -> int | None:
    """This process's autogroup nice (``/proc/self/autogroup``: ``/autogroup-N nice K``), None where unreadable."""
    try:
        return int(Path("/proc/self/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _same_priority(pid: int) -> None:
    """Give trial process ``pid`` this process's autogroup nice. A trial process runs in a session of its own (the
    zygote's ``setsid``), so a long experiment started as ``setsid nice -n 19`` with ``echo 19 > /proc/$PID/autogroup``
    reaches its runner but not its trials: they ran at autogroup nice 0, level with the session's own work."""
    nice = _autogroup_nice()
    if nice:
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:
            pass


def run_trial(config, folder, *, stress=True, experimental=(), **kwargs):
    """``sweeper.trial.run_trial`` with the stress phase on (True, the default settings), off (False: a constant-rate
    run) or at these ``StressSettings``, and the experimental instruments named, as the job's
    :class:`sweeper.trial.Measures`; on a checkout from before issue 69 (no ``Measures``: ``collation.py`` runs an
    older commit's code), its ``stress=`` and ``line_search=`` keywords. Each trial process gets this process's
    autogroup nice (:func:`_same_priority`). Returns the ``TrialResult``."""
    from sweeper import trial

    given = kwargs.pop("on_start", None)

    def on_start(pid: int) -> None:
        _same_priority(pid)
        if given is not None:
            given(pid)

    kwargs["on_start"] = on_start

    try:
        measures_type = trial.Measures
    except AttributeError:  # before issue 69
        extra = {"line_search": True} if "critical_lr" in experimental else {}
        return trial.run_trial(config, folder, stress=stress, **extra, **kwargs)
    settings = {} if stress is True else {"stress": None if stress is False else stress}
    measures = measures_type(**settings, experimental=tuple(experimental))
    return trial.run_trial(config, folder, measures=measures, **kwargs)
