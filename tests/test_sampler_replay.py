"""The sampler replay's bookkeeping (``benchmarks/samplers/sampler_replay.py``): what each asked trial costs, and the
hypervolume it reports. The table here is SYNTHETIC (made-up peaks, margins and times over the real grid's
configurations): the real table takes hours of trials, and these checks are about the replay's arithmetic, not about
which sampler wins."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "samplers"))

pytest.importorskip("scipy")  # the replay's Mann-Whitney test; GPSampler needs it too

import sampler_replay as replay_mod
from sampler_table import grid, key_of, table_space


@pytest.fixture(scope="module")
def synthetic_table(tmp_path_factory) -> Path:
    rows = {}
    for p in grid(table_space()):
        tokens = p["per_device_train_batch_size"] * p["max_seq_length"]
        peak = 0.8 + 0.0015 * tokens + 0.01 * p["r"]  # float32 compute, as the demo's
        alpha = p["r"] * p["lora_alpha_ratio"]
        status = "oom" if peak > 1.6 else "diverged" if alpha >= 512 else "complete"
        margin = 2000 / alpha
        rows[key_of(p)] = {
            "status": status, "peak_memory_gib": peak, "wall_time_s": 100.0, "params": p,
            "stability_margin": margin if status == "complete" else None,
            "stability_margin_low": margin / 1.8, "stability_margin_high": margin * 1.8,
            "predicted_peak_gib": peak,  # an exact memory model: every OOM is predicted
        }  # fmt: skip
    path = tmp_path_factory.mktemp("table") / "sampler_table.json"
    path.write_text(json.dumps({"configurations": len(rows), "rows": rows}))
    return path


def test_the_true_front_has_ratio_one_and_a_dominated_point_adds_nothing():
    ref = [2.0, 1.0]
    assert replay_mod.hypervolume([[1.0, 0.5]], ref) == pytest.approx(0.5)
    assert replay_mod.hypervolume([[1.0, 0.5], [1.5, 0.8]], ref) == pytest.approx(0.5)
    assert replay_mod.hypervolume([[1.0, 0.5], [1.5, 0.2]], ref) == pytest.approx(0.5 + 0.5 * 0.3)
    assert replay_mod.hypervolume([[3.0, 0.1]], ref) == 0.0  # beyond the reference point


def test_a_replay_charges_measured_trials_only(synthetic_table):
    table = replay_mod.Table(synthetic_table)
    unpruned = replay_mod.replay(table, "random", seed=0, prune=False, n_trials=60)
    pruned = replay_mod.replay(table, "random", seed=0, prune=True, n_trials=60)
    # the same asks (random ignores outcomes): pruning only saves time, on the OOM configurations
    assert unpruned.costs.count(0.0) == sum(not m for m in unpruned.measured)  # repeats are free
    assert sum(pruned.costs) < sum(unpruned.costs)
    assert pruned.ratios == unpruned.ratios  # an OOM adds nothing to the front either way
    assert all(a <= b + 1e-12 for a, b in zip(unpruned.ratios, unpruned.ratios[1:]))  # the front only grows
    trials, wall = unpruned.to_target()
    assert trials is None or (unpruned.ratios[trials - 1] >= replay_mod.TARGET and wall == sum(unpruned.costs[:trials]))


def test_front_seeds_are_the_least_memory_at_each_lora_alpha(synthetic_table):
    table = replay_mod.Table(synthetic_table)
    seeds = replay_mod.front_seeds(table)
    alphas = [p["r"] * p["lora_alpha_ratio"] for p in seeds]
    assert len(alphas) == len(set(alphas)) == 5  # r 4, 16 x ratio 0.25, 16, 64: 1, 4, 64, 256, 1024
    assert all(p["per_device_train_batch_size"] == 1 and p["max_seq_length"] == 64 for p in seeds)
