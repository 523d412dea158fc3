"""A CPU trial's speed and peak against a reference commit, and whether a trial at the edge of a tight cap ends as a
result (issue 53).

- ``speed``: the demo's trial #2 configuration (r 16, ``lora_alpha/r`` 0.25, double quant, fp4, batch 2 x 64 tokens, 12
  constant steps and the stress phase) as ``sweep trial --json`` runs it, in a process of its own
  (``SWEEPER_TRIAL_START=exec``), on one thread (``OMP_NUM_THREADS=1``), with this checkout's code and with each
  ``--ref`` commit's (a ``git worktree`` on ``PYTHONPATH``), alternating, ``--repeats`` times each: the command's wall,
  user and system seconds (its process and the trial's), the trial's ``train_time_s``, ``tokens_per_s`` and
  ``peak_memory_gib``. The figure is the median of the repeats, with their range.
- ``--set KEY=VALUE`` overrides more of the space (``--set max_steps=40``: the instrument's cost at 40 constant steps,
  issue 66), and each run also gives the instruments' cost: the stress phase's steps and seconds, the probe's seconds
  in the constant phase, and ``instrument_share``, the two over the constant phase's own seconds (``train_time_s``
  less the probe's). ``--ref none`` times this checkout alone.
- ``edge``: ``tests/study/test_study.py``'s edge-of-the-cap test (batch 1 x 1024 of the tiny model under 0.75 GiB, after
  a trial that ran out of memory) ``--edge-runs`` times: how each run ended (complete, a named OOM, or a crash).

    .venv/bin/python benchmarks/speed/trial_speed.py [--ref e68ad80|none] [--repeats 2] [--edge-runs 4] [--set K=V]
        [--out FILE]

Run nothing else at normal priority meanwhile (2 cores): the system time is what this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
from _common import REPO

#: The demo's trial #2 (README), its settings as ``--set`` overrides of ``search_spaces/demo.yaml``.
DEMO_TRIAL_2 = {
    "r": "16",
    "lora_alpha_ratio": "0.25",
    "bnb_4bit_use_double_quant": "true",
    "bnb_4bit_quant_type": "fp4",
    "per_device_train_batch_size": "2",
    "max_seq_length": "64",
}
FIGURES = (
    "wall_s", "user_s", "system_s", "train_time_s", "tokens_per_s", "peak_memory_gib", "stress_steps", "stress_time_s",
    "probe_time_s", "instrument_share",
)  # fmt: skip


def run_once(code: Path, overrides: dict[str, str] | None = None) -> dict[str, float]:
    """One ``sweep trial --json`` of :data:`DEMO_TRIAL_2` with the code at ``code``; its figures (:data:`FIGURES`).

    Raises:
        RuntimeError: the command failed or the trial did not complete.
    """
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1", "SWEEPER_TRIAL_START": "exec"}
    settings = {**DEMO_TRIAL_2, **(overrides or {})}
    overrides_args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    command = [sys.executable, "-m", "sweeper.cli", "trial", str(REPO / "search_spaces" / "demo.yaml"), "--json"]
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        done = subprocess.run(command + overrides_args, cwd=folder, env=env, capture_output=True, text=True)
        wall_s = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"sweep trial with {code} exited {done.returncode}: {done.stderr[-2000:]}")
    trial = json.loads(done.stdout)
    if trial["status"] != "complete":
        raise RuntimeError(f"the trial with {code} ended {trial['status']}: {trial['reason']}")
    return {
        "wall_s": wall_s,
        "user_s": after.ru_utime - before.ru_utime,
        "system_s": after.ru_stime - before.ru_stime,
        "train_time_s": trial["train_time_s"],
        "tokens_per_s": trial["tokens_per_s"],
        "peak_memory_gib": trial["peak_memory_gib"],
        "stress_steps": trial["stress_steps"],
        "stress_time_s": trial["stress_time_s"],
        "probe_time_s": trial["probe_time_s"],
        "instrument_share": (trial["stress_time_s"] + trial["probe_time_s"])
        / (trial["train_time_s"] - trial["probe_time_s"]),
    }


def speed(refs: list[str], repeats: int, overrides: dict[str, str] | None = None) -> dict[str, list[dict[str, float]]]:
    """:func:`run_once` ``repeats`` times for this checkout (its working tree) and each of ``refs``, alternating."""
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as trees:
        codes = {"this checkout": REPO}
        for ref in refs:
            tree = Path(trees) / ref
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref], check=True, capture_output=True
            )
            codes[ref] = tree
        try:
            for _ in range(repeats):
                for label, code in codes.items():
                    runs.setdefault(label, []).append(run_once(code, overrides))
                    print(f"  {label}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[label][-1].items()), flush=True)
        finally:
            for ref in refs:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(trees) / ref)],
                    capture_output=True,
                )
    return runs


def edge(runs: int) -> list[str]:
    """How the edge-of-the-cap test's trial ended in each of ``runs`` runs: ``passed`` (complete or a named OOM) or
    the test's failure line (a crash, an error)."""
    outcomes = []
    for _ in range(runs):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "tests/study/test_study.py",
                "-k",
                "edge_of_the_cap",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        failure = re.search(r"^E\s+(.*)$", done.stdout, re.MULTILINE)
        outcomes.append("passed" if done.returncode == 0 else failure.group(1) if failure else done.stdout[-300:])
        print(f"  edge run {len(outcomes)}: {outcomes[-1]}", flush=True)
    return outcomes


def table(runs: dict[str, list[dict[str, float]]]) -> list[str]:
    """The medians (and ranges) of each code's figures, and each code's ratio to the first ``--ref``."""
    lines = [f"{'code':<16}" + "".join(f"{k:>24}" for k in FIGURES)]
    medians = {label: {k: statistics.median(r[k] for r in rs) for k in FIGURES} for label, rs in runs.items()}
    for label, rs in runs.items():
        cells = [f"{medians[label][k]:.3f} ({min(r[k] for r in rs):.3f}-{max(r[k] for r in rs):.3f})" for k in FIGURES]
        lines.append(f"{label:<16}" + "".join(f"{c:>24}" for c in cells))
    labels = list(runs)
    if len(labels) > 1:
        ref, head = medians[labels[1]], medians[labels[0]]
        lines.append(
            f"this checkout / {labels[1]}: wall {head['wall_s'] / ref['wall_s']:.3f}x, train_time_s "
            f"{head['train_time_s'] / ref['train_time_s']:.3f}x; its system time "
            f"{head['system_s'] / head['user_s']:.1%} of its user time "
            f"({labels[1]}: {ref['system_s'] / ref['user_s']:.1%})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", action="append", default=[], help="a commit to compare with (default e68ad80)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--edge-runs", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key of the space")
    parser.add_argument("--out", help="also write the report to this file")
    args = parser.parse_args()
    refs = [] if args.ref == ["none"] else args.ref or ["e68ad80"]
    overrides = dict(item.split("=", 1) for item in args.set)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "sweeper"], capture_output=True, text=True)
    print(f"speed: the demo's trial #2 {overrides or ''}, one thread, {args.repeats} runs each", flush=True)
    runs = speed(refs, args.repeats, overrides)
    print(f"edge: tests/study/test_study.py::test_a_trial_at_the_edge_of_the_cap..., {args.edge_runs} runs", flush=True)
    outcomes = edge(args.edge_runs)
    edge_line = (
        [
            f"edge of the cap: {outcomes.count('passed')} of {len(outcomes)} runs passed"
            + "".join(f"; {o}" for o in outcomes if o != "passed")
        ]
        if outcomes
        else []
    )
    report = [
        f"# benchmarks/speed/trial_speed.py at {head.stdout.strip()}{' (sweeper/ modified)' if dirty.stdout else ''}, "
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; the demo's trial #2 {overrides or ''}; medians of "
        f"{args.repeats} runs (range)",
        *table(runs),
        *edge_line,
    ]
    print("\n".join(report))
    if args.out:
        Path(args.out).write_text("\n".join(report) + "\n" + json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
