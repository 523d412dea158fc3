"""Per-trial overhead of warm and cold trial processes, side by side, from one run.

Runs a real sweep of a space (default: the demo, ``search_spaces/demo.yaml``) as ``sweep run`` does, each worker slot
keeping a warm trial process (:class:`sweeper.trial.TrialProcess`); then runs each configuration that sweep measured
again in a fresh process of its own (the cold path, :func:`sweeper.trial.run_trial`). For every trial it prints the
seconds outside training (process start, imports, data, 4-bit load and LoRA, writing the result: ``wall_time_s -
train_time_s``) and inside it (``train_time_s``), their ratio, warm and cold, and the peak memory warm and cold (a
warm process must not change it); then the medians over all trials (the warm sweep's cold first trial and the trials
after a replaced process included) and the share of warm trials.

    .venv/bin/python benchmarks/speed/trial_overhead.py [--space search_spaces/demo.yaml] \\
        [--set study.n_trials=10] [--json F]

The sweep runs in a temporary folder (its own study); nothing is written under ``studies/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
from _common import REPO

from sweeper.model import resolve_model
from sweeper.space import load_space
from sweeper.study import stored_trials
from sweeper.sweep import plan_sweep, run_study
from sweeper.trial import run_trial


def _ratio(outside: float | None, inside: float | None) -> float | None:
    return outside / inside if outside is not None and inside else None


def _fmt(x: float | None, spec: str = "6.2f") -> str:
    return format(x, spec) if x is not None else "-".rjust(len(format(0.0, spec)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(REPO / "search_spaces" / "demo.yaml"))
    parser.add_argument("--set", action="append", default=[], dest="overrides", metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args()
    space = load_space(args.space, args.overrides)
    model_path = resolve_model(space.model)
    json_path = Path(args.json).resolve() if args.json else None
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        t0 = time.monotonic()
        study = run_study(plan_sweep(space, model_path, storage=f"sqlite:///{folder}/overhead.db"))
        sweep_s = time.monotonic() - t0
        for t in stored_trials(study):
            result = t.result
            if (
                t.repeat_of is not None
                or t.config is None
                or result.constant.train_time_s is None
                or result.provenance.wall_time_s is None
            ):
                continue  # repeats, preflight prunes: nothing ran
            cold = run_trial(t.config, Path(folder) / "cold" / str(t.number), model_path=model_path)
            rows.append((t, result, cold))
    header = (
        f"{'#':>3} {'status':<9} {'warm process':<17} {'setup_s':>7} {'out_s':>6} {'train_s':>7} {'ratio':>6}   "
        f"{'cold: setup_s':>13} {'out_s':>6} {'train_s':>7} {'ratio':>6}   {'peak GiB warm':>13} {'cold':>6}"
    )
    print(header)
    print("-" * len(header))
    warm_ratios, cold_ratios, figures = [], [], []
    for t, warm, cold in rows:
        kind = (
            "warm, model kept" if warm.provenance.model_reused else "warm" if warm.provenance.warm else "cold (first)"
        )
        warm_out = warm.provenance.wall_time_s - warm.constant.train_time_s
        cold_out = (
            cold.provenance.wall_time_s - cold.constant.train_time_s if cold.constant.train_time_s is not None else None
        )
        wr, cr = _ratio(warm_out, warm.constant.train_time_s), _ratio(cold_out, cold.constant.train_time_s)
        warm_ratios.append(wr)
        if cr is not None:
            cold_ratios.append(cr)
        print(
            f"{t.number:>3} {warm.status:<9} {kind:<17} {_fmt(warm.provenance.setup_time_s, '7.2f')} {_fmt(warm_out)} "
            f"{_fmt(warm.constant.train_time_s, '7.2f')} {_fmt(wr)}   "
            f"{_fmt(cold.provenance.setup_time_s, '13.2f')} {_fmt(cold_out)} "
            f"{_fmt(cold.constant.train_time_s, '7.2f')} {_fmt(cr)}   {_fmt(warm.memory.peak_memory_gib, '13.3f')} "
            f"{_fmt(cold.memory.peak_memory_gib, '6.3f')}"
        )
        figures.append(
            {
                "number": t.number,
                "params": t.params,
                "status": warm.status,
                "warm": warm.provenance.warm,
                "model_reused": warm.provenance.model_reused,
                "warm_setup_time_s": warm.provenance.setup_time_s,
                "warm_outside_s": warm_out,
                "warm_train_time_s": warm.constant.train_time_s,
                "warm_ratio": wr,
                "cold_status": cold.status,
                "cold_setup_time_s": cold.provenance.setup_time_s,
                "cold_outside_s": cold_out,
                "cold_train_time_s": cold.constant.train_time_s,
                "cold_ratio": cr,
                "warm_peak_memory_gib": warm.memory.peak_memory_gib,
                "cold_peak_memory_gib": cold.memory.peak_memory_gib,
            }
        )
    ran_warm = sum(1 for _, w, _ in rows if w.provenance.warm)
    kept = sum(1 for _, w, _ in rows if w.provenance.model_reused)
    summary = {
        "trials_measured": len(rows),
        "warm_trials": ran_warm,
        "model_kept_trials": kept,
        "median_ratio_warm_sweep": statistics.median(warm_ratios) if warm_ratios else None,
        "median_ratio_cold": statistics.median(cold_ratios) if cold_ratios else None,
        "median_outside_s_warm_sweep": statistics.median(f["warm_outside_s"] for f in figures) if figures else None,
        "median_outside_s_cold": statistics.median(f["cold_outside_s"] for f in figures if f["cold_outside_s"])
        if figures
        else None,
        "sweep_wall_time_s": sweep_s,
        "space": args.space,
        "overrides": args.overrides,
        "threads": os.environ.get("OMP_NUM_THREADS"),
    }
    print(
        f"\n{len(rows)} trials measured; {ran_warm} ran warm ({kept} with the 4-bit model kept). "
        f"(time outside training)/(time inside): median {_fmt(summary['median_ratio_warm_sweep'], '.2f')} in the "
        f"warm sweep (its cold trials included) against {_fmt(summary['median_ratio_cold'], '.2f')} cold; "
        f"outside training a median {_fmt(summary['median_outside_s_warm_sweep'], '.1f')} s against "
        f"{_fmt(summary['median_outside_s_cold'], '.1f')} s"
    )
    if json_path is not None:
        json_path.write_text(json.dumps({"summary": summary, "trials": figures}, indent=1))


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"benchmark wall time {time.monotonic() - t0:.0f} s")
