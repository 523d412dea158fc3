"""The equal-step block of the validity benchmark: configurations that share ``learning_rate x lora_alpha`` and
differ, one at a time, in what that product ignores, each at 3 seeds. Does the short trial's figure see what the long
run sees where the free formula ties, and how large is its noise?

Each configuration (``BLOCK`` below: r at a fixed ``lora_alpha``, compute dtype, quant type, double quant, batch,
``max_seq_length``, the data, and learning rate against ``lora_alpha``) runs, at each seed (``seed``: LoRA's
initialisation and the Trainer's data order), in phases a rerun resumes:

1. ``short``: the sweep's trial (30 constant steps, then the stress phase), through the same trial process as
   ``sweep run``: the margin, ``predicted_max_lr``, and the candidate early signs (the probe loss, the gradient norm,
   the adapters' update-to-weight ratio, the stress phase's probe trace);
2. ``own``: a constant-rate run of ``--long`` steps (default 200) at the configuration's own rate: holds or fails;
3. ``edge``: the long-run edge, bisected per seed to a factor of ``--resolution`` (default 1.5) or better: the largest
   multiple of the rate that held ``--long`` steps and the smallest that failed.

Each run's result is written to ``benchmarks/stability/results/validity_block.json`` as it ends (an atomic rename), so a
stopped run keeps what it measured and a rerun skips what is there; ``validity_block.md`` is rewritten with it: per
configuration and seed, the figures, and the summary (the figure's seed spread in ladder steps, the share of
configurations whose seeds disagree at their own rate, AUC and Spearman of the figure and the free baselines, with
bootstrap 95% intervals over configurations).

    python benchmarks/stability/validity_block.py --jobs 2 --threads 1                 # every phase (hours on 2 cores)
    python benchmarks/stability/validity_block.py --phase short --jobs 2 --threads 1   # the short trials only
    python benchmarks/stability/validity_block.py --report                             # rewrite the tables, run nothing

The base is float32 compute: on a CPU without AVX512-BF16 a bfloat16 step is about 7x slower than a float32 one
(measured: 17.7 s against 2.4 s a step on the built-in model, AMD EPYC with AVX2), so bfloat16 is one configuration
of the block, not its base. Run nothing else that trains while it runs (see ``validity.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common

sys.path.insert(0, str(Path(__file__).parent))

from validity import BASE, FAILED, auc, bootstrap, loss_trend, spearman

from sweeper.model import resolve_model
from sweeper.space import TrialConfig
from sweeper.stability import STRESS_GROWTH

#: The product every configuration of the block shares: learning_rate x lora_alpha = 4e-3 x 64. Near the built-in
#: model's 200-step edge at float32 compute (the first benchmark: 3e-3 x 64 held with a margin of 19x, 1e-2 x 64
#: diverged within 30 steps), so that long runs at the trial's own rate both hold and fail.
STEP = 4e-3 * 64


@dataclass(frozen=True)
class BlockCase:
    """One configuration of the block: what differs from the base (r 8, lora_alpha 64, float32, nf4, double quant,
    batch 1, 64 tokens, data shuffle 0) and its name."""

    name: str
    r: int = 8
    lora_alpha: float = 64.0
    bnb_4bit_compute_dtype: str = "float32"
    bnb_4bit_quant_type: str = "nf4"
    bnb_4bit_use_double_quant: bool = True
    per_device_train_batch_size: int = 1
    max_seq_length: int = 64
    dataset_seed: int = 0

    @property
    def learning_rate(self) -> float:
        """The rate that keeps ``learning_rate x lora_alpha`` at :data:`STEP`."""
        return STEP / self.lora_alpha

    def config(self, steps: int, seed: int, multiple: float = 1.0) -> TrialConfig:
        """Its trial config at ``steps`` steps, ``seed``, and ``multiple`` times its rate."""
        return replace(
            BASE,
            r=self.r,
            lora_alpha_ratio=self.lora_alpha / self.r,
            bnb_4bit_compute_dtype=self.bnb_4bit_compute_dtype,
            bnb_4bit_quant_type=self.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=self.bnb_4bit_use_double_quant,
            per_device_train_batch_size=self.per_device_train_batch_size,
            max_seq_length=self.max_seq_length,
            learning_rate=self.learning_rate * multiple,
            max_steps=steps,
            seed=seed,
            dataset=replace(BASE.dataset, seed=self.dataset_seed),
        )


#: One setting at a time; the cheap ones first (batch 2, 128 tokens and bfloat16 cost 2-7x a step here).
BLOCK = (
    BlockCase("base"),
    BlockCase("r=16", r=16),
    BlockCase("r=4", r=4),
    BlockCase("r=32", r=32),
    BlockCase("fp4", bnb_4bit_quant_type="fp4"),
    BlockCase("no double quant", bnb_4bit_use_double_quant=False),
    BlockCase("data shuffle 1", dataset_seed=1),
    BlockCase("lr x2, lora_alpha 32", lora_alpha=32.0),
    BlockCase("lr /2, lora_alpha 128", lora_alpha=128.0),
    BlockCase("batch 2", per_device_train_batch_size=2),
    BlockCase("max_seq_length 128", max_seq_length=128),
    BlockCase("bfloat16", bnb_4bit_compute_dtype="bfloat16"),
)
SEEDS = (0, 1, 2)

KEEP = (
    "status", "reason", "fail_step", "steps_done", "instability", "probe_steps", "probe_loss_trace",
    "probe_time_share", "train_time_s", "loss_trace", "grad_norm_trace", "update_ratio_trace", "lr_ceiling",
    "stability_margin", "stability_margin_low", "stability_margin_high", "margin_capped", "predicted_max_lr",
    "predicted_max_lr_low", "predicted_max_lr_high", "learning_progress", "stress_stop", "stress_steps",
    "stress_lr_trace", "stress_probe_loss_trace", "stress_time_s", "stress_time_share",
)  # fmt: skip


class Block:
    """The block's results file, and the runs (``jobs`` at a time) that fill it."""

    def __init__(self, out: Path, threads: int | None, long: int, resolution: float):
        self.out, self.long, self.resolution = out, long, resolution
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        self.work = Path(tempfile.mkdtemp(prefix="validity-block-"))
        self.lock = threading.Lock()
        self.path = out / "validity_block.json"
        self.runs: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            self.runs = json.loads(self.path.read_text()).get("runs", {})
        self._model: Path | None = None

    @property
    def model_path(self) -> Path:
        if self._model is None:
            self._model = resolve_model(BASE.model)
        return self._model

    def run(self, key: str, config: TrialConfig, stress: bool) -> dict[str, Any]:
        """The run ``key`` (measured now unless the file has it, a run that failed as a run measured again)."""
        with self.lock:
            done = self.runs.get(key)
        if done is not None and done["status"] not in ("crash", "timeout", "error"):
            return done
        start = time.monotonic()
        result = _common.run_trial(config, self.work / key.replace(" ", "_").replace("/", "_"),
                           model_path=self.model_path, env=self.env, stress=stress)  # fmt: skip
        data = {k: result.to_dict().get(k) for k in KEEP}
        data["wall_s"] = round(time.monotonic() - start, 1)
        print(f"{key}: {result.status} step {result.fail_step or result.constant.steps_done} "
              f"margin={result.stress.stability_margin} ({data['wall_s']:.0f} s)", flush=True)  # fmt: skip
        with self.lock:
            self.runs[key] = data
            self.save()
        return data

    def save(self) -> None:
        """Write the file and the tables (call with the lock held)."""
        summary = _nulls(summarize(self.runs, self.long))
        payload = {"version": 1, "step": STEP, "long_steps": self.long, "resolution": self.resolution,
                   "cases": [asdict(c) for c in BLOCK], "summary": summary, "runs": self.runs}  # fmt: skip
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        os.replace(tmp, self.path)
        self.path.with_suffix(".md").write_text(markdown(self.runs, summary, self.long))


def _nulls(value: Any) -> Any:
    """``value`` with every non-finite float as None: a figure undefined on the block (a Spearman of a constant) is
    JSON's null, not Python's NaN, which strict JSON readers refuse."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _nulls(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_nulls(v) for v in value]
    return value


def short_key(case: BlockCase, seed: int) -> str:
    return f"{case.name} | seed {seed} | short"


def own_key(case: BlockCase, seed: int, long: int) -> str:
    return f"{case.name} | seed {seed} | x1 | {long} steps"


def edge_key(case: BlockCase, seed: int, multiple: float, long: int) -> str:
    return f"{case.name} | seed {seed} | x{multiple:.4g} | {long} steps"


def bisect_edge(block: Block, case: BlockCase, seed: int) -> None:
    """The smallest multiple of the case's rate at which a ``block.long``-step run fails, per seed, to a factor of
    ``block.resolution``: from the own-rate run, one step of sqrt(2) up (or down), then doubling (or halving) until
    the outcome flips, then bisection in log space between the largest multiple that held and the smallest that
    failed. Every multiple is a power of sqrt(2), so seeds share their runs' multiples; an edge within a factor of
    sqrt(2) of the own rate, the block's usual case, costs one run after the own-rate one where doubling first cost
    two."""
    own = block.run(own_key(case, seed, block.long), case.config(block.long, seed), stress=False)
    held, failed = (1.0, None) if own["status"] not in FAILED else (None, 1.0)
    step = math.sqrt(2.0)
    while held is None or failed is None:
        multiple = failed / step if held is None else held * step  # type: ignore[operator]
        step = 2.0
        if multiple < 1 / 64 or multiple > 64:
            return
        run = block.run(edge_key(case, seed, multiple, block.long), case.config(block.long, seed, multiple), False)
        if run["status"] in FAILED:
            failed = multiple
        else:
            held = multiple
    while failed / held > block.resolution:
        multiple = math.sqrt(held * failed)
        run = block.run(edge_key(case, seed, multiple, block.long), case.config(block.long, seed, multiple), False)
        if run["status"] in FAILED:
            failed = multiple
        else:
            held = multiple


# --- the analysis ----------------------------------------------------------------------------------------------------


def edge_of(runs: dict[str, dict[str, Any]], case: BlockCase, seed: int, long: int) -> tuple[float, float] | None:
    """(largest multiple that held, smallest that failed) of the case at ``seed``, when both were run."""
    prefix = f"{case.name} | seed {seed} | x"
    held, failed = [], []
    for key, run in runs.items():
        if key.startswith(prefix) and key.endswith(f"| {long} steps"):
            multiple = float(key[len(prefix) :].split(" |")[0])
            (failed if run["status"] in FAILED else held).append(multiple)
    below = [h for h in held if not failed or h < min(failed)]
    if not below or not failed:
        return None
    return max(below), min(failed)


def _log_slope(ys: list[float]) -> float:
    """Least-squares slope of ``log(y)`` over the index (per step)."""
    pts = [(i, math.log(y)) for i, y in enumerate(ys) if y is not None and y > 0 and math.isfinite(y)]
    if len(pts) < 3:
        return math.nan
    mx = statistics.fmean(p[0] for p in pts)
    my = statistics.fmean(p[1] for p in pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx else math.nan


def ramp_crossing(short: dict[str, Any], threshold: float = 1.2) -> float:
    """The stress phase read below its ladder: the rate multiple at which the probe loss first reaches
    ``threshold`` times its value when the stress phase began, interpolated in log rate between the two stress steps
    around it (the ceiling itself is the first step whose probe shows the 1.5x divergence). nan when never reached."""
    start = (short.get("probe_loss_trace") or [None])[-1]
    lrs, probes = short.get("stress_lr_trace") or [], short.get("stress_probe_loss_trace") or []
    if not start or not lrs:
        return math.nan
    base_lr = lrs[0] / STRESS_GROWTH
    prev_lr, prev = base_lr, 1.0
    for lr, p in zip(lrs, probes):
        ratio = math.inf if p is None or not math.isfinite(p) else p / start
        if ratio >= threshold:
            if not math.isfinite(ratio) or ratio == prev:
                return lr / base_lr
            frac = (math.log(threshold) - math.log(prev)) / (math.log(ratio) - math.log(prev)) if prev > 0 else 1.0
            frac = min(1.0, max(0.0, frac))
            return math.exp(math.log(prev_lr) + frac * (math.log(lr) - math.log(prev_lr))) / base_lr
        prev_lr, prev = lr, max(ratio, 1e-9)
    return math.nan


def curvature(probes: list[float]) -> float:
    """The probe loss's second difference over its last 3 probes (positive: bending up); nan with fewer."""
    return probes[-1] - 2 * probes[-2] + probes[-3] if len(probes) >= 3 else math.nan


def candidates(case: BlockCase, short: dict[str, Any]) -> dict[str, float]:
    """Every figure scored, each signed so that higher = nearer the edge (riskier): the margin, the free baselines and
    the candidate early signs, from the short trial at one seed."""
    lr, alpha = case.learning_rate, case.lora_alpha
    margin = short.get("stability_margin")
    grads = [g for g in (short.get("grad_norm_trace") or []) if g is not None]
    ratio = [u for u in (short.get("update_ratio_trace") or []) if u is not None]
    probes = [p for p in (short.get("probe_loss_trace") or []) if p is not None]
    half = len(ratio) // 2
    crossing = ramp_crossing(short)
    return {
        "1/stability_margin": 1 / margin if margin else 1.0,
        "learning_rate": lr,
        "learning_rate x lora_alpha": lr * alpha,
        "learning_rate x lora_alpha/r": lr * alpha / case.r,
        "learning_rate x lora_alpha/sqrt(r)": lr * alpha / math.sqrt(case.r),
        "training-loss trend": loss_trend(short.get("loss_trace") or []),
        "instability": short.get("instability") if short.get("instability") is not None else math.nan,
        "update-to-weight ratio (end)": ratio[-1] if ratio else math.nan,
        "update-to-weight growth (log slope, 2nd half)": _log_slope(ratio[half:]) if half >= 2 else math.nan,
        "gradient-norm trend (log slope)": _log_slope(grads),
        "probe-loss curvature (last 3 probes)": curvature(probes),
        "1/ramp crossing at 1.2x": 1 / crossing if math.isfinite(crossing) else 0.0,
        # Parameter-free combinations, added after the single figures were scored on this block (so chosen on it:
        # exploratory until held-out configurations confirm them).
        "(1 + instability) / stability_margin": (1 + (short.get("instability") or 0.0)) / margin if margin else 1.0,
        "update-to-weight ratio / stability_margin": ratio[-1] / margin if margin and ratio else math.nan,
    }  # fmt: skip


def reliability(shorts: dict[tuple[str, int], dict[str, Any] | None]) -> dict[str, Any]:
    """Per candidate, how much of its spread over the block's complete short trials is between configurations rather
    than between seeds of one configuration: the intraclass correlation ICC(1) of its value (log of a positive one)
    over configurations with 2+ seeds (Shrout & Fleiss 1979). 1: the seed does not move it; 0: only the seed does. A
    figure that should order configurations the step size ties needs a high one."""
    groups: dict[str, dict[str, list[float]]] = {}
    for c in BLOCK:
        for s in SEEDS:
            short = shorts[(c.name, s)]
            if not short or short["status"] != "complete":
                continue
            for name, value in candidates(c, short).items():
                if value is None or not math.isfinite(value):
                    continue
                groups.setdefault(name, {}).setdefault(c.name, []).append(value)
    out = {}
    for name, by_case in groups.items():
        rows = [v for v in by_case.values() if len(v) >= 2]
        if len(rows) < 3:
            continue
        positive = all(x > 0 for r in rows for x in r)
        rows = [[math.log(x) for x in r] if positive else r for r in rows]
        k = statistics.fmean(len(r) for r in rows)
        grand = statistics.fmean(x for r in rows for x in r)
        between = sum(len(r) * (statistics.fmean(r) - grand) ** 2 for r in rows) / (len(rows) - 1)
        within_df = sum(len(r) - 1 for r in rows)
        within = sum((x - statistics.fmean(r)) ** 2 for r in rows for x in r) / within_df if within_df else math.nan
        denom = between + (k - 1) * within
        out[name] = {"icc": round((between - within) / denom, 3) if denom > 0 else None, "configurations": len(rows)}
    return out


def summarize(runs: dict[str, dict[str, Any]], long: int) -> dict[str, Any]:
    """The block's figures from the runs there are (see the module docstring)."""
    shorts = {(c.name, s): runs.get(short_key(c, s)) for c in BLOCK for s in SEEDS}
    out: dict[str, Any] = {"short_trials": sum(1 for v in shorts.values() if v)}
    # The figure's seed noise: per configuration with 2+ seeds, the spread of the margin in ladder steps.
    spreads = []
    for c in BLOCK:
        margins = [v["stability_margin"] for s in SEEDS if (v := shorts[(c.name, s)]) and v.get("stability_margin")]
        if len(margins) >= 2:
            spreads.append(round(math.log(max(margins) / min(margins)) / math.log(STRESS_GROWTH), 2))
    out["margin_seed_spread_steps"] = spreads
    if spreads:
        out["margin_seed_spread_share_within_1_step"] = sum(1 for s in spreads if s <= 1.0001) / len(spreads)
    # The interval's coverage: over ordered pairs of seeds of one configuration, the share whose second margin lies
    # inside the first's stored interval (what "a second seed's figure falls inside the first seed's interval" asks).
    inside = pairs = 0
    for c in BLOCK:
        got = [v for s in SEEDS if (v := shorts[(c.name, s)]) and v.get("stability_margin")]
        for a in got:
            for b in got:
                if a is b:
                    continue
                low = a.get("stability_margin_low") or a["stability_margin"] / STRESS_GROWTH
                high = a.get("stability_margin_high") or a["stability_margin"] * STRESS_GROWTH
                pairs += 1
                inside += low <= b["stability_margin"] <= high
    if pairs:
        out["second_seed_inside_first_interval"] = {"pairs": pairs, "inside": inside, "share": round(inside / pairs, 3)}
    out["seed_reliability"] = reliability(shorts)
    # Own rate: the failure share per configuration, and the share whose seeds disagree.
    rows = []
    disagree = 0
    counted = 0
    for c in BLOCK:
        outcomes = [runs.get(own_key(c, s, long)) for s in SEEDS]
        known = [o for o in outcomes if o]
        if len(known) >= 2:
            counted += 1
            fails = {o["status"] in FAILED for o in known}
            disagree += len(fails) > 1
        for s, o in zip(SEEDS, outcomes):
            short = shorts[(c.name, s)]
            if o and short and short["status"] == "complete":
                rows.append((c, short, o["status"] in FAILED))
    out["own_rate_runs"] = len(rows)
    out["own_rate_failures"] = sum(1 for r in rows if r[2])
    if counted:
        out["share_of_configurations_whose_seeds_disagree"] = round(disagree / counted, 3)
        out["configurations_with_2_seeds"] = counted
    if rows:
        names = list(candidates(rows[0][0], rows[0][1]))
        table = {}
        for name in names:
            xs = [candidates(c, s)[name] for c, s, _ in rows]
            ys = [f for _, _, f in rows]
            ok = [i for i, x in enumerate(xs) if not math.isnan(x)]

            def stat(idx: list[int], xs: list[float] = xs, ys: list[bool] = ys) -> float:
                return auc([xs[i] for i in idx], [ys[i] for i in idx])

            def resampled(idx: list[int], ok: list[int] = ok) -> float:
                return stat([ok[i] for i in idx])

            low, high = bootstrap(resampled, len(ok)) if ok else (math.nan, math.nan)
            # Seeds of one configuration are not independent: resample whole configurations too.
            groups = sorted({rows[i][0].name for i in ok})

            def by_case(idx: list[int], ok: list[int] = ok, groups: list[str] = groups) -> float:
                picked = [i for g in idx for i in ok if rows[i][0].name == groups[g]]
                return stat(picked)

            clow, chigh = bootstrap(by_case, len(groups)) if ok else (math.nan, math.nan)
            table[name] = {
                "auc": round(stat(ok), 3) if ok else None,
                "auc_low": low,
                "auc_high": high,
                "auc_low_by_configuration": clow,
                "auc_high_by_configuration": chigh,
            }
        out["auc_failure_at_own_rate"] = table
        out["own_rate_configurations"] = len({c.name for c, _, _ in rows})
        out["own_rate_configurations_that_held"] = sorted({c.name for c, _, f in rows if not f})
        # Time to failure at the own rate, per configuration: the mean step of failure over its seeds (a run that
        # held counts as long + 1), against each figure's mean over the same seeds; Spearman, bootstrap over
        # configurations. Higher figure (of what foretells a failure) should go with an earlier failure.
        steps: dict[str, list[float]] = {}
        figures: dict[str, dict[str, list[float]]] = {}
        for c in BLOCK:
            for seed in SEEDS:
                o, short = runs.get(own_key(c, seed, long)), shorts[(c.name, seed)]
                if not o or not short or short["status"] != "complete":
                    continue
                failed_at = o.get("fail_step") if o["status"] in FAILED else None
                steps.setdefault(c.name, []).append(float(failed_at if failed_at else long + 1))
                for name, x in candidates(c, short).items():
                    figures.setdefault(name, {}).setdefault(c.name, []).append(x)
        cases = sorted(steps)
        if len(cases) >= 4:
            mean_step = [statistics.fmean(steps[n]) for n in cases]
            ttf = {}
            for name, per in figures.items():
                xs = [-statistics.fmean(per[n]) for n in cases]
                if any(math.isnan(x) for x in xs):
                    continue
                low, high = bootstrap(lambda idx, xs=xs: spearman([xs[i] for i in idx], [mean_step[i] for i in idx]),
                                      len(cases))  # fmt: skip
                ttf[name] = {"spearman": round(spearman(xs, mean_step), 3), "low": low, "high": high}
            out["time_to_failure_spearman"] = {"configurations": len(cases), "by_figure": ttf}
    # Edges per seed (where bisected): Spearman of each figure with the edge.
    edges = []
    for c in BLOCK:
        for s in SEEDS:
            found = edge_of(runs, c, s, long)
            short = shorts[(c.name, s)]
            if found and short and short["status"] == "complete":
                edges.append((c, short, math.sqrt(found[0] * found[1]), found))
    out["edges"] = [{"case": c.name, "held": f[0], "failed": f[1]} for c, _, _, f in edges]
    # predicted_max_lr against the measured edge: the bracket (held, failed) x the rate against its 95% interval
    checked = [(c, s, f) for c, s, _, f in edges if s.get("predicted_max_lr_low") and s.get("predicted_max_lr_high")]
    if checked:
        ratios = [s["predicted_max_lr"] / (math.sqrt(f[0] * f[1]) * c.learning_rate) for c, s, f in checked]
        out["predicted_max_lr_vs_edge"] = {
            "edges": len(checked),
            "bracket_overlaps_interval": sum(
                f[0] * c.learning_rate <= s["predicted_max_lr_high"]
                and f[1] * c.learning_rate >= s["predicted_max_lr_low"]
                for c, s, f in checked
            ),
            "predicted_over_edge_median": round(statistics.median(ratios), 3),
            "predicted_over_edge_range": [round(min(ratios), 3), round(max(ratios), 3)],
        }
    if len(edges) >= 3:
        table = {}
        for name in candidates(edges[0][0], edges[0][1]):
            xs = [-candidates(c, s)[name] for c, s, _, _ in edges]
            ys = [e * c.learning_rate for c, _, e, _ in edges]
            low, high = bootstrap(lambda idx, xs=xs, ys=ys: spearman([xs[i] for i in idx], [ys[i] for i in idx]),
                                  len(xs))  # fmt: skip
            table[name] = {"spearman": spearman(xs, ys), "low": low, "high": high}
        out["spearman_with_edge_lr"] = table
        out.update(edge_multiples(edges))
    return out


def edge_multiples(edges: list[tuple[BlockCase, dict[str, Any], float, tuple[float, float]]]) -> dict[str, Any]:
    """Each figure against the edge as a multiple of the configuration's own rate (where ``1/(learning_rate x
    lora_alpha)`` ties every configuration of the block): Spearman per run (one seed's figure against that seed's
    edge, what one trial shows a user) and per configuration (the figure's mean over its seeds against the mean log
    of its edges' geometric middles), each with a bootstrap 95% interval (over runs, over configurations); and which
    configurations' seeds disagree on the bracket. Only runs whose short trial completed count (``edges``)."""
    per_run, per_config = {}, {}
    by_case: dict[str, list[tuple[BlockCase, dict[str, Any], float]]] = {}
    brackets: dict[str, set[tuple[float, float]]] = {}
    for c, s, e, f in edges:
        by_case.setdefault(c.name, []).append((c, s, e))
        brackets.setdefault(c.name, set()).add(f)
    names = sorted(by_case)
    scored = {id(s): candidates(c, s) for c, s, _, _ in edges}  # each short trial's figures, computed once
    ys = [math.log(e) for _, _, e, _ in edges]
    cy = [statistics.fmean(math.log(e) for _, _, e in by_case[n]) for n in names]
    for name in scored[id(edges[0][1])]:
        xs = [-scored[id(s)][name] for _, s, _, _ in edges]
        cx = [statistics.fmean(-scored[id(s)][name] for _, s, _ in by_case[n]) for n in names]
        for table, a, b in ((per_run, xs, ys), (per_config, cx, cy)):
            if any(math.isnan(x) for x in a):
                continue
            low, high = bootstrap(lambda idx, a=a, b=b: spearman([a[i] for i in idx], [b[i] for i in idx]), len(a))
            table[name] = {"spearman": round(spearman(a, b), 3), "low": round(low, 3), "high": round(high, 3)}
    return {
        "spearman_with_edge_multiple_per_run": {"runs": len(edges), "by_figure": per_run},
        "spearman_with_edge_multiple_per_configuration": {"configurations": len(names), "by_figure": per_config},
        "edge_seeds_disagree": {
            "configurations": len(names),
            "disagree": sorted(n for n in names if len(brackets[n]) > 1),
        },
    }


def _outcome(run: dict[str, Any] | None) -> str:
    """``complete``, ``diverged at 52``, or ``-`` when not run."""
    if not run:
        return "-"
    return run["status"] + (f" at {run['fail_step']}" if run.get("fail_step") else "")


def markdown(runs: dict[str, dict[str, Any]], summary: dict[str, Any], long: int) -> str:
    """The tables of ``validity_block.md``."""
    lines = [
        "# The equal-step block (`benchmarks/stability/validity_block.py`)",
        "",
        f"Every configuration at learning_rate x lora_alpha = {STEP:g}; seeds {', '.join(map(str, SEEDS))}; "
        f"long runs {long} steps at a constant rate. Written by the script; rerun it to go on.",
        "",
        "| configuration | seed | short trial | margin (interval) | ramp crossing 1.2x | update/weight | "
        f"own rate, {long} steps | edge bracket |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in BLOCK:
        for s in SEEDS:
            short = runs.get(short_key(c, s))
            own = runs.get(own_key(c, s, long))
            if not short and not own:
                continue
            margin = "-"
            if short and short.get("stability_margin"):
                margin = (f"{short['stability_margin']:.1f}x ({short.get('stability_margin_low') or 0:.1f}-"
                          f"{short.get('stability_margin_high') or 0:.1f})")  # fmt: skip
            cross = ramp_crossing(short) if short else math.nan
            ratio = [u for u in ((short or {}).get("update_ratio_trace") or []) if u is not None]
            found = edge_of(runs, c, s, long)
            lines.append(
                f"| {c.name} | {s} | {short['status'] if short else '-'} | {margin} | "
                f"{'-' if math.isnan(cross) else f'{cross:.1f}x'} | {f'{ratio[-1]:.4f}' if ratio else '-'} | "
                f"{_outcome(own)} | "
                f"{f'{found[0]:.3g}x-{found[1]:.3g}x' if found else '-'} |"
            )
    lines += ["", "## Summary", "", "```json", json.dumps(summary, indent=1, default=str), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("short", "own", "edge", "all"), default="all")
    parser.add_argument("--only", help="configuration names separated by semicolons (names hold commas)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--long", type=int, default=200, help="long-run steps (default 200)")
    parser.add_argument("--resolution", type=float, default=1.5, help="edge bracket factor (default 1.5)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="seeds, comma-separated (default 0,1,2)")
    parser.add_argument("--report", action="store_true", help="rewrite the tables from the file; run nothing")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    block = Block(out, args.threads, args.long, args.resolution)
    if args.report:
        with block.lock:
            block.save()
        return 0
    wanted = [n.strip() for n in args.only.split(";")] if args.only else []
    unknown = [n for n in wanted if n not in {c.name for c in BLOCK}]
    if unknown:
        parser.error(f"--only: no configuration {unknown[0]!r}; choose among: {'; '.join(c.name for c in BLOCK)}")
    by_name = {c.name: c for c in BLOCK}
    cases = [by_name[n] for n in wanted] if wanted else list(BLOCK)  # in the order given
    seeds = [int(s) for s in args.seeds.split(",")]
    pairs = [(c, s) for s in seeds for c in cases]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if args.phase in ("short", "all"):
            list(pool.map(lambda p: block.run(short_key(*p), p[0].config(30, p[1]), stress=True), pairs))
        if args.phase in ("own", "all"):
            list(pool.map(lambda p: block.run(own_key(p[0], p[1], args.long), p[0].config(args.long, p[1]), False),
                          pairs))  # fmt: skip
        if args.phase in ("edge", "all"):
            list(pool.map(lambda p: bisect_edge(block, *p), pairs))
    with block.lock:
        block.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
