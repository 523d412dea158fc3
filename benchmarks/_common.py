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


def run_trial(config, folder, *, stress=True, experimental=(), **kwargs):
    """``sweeper.trial.run_trial`` with the stress phase on (True, the default settings), off (False: a constant-rate
    run) or at these ``StressSettings``, and the experimental instruments named, as the job's
    :class:`sweeper.trial.Measures`; on a checkout from before issue 69 (no ``Measures``: ``collation.py`` runs an
    older commit's code), its ``stress=`` and ``line_search=`` keywords. Returns the ``TrialResult``."""
    from sweeper import trial

    try:
        measures_type = trial.Measures
    except AttributeError:  # before issue 69
        extra = {"line_search": True} if "critical_lr" in experimental else {}
        return trial.run_trial(config, folder, stress=stress, **extra, **kwargs)
    settings = {} if stress is True else {"stress": None if stress is False else stress}
    measures = measures_type(**settings, experimental=tuple(experimental))
    return trial.run_trial(config, folder, measures=measures, **kwargs)
