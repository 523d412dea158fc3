"""What a trial spends on the data's own tokens, before and after collation as production (issue 45), on the CPU with
the built-in model (SmolLM2-135M-Instruct) and data (pydoc topics, float32 compute, the demo's space).

- ``cost``: one trial's constant phase (``max_steps`` 4, no stress phase) at ``max_seq_length`` 256, 512, 1024 and
  2048, ``per_device_train_batch_size`` 1 and 4: its wall time, constant-phase seconds, and the share of the tokens
  its training steps processed that are the data's own. Before (each row padded to ``max_seq_length``) the share is
  the data's tokens over ``steps x batch x max_seq_length``; after, the trial's own ``data_token_share``.
- ``validity``: the validity block's short figures (stability margin with its interval, instability) of 4
  configurations at seeds 0 and 1, each a full trial (12 constant steps, then the stress phase), as the demo runs
  them.

Run it once with the code before the change on the path and once after; each run's figures go into
``benchmarks/memory/results/collation.json`` under ``--label`` as they end (a rerun skips what is there):

    git worktree add /tmp/before e68ad80
    PYTHONPATH=/tmp/before python benchmarks/memory/collation.py cost --label before
    python benchmarks/memory/collation.py cost --label after
    python benchmarks/memory/collation.py report          # the tables of docs/trial.md

Run nothing else that trains meanwhile (2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common
from _common import REPO as ROOT

RESULTS = Path(__file__).parent / "results" / "collation.json"
SPACE = ROOT / "search_spaces" / "demo.yaml"

COST_LENGTHS = (256, 512, 1024, 2048)
COST_BATCHES = (1, 4)
COST_STEPS = 4


#: Four configurations of the demo's space, each at two seeds: a small and a large adapter scale, nf4 and fp4,
#: batch 1 and 2, 64 and 256 tokens (the validity block's kind of configuration, not tuned here).
def _v(r: int, ratio: float, quant: str, batch: int, length: int) -> dict[str, Any]:
    keys = ("r", "lora_alpha_ratio", "bnb_4bit_quant_type", "per_device_train_batch_size", "max_seq_length")
    return dict(zip(keys, (r, ratio, quant, batch, length)))


VALIDITY = {
    "r4 a/r16 nf4 1x128": _v(4, 16, "nf4", 1, 128),
    "r16 a/r0.25 fp4 2x64": _v(16, 0.25, "fp4", 2, 64),
    "r16 a/r4 nf4 2x256": _v(16, 4, "nf4", 2, 256),
    "r8 a/r2 nf4 1x256": _v(8, 2, "nf4", 1, 256),
}


def _load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}


def _save(label: str, name: str, row: dict[str, Any]) -> None:
    data = _load()
    data.setdefault(label, {})[name] = row
    fd, tmp = tempfile.mkstemp(dir=RESULTS.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, RESULTS)


def _trial(overrides: dict[str, Any], *, stress: bool) -> dict[str, Any]:
    """One trial of the demo space with ``overrides`` (fixed keys), in a scratch folder; its result and the sweeper
    it ran."""
    import sweeper
    from sweeper.model import resolve_model
    from sweeper.space import load_space

    fixed = {"memory_limit_gib": 16, "trial_timeout": "3h", **overrides}  # no cap or timeout gets in the way
    space = load_space(str(SPACE), [f"{k}={v}" for k, v in fixed.items()])
    config = space.trial_config(space.first_choices())
    model_path = resolve_model(space.model)
    with tempfile.TemporaryDirectory() as scratch:
        start = time.monotonic()
        result = _common.run_trial(config, Path(scratch) / "t", model_path=model_path, stress=stress)
        wall = time.monotonic() - start
    out = result.to_dict()
    out["bench_wall_s"] = wall
    out["bench_sweeper"] = str(Path(sweeper.__file__).parent)
    return out


def cost(label: str) -> None:
    done = _load().get(label, {})
    for length in COST_LENGTHS:
        for batch in COST_BATCHES:
            name = f"cost {batch}x{length}"
            if name in done:
                continue
            r = _trial(
                {"max_seq_length": length, "per_device_train_batch_size": batch, "max_steps": COST_STEPS},
                stress=False,
            )
            data_tokens = (r.get("tokens_per_s") or 0.0) * (r.get("train_time_s") or 0.0)
            share = r.get("data_token_share")
            if share is None:  # before: every row padded to max_seq_length
                share = data_tokens / (COST_STEPS * batch * length)
            row = {
                "status": r["status"],
                "wall_s": r["bench_wall_s"],
                "train_time_s": r["train_time_s"],
                "probe_time_s": r.get("probe_time_s"),
                "data_tokens": round(data_tokens),
                "data_token_share": share,
                "peak_memory_gib": r["peak_memory_gib"],
                "phase_peak_memory_gib": r.get("phase_peak_memory_gib"),
                "worst_case_shape": r.get("worst_case_shape"),
                "sweeper": r["bench_sweeper"],
            }
            _save(label, name, row)
            print(name, json.dumps(row), flush=True)


def validity(label: str) -> None:
    done = _load().get(label, {})
    for config_name, settings in VALIDITY.items():
        for seed in (0, 1):
            name = f"validity {config_name} seed {seed}"
            if name in done:
                continue
            r = _trial({**settings, "seed": seed}, stress=True)
            row = {
                k: r.get(k)
                for k in (
                    "status",
                    "stability_margin",
                    "stability_margin_low",
                    "stability_margin_high",
                    "instability",
                    "learning_progress",
                    "loss_trace",
                    "probe_loss_trace",
                    "train_time_s",
                    "peak_memory_gib",
                )
            }
            row["wall_s"], row["sweeper"] = r["bench_wall_s"], r["bench_sweeper"]
            _save(label, name, row)
            print(name, json.dumps({k: row[k] for k in ("status", "stability_margin", "instability")}), flush=True)


def report() -> None:
    """The before/after tables, as docs/trial.md quotes them."""
    data = _load()
    before, after = data.get("before", {}), data.get("after", {})
    print("| batch x max_seq_length | data's share before | after | constant phase before (s) | after (s) |")
    print("|---|---|---|---|---|")
    for length in COST_LENGTHS:
        for batch in COST_BATCHES:
            b, a = before.get(f"cost {batch}x{length}"), after.get(f"cost {batch}x{length}")
            if not (b or a):
                continue

            def cell(r: dict | None, key: str, fmt: str) -> str:
                return format(r[key], fmt) if r and r.get(key) is not None else "-"

            print(
                f"| {batch} x {length} | {cell(b, 'data_token_share', '.0%')} | {cell(a, 'data_token_share', '.0%')} "
                f"| {cell(b, 'train_time_s', '.1f')} | {cell(a, 'train_time_s', '.1f')} |"
            )
    print()
    print("| configuration, seed | margin before | after | instability before | after |")
    print("|---|---|---|---|---|")
    for config_name in VALIDITY:
        for seed in (0, 1):
            name = f"validity {config_name} seed {seed}"
            b, a = before.get(name), after.get(name)

            def margin(r: dict | None) -> str:
                if not r or r.get("stability_margin") is None:
                    return "-" if not r else r["status"]
                high = r.get("stability_margin_high")
                return (
                    f"{r['stability_margin']:.0f}x ({r['stability_margin_low']:.2g}-{high:.2g}x)"
                    if high
                    else (f"{r['stability_margin']:.0f}x (capped)")
                )

            def inst(r: dict | None) -> str:
                return f"{r['instability']:.3f}" if r and r.get("instability") is not None else "-"

            print(f"| {config_name}, {seed} | {margin(b)} | {margin(a)} | {inst(b)} | {inst(a)} |")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("cost", "validity", "report"))
    parser.add_argument("--label", default="after", help="where the figures go: before or after")
    args = parser.parse_args(argv)
    if args.what == "report":
        report()
    elif args.what == "cost":
        cost(args.label)
    else:
        validity(args.label)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
