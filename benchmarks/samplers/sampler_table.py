"""A table of real trials for replaying samplers (issue: how many trials a night needs): every configuration of a grid
over the demo's searched settings, each measured once by the sweep's own trial.

The grid (:data:`GRID`): ``search_spaces/demo.yaml`` (float32 compute, as the demo) with every searched setting at
2 or 3 values, 2 x 3 x 2 x 2 x 2 x 2 = 96 configurations, at the default 30 constant steps, then the stress phase,
under the demo's 1.6 GiB cap. Every configuration runs, also those the preflight would prune (a replay without the
pruning needs what they cost); the memory model's prediction is stored beside each, so that a replay applies the
preflight itself (:mod:`sampler_replay`).

Each trial's result (``TrialResult.to_dict()`` less its per-step traces, its predicted peak and its wall time) is
written to ``benchmarks/samplers/results/sampler_table.json`` as it ends (an atomic rename): a stopped run keeps what it
measured and a rerun skips what is there. ``--where KEY=VALUE`` restricts a run to part of the grid.

    python benchmarks/samplers/sampler_table.py --jobs 2 --threads 1                 # the whole grid (hours on 2 cores)
    python benchmarks/samplers/sampler_table.py --jobs 2 --threads 1 --where r=4      # a part of it
    python benchmarks/samplers/sampler_table.py --status                              # what is measured

Run nothing else that trains while it runs: the trials' wall times are the replay's costs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
from _common import REPO

from sweeper.memory import memory_predictor
from sweeper.model import resolve_model
from sweeper.space import SearchSpace, load_space
from sweeper.trial import run_trial

ROOT = REPO
DEMO = ROOT / "search_spaces" / "demo.yaml"

#: The demo's searched settings at 2 or 3 values each: the demo's own values, less its middle batch and length (1, 4
#: and 64, 256 keep the demo's measured OOM, float32 at 4 x 256 tokens, and its cheapest shapes).
GRID: dict[str, list[Any]] = {
    "r": [4, 16],
    "lora_alpha_ratio": [0.25, 16, 64],
    "bnb_4bit_use_double_quant": [True, False],
    "bnb_4bit_quant_type": ["nf4", "fp4"],
    "per_device_train_batch_size": [1, 4],
    "max_seq_length": [64, 256],
}
#: The sweep's default trial length (30 constant steps) instead of the demo's 12, and room for a float32 trial at
#: 4 x 256 tokens on one thread; the rest is the demo's (learning rate 2e-3, the 1.6 GiB cap, 256 samples).
TRIAL_SETTINGS = ("max_steps=30", "trial_timeout=30m", "study.confirm_steps=120")


def table_space(fixed: dict[str, Any] | None = None) -> SearchSpace:
    """The demo's space with its ``search:`` replaced by :data:`GRID` and :data:`TRIAL_SETTINGS` set; ``fixed``
    settings (a part of the grid) are fixed instead of searched."""
    fixed = fixed or {}
    raw = yaml.safe_load(DEMO.read_text())
    raw["search"] = {k: v for k, v in GRID.items() if k not in fixed}
    raw["training"] = {**{k: v for k, v in raw["training"].items() if k not in GRID}, **fixed}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(raw, f)
    try:
        return load_space(f.name, list(TRIAL_SETTINGS))
    finally:
        os.unlink(f.name)


def grid(space: SearchSpace) -> list[dict[str, Any]]:
    """Every combination of the space's searched values, as Optuna params (one dict per configuration)."""
    keys = sorted(space.search)
    choices = [list(space.search[k].choices) for k in keys]  # type: ignore[attr-defined]
    return [dict(zip(keys, values)) for values in itertools.product(*choices)]


def key_of(params: dict[str, Any]) -> str:
    """The table's key of a configuration: its params sorted by name, ``name=value`` joined by spaces."""
    return " ".join(f"{k}={params[k]}" for k in sorted(params))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


class Table:
    """The table's file, and the trials (``jobs`` at a time) that fill it."""

    def __init__(self, path: Path, threads: int | None):
        self.path = path
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        self.threads = threads
        self.work = Path(tempfile.mkdtemp(prefix="sampler-table-"))
        self.lock = threading.Lock()
        self.rows: dict[str, dict[str, Any]] = {}
        if path.is_file():
            self.rows = json.loads(path.read_text()).get("rows", {})
        self.space = table_space()
        self.model_path = str(resolve_model(self.space.model))
        self.predict = memory_predictor(self.model_path, self.space.model.name_or_path,
                                        self.space.model.attn_implementation, "cpu")  # fmt: skip

    def measure(self, params: dict[str, Any]) -> None:
        """Run the configuration ``params`` unless the table holds it (a run that failed as a run, ``crash``,
        ``timeout`` or ``error``, is measured again), and write the table."""
        key = key_of(params)
        with self.lock:
            done = self.rows.get(key)
        if done is not None and done["status"] not in ("crash", "timeout", "error"):
            return
        config = self.space.trial_config(params)
        start = time.monotonic()
        result = run_trial(config, self.work / str(abs(hash(key))), model_path=self.model_path, env=self.env)
        row = {k: v for k, v in result.to_dict().items() if not k.endswith("_trace")}
        row["params"] = params
        row["predicted_peak_gib"] = self.predict(config)
        row["table_wall_s"] = round(time.monotonic() - start, 1)
        print(f"{key}: {result.status.value} peak {result.memory.peak_memory_gib} "
              f"margin {result.stress.stability_margin} ({row['table_wall_s']:.0f} s)", flush=True)  # fmt: skip
        with self.lock:
            self.rows[key] = row
            self.save()

    def save(self) -> None:
        """Write the file (call with the lock held)."""
        payload = {
            "version": 1,
            "space": str(DEMO.relative_to(ROOT)),
            "grid": GRID,
            "overrides": list(TRIAL_SETTINGS),
            "configurations": len(grid(self.space)),
            "commit": _commit(),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"OMP_NUM_THREADS={self.threads or 'default'}",
            "command": "python benchmarks/samplers/sampler_table.py " + " ".join(sys.argv[1:]),
            "rows": self.rows,
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        os.replace(tmp, self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "sampler_table.json"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--where", action="append", default=[], help="KEY=VALUE: only that part of the grid")
    parser.add_argument("--status", action="store_true", help="count what is measured; run nothing")
    args = parser.parse_args(argv)
    table = Table(Path(args.out), args.threads)
    configs = grid(table.space)
    for item in args.where:
        key, _, value = item.partition("=")
        if key not in table.space.search:
            parser.error(
                f"--where {item}: {key!r} is not searched; choose among {', '.join(sorted(table.space.search))}"
            )
        configs = [p for p in configs if p[key] == yaml.safe_load(value)]
    done = [p for p in configs if key_of(p) in table.rows]
    print(f"{len(done)} of {len(configs)} configurations measured ({len(grid(table.space))} in the grid)")
    if args.status:
        return 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(table.measure, configs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
