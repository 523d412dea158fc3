"""Issue 28's held-back checks, read from ``sweep trial --json`` as a user reads them.

On the built-in model and the demo's space (float32 compute), with configurations the validity benchmarks, the block
and the sampler table never ran (r 8, ``lora_alpha_ratio`` 2, double quant off):

- ``seeds``: the same configuration at ``seed`` 0 and 1 (LoRA's initialisation and the data order), and at a tenth of
  the learning rate. Checks: every figure carries its interval (``stability_margin_low``/``_high``,
  ``predicted_max_lr_low``/``_high``); the second seed's margin falls inside the first seed's interval; the 10x change
  of the learning rate separates the margins beyond their intervals.
- ``calibrated``: with ``--predicted-max-lr X`` (a trial's ``predicted_max_lr`` after ``sweep calibrate`` on a
  held-back study) and ``--set`` the trial's settings, constant runs of ``--steps`` (default 300) at 2X and X/2.
  Check: the first fails (``nan`` or ``diverged``) and the second holds.

Each run's JSON is kept in ``benchmarks/stability/results/heldback_checks.json`` as it ends; a rerun skips what is
there.

    python benchmarks/stability/heldback_checks.py seeds --jobs 2
    python benchmarks/stability/heldback_checks.py calibrated --predicted-max-lr 0.0061 --set r=4 ...

Run nothing else that trains meanwhile (2 cores: the runs take one thread each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
from _common import REPO as ROOT

RESULTS = Path(__file__).parent / "results" / "heldback_checks.json"
SPACE = ROOT / "search_spaces" / "demo.yaml"
SWEEP = Path(sys.executable).parent / "sweep"
FAILED = ("nan", "diverged")

#: The held-back configuration: none of the benchmarks ran r 8, lora_alpha_ratio 2 with double quant off.
HELD_BACK = {
    "r": "8",
    "lora_alpha_ratio": "2",
    "bnb_4bit_use_double_quant": "false",
    "bnb_4bit_quant_type": "nf4",
    "per_device_train_batch_size": "1",
    "max_seq_length": "64",
    "max_steps": "30",
}
SEED_RUNS = {
    "seed 0, lr 2e-3": {**HELD_BACK, "seed": "0", "learning_rate": "0.002"},
    "seed 1, lr 2e-3": {**HELD_BACK, "seed": "1", "learning_rate": "0.002"},
    "seed 0, lr 2e-4": {**HELD_BACK, "seed": "0", "learning_rate": "0.0002"},
}


def _load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def _save(name: str, result: dict[str, Any]) -> None:
    data = _load()
    data[name] = result
    fd, tmp = tempfile.mkstemp(dir=RESULTS.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, RESULTS)


def run(name: str, settings: dict[str, str]) -> dict[str, Any]:
    """``sweep trial SPACE --set k=v ... --json`` in a scratch folder, one thread; its JSON, kept under ``name``."""
    done = _load().get(name)
    if done is not None:
        return done
    args = [str(SWEEP), "trial", str(SPACE), "--json"]
    for k, v in settings.items():
        args += ["--set", f"{k}={v}"]
    with tempfile.TemporaryDirectory() as scratch:
        out = subprocess.run(
            args, cwd=scratch, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    if out.returncode != 0:
        raise SystemExit(f"{name}: sweep trial exited {out.returncode}: {out.stderr.strip()[-400:]}")
    result = json.loads(out.stdout)
    keep = ("status", "reason", "fail_step", "steps_done", "stability_margin", "stability_margin_low",
            "stability_margin_high", "margin_capped", "lr_ceiling", "predicted_max_lr", "predicted_max_lr_low",
            "predicted_max_lr_high", "predicted_max_lr_source", "instability", "learning_progress",
            "wall_time_s")  # fmt: skip
    kept = {"settings": settings, **{k: result.get(k) for k in keep}}
    _save(name, kept)
    print(f"{name}: {kept['status']}, margin {kept['stability_margin']} ({kept['stability_margin_low']}-"
          f"{kept['stability_margin_high']}), predicted_max_lr {kept['predicted_max_lr']}", flush=True)  # fmt: skip
    return kept


def check_seeds(results: dict[str, dict[str, Any]]) -> list[tuple[str, bool]]:
    a, b, tenth = (results[n] for n in SEED_RUNS)
    intervals = all(
        r.get(k) is not None
        for r in (a, b, tenth)
        for k in ("stability_margin_low", "predicted_max_lr_low", "predicted_max_lr_high")
    ) and all(r.get("stability_margin_high") is not None or r.get("margin_capped") for r in (a, b, tenth))
    inside = a["stability_margin_low"] <= b["stability_margin"] <= a["stability_margin_high"]
    apart = tenth["stability_margin_low"] > a["stability_margin_high"]
    return [
        ("every figure carries its interval", intervals),
        ("the second seed's margin is inside the first seed's interval", inside),
        ("a tenth of the learning rate: the margins apart beyond their intervals", apart),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("part", choices=["seeds", "calibrated"])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--predicted-max-lr", type=float)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="the trial's settings")
    args = parser.parse_args(argv)
    if args.part == "seeds":
        runs = SEED_RUNS
    else:
        if args.predicted_max_lr is None:
            parser.error("calibrated: --predicted-max-lr is required")
        base = dict(kv.split("=", 1) for kv in args.set)
        x = args.predicted_max_lr
        long = {"max_steps": str(args.steps), "trial_timeout": "60m", "study.confirm_steps": str(10 * args.steps)}
        runs = {
            f"calibrated {x:.4g}: 2x, {args.steps} steps": {**base, **long, "learning_rate": f"{2 * x:.6g}"},
            f"calibrated {x:.4g}: 1/2, {args.steps} steps": {**base, **long, "learning_rate": f"{x / 2:.6g}"},
        }
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(runs, pool.map(lambda kv: run(*kv), runs.items())))
    if args.part == "seeds":
        checks = check_seeds(results)
    else:
        high, low = results.values()
        checks = [
            (f"2x predicted_max_lr fails within {args.steps} steps", high["status"] in FAILED),
            (f"1/2 predicted_max_lr holds {args.steps} steps", low["status"] == "complete"),
        ]
    for what, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {what}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
