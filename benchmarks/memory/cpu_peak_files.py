"""How much of a CPU trial's peak is mapped files, and how much of its run-to-run spread they make (stop 66's finding:
``VmRSS``/``VmHWM``, the CPU peak, count the shared libraries' resident pages, ``RssFile``, whose count moves with the
page cache).

The demo's trial #2 (``benchmarks/speed/trial_speed.py``'s configuration: ``sweep trial --json`` of
``search_spaces/demo.yaml`` with its settings, ``SWEEPER_TRIAL_START=exec``, one thread) ``--runs`` times, alternating
a warm page cache with one dropped just before (``echo 3 > /proc/sys/vm/drop_caches``, which needs root; said where it
was not permitted). While each runs, this process reads the trial process's ``/proc/PID/status`` every ``--every-s``
seconds from outside (it changes nothing in the trial): ``RssFile`` and ``RssShmem``. Per run: the trial's reported
``peak_memory_gib`` (its training phases' ``VmHWM``), the trial process's ``RssFile`` and ``RssShmem`` at the last
reading before it ended, and the peak less them (an estimate of the process's private memory at its peak: file pages
are mapped at import and grow little after loading), and each phase's own peak (``phase_peak_memory_gib``: load,
train, worst_case, probe, stress).

Written before the runs (the comparison and what would refute it): if the files' pages are what moves the peak between
runs, the spread (max - min, and the standard deviation) of ``peak - RssFile - RssShmem`` over the runs is smaller than
the peak's, and the dropped-cache runs' peaks sit lower than the warm ones' by about their ``RssFile`` difference. If
the two spreads are alike, the files are not the peak's noise and counting private memory would not steady it.

    .venv/bin/python benchmarks/memory/cpu_peak_files.py [--runs 6] [--every-s 0.05] [--out FILE]

Run nothing else meanwhile (2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # trial_speed
from trial_speed import DEMO_TRIAL_2, REPO

GIB_KIB = 1024 * 1024
FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


def _status(pid: int) -> dict[str, float]:
    """``FIELDS`` of ``/proc/PID/status`` in GiB; empty once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, _, value = line.partition(":")
        if key in FIELDS:
            out[key] = int(value.split()[0]) / GIB_KIB
    return out


def _descendants(root: int) -> list[int]:
    """The pids whose ancestry reaches ``root``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [c for c, p in parents.items() if p == pid]
        found += children
        frontier += children
    return found


def _is_trial_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"sweeper.trial._child.worker" in cmdline.read()
    except OSError:
        return False


def drop_caches() -> bool:
    """Drop the page cache (clean pages only); False where this process may not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
        return True
    except OSError:
        return False


def run_once(every_s: float) -> dict[str, float]:
    """One ``sweep trial --json`` of the demo's trial #2, its trial process read every ``every_s`` seconds.

    Raises:
        RuntimeError: the command failed, the trial did not complete, or no trial process was seen.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SWEEPER_TRIAL_START": "exec"}
    overrides = [arg for key, value in DEMO_TRIAL_2.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "sweeper.cli", "trial", str(REPO / "search_spaces" / "demo.yaml"), "--json"]
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command + overrides, cwd=folder, env=env, stdout=out, stderr=subprocess.DEVNULL)
        trial_pid, last = None, {}
        while proc.poll() is None:
            if trial_pid is None:
                trial_pid = next((p for p in _descendants(proc.pid) if _is_trial_process(p)), None)
            elif reading := _status(trial_pid):
                last = reading
            time.sleep(every_s)
        out.seek(0)
        text = out.read()
    if proc.returncode != 0 or not last:
        raise RuntimeError(f"sweep trial exited {proc.returncode}; trial process seen: {trial_pid is not None}")
    trial = json.loads(text)
    if trial["status"] != "complete":
        raise RuntimeError(f"the trial ended {trial['status']}: {trial['reason']}")
    files = last["RssFile"] + last.get("RssShmem", 0.0)
    return {
        "peak_memory_gib": trial["peak_memory_gib"],
        "rss_file_gib": last["RssFile"],
        "rss_shmem_gib": last.get("RssShmem", 0.0),
        "peak_less_files_gib": trial["peak_memory_gib"] - files,
        # each phase's own peak (which of them moves between runs)
        **{f"{phase}_gib": value for phase, value in (trial.get("phase_peak_memory_gib") or {}).items()},
    }


def summary(rows: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in rows]
    spread = max(values) - min(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    mean = statistics.mean(values)
    return f"{key:<20} mean {mean:.3f}  sd {sd:.3f}  range {min(values):.3f}-{max(values):.3f} ({spread:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--every-s", type=float, default=0.05)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows, lines = [], []
    for i in range(args.runs):
        cache = "warm"
        if i % 2 == 1:
            cache = "dropped" if drop_caches() else "warm (drop_caches not permitted)"
        row = {**run_once(args.every_s)}
        rows.append(row)
        line = f"run {i + 1} ({cache}): " + ", ".join(f"{k} {v:.3f}" for k, v in row.items())
        print(line, flush=True)
        lines.append(line)
    lines += [
        "",
        f"# benchmarks/memory/cpu_peak_files.py, {args.runs} runs of the demo's trial #2 (one thread), "
        f"{time.strftime('%Y-%m-%d')}, GiB",
    ]
    lines += [summary(rows, k) for k in rows[0]]
    for half, name in ((rows[0::2], "warm"), (rows[1::2], "dropped")):
        if half:
            lines.append(f"{name}: " + "; ".join(summary(half, k) for k in ("peak_memory_gib", "rss_file_gib")))
    print("\n".join(lines[-6:]))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
