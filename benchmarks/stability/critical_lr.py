"""Issue 54: does the critical learning rate (sweeper.stability.experimental) tell a long run that fails from one that
holds better than the stability margin? The comparison is pre-registered in docs/validity.md ("The critical learning
rate against the long runs: pre-registration"), committed before any outcome below was computed.

Every stored long run of the equal-step block (``benchmarks/stability/results/validity_block.json``: 200-step
constant-rate runs of 12 configurations at 3 seeds, at their own rate and at the multiples the edge bisection tried)
gets the sweep's short trial at the same configuration, seed and rate (30 constant steps, the line searches, the stress
phase; one thread, the same trial process as ``sweep run``), and the pre-registered figures are scored against what the
long run did. Each short trial is written to ``benchmarks/stability/results/critical_lr.json`` as it ends (an atomic
rename), so a stopped run keeps what it measured and a rerun skips what is there; ``critical_lr.md`` is rewritten with
it.

    python benchmarks/stability/critical_lr.py --jobs 2 --threads 1  # every short trial (about 65 minutes on 2 cores)
    python benchmarks/stability/critical_lr.py --phase heldout --jobs 2 --threads 1   # the held-out set (hours)
    python benchmarks/stability/critical_lr.py --report                 # rewrite the tables, run nothing

``--phase heldout`` runs the held-out set (:func:`heldout_cases`: 30 configurations drawn once, pre-registered in
docs/validity.md before any of them ran): for each, a 200-step constant-rate run at its rate and the short trial
beside it; its figures are scored apart (``critical_lr_heldout.md``) by the same rules.

Run nothing else that trains while it runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common

sys.path.insert(0, str(Path(__file__).parent))

from validity import FAILED, auc, bootstrap, spearman
from validity_block import BLOCK, BlockCase, _nulls, edge_of

from sweeper.benchmarking import StressOutcome
from sweeper.model import resolve_model
from sweeper.stability import headroom_of
from sweeper.stability.experimental import critical_rate_of

RESULTS = Path(__file__).parent / "results"
SHORT_STEPS = 30
KEEP = (
    "status", "reason", "fail_step", "steps_done", "instability", "train_time_s", "probe_time_share",
    "stability_margin", "stability_margin_low", "stability_margin_high", "margin_capped", "predicted_max_lr",
    "predicted_max_lr_low", "predicted_max_lr_high", "predicted_max_lr_calibrated", "stress_time_share",
    "critical_lr_multiple", "critical_lr_multiple_low", "critical_lr_multiple_high", "critical_lr_slope_per_step",
    "critical_lr_projected_step", "critical_lr_projected_step_low", "critical_lr_projected_step_high",
    "critical_lr_readings", "line_search_time_s", "line_search_time_share", "line_search_forwards",
    "line_search_skipped", "critical_lr_step_multiple", "critical_lr_step_readings",
)  # fmt: skip


#: The held-out set (issue 54): drawn once with this seed; configurations, seeds (3-5) and data shuffles (2, 3) that
#: no earlier benchmark used, at rates log-uniform in 0.35x-2.8x the block's step (``learning_rate x lora_alpha`` =
#: 0.256), whose 200-step edge lay at 0.5x-1.41x: within 4x of the edge, where the call is hard.
HELDOUT_SEED = 54
HELDOUT_RUNS = 30
LONG_STEPS = 200


def heldout_cases() -> list[tuple[BlockCase, int, float]]:
    """The held-out set: (case, seed, multiple of the block's step) for each of :data:`HELDOUT_RUNS` runs."""
    rng = random.Random(HELDOUT_SEED)
    out = []
    for i in range(HELDOUT_RUNS):
        case = BlockCase(
            name=f"heldout {i}",
            r=rng.choice((4, 8, 16, 32)),
            lora_alpha=rng.choice((16.0, 32.0, 64.0, 128.0)),
            bnb_4bit_quant_type=rng.choice(("nf4", "fp4")),
            bnb_4bit_use_double_quant=rng.choice((True, False)),
            per_device_train_batch_size=rng.choice((1, 2)),
            max_seq_length=rng.choice((64, 128)),
            dataset_seed=rng.choice((2, 3)),
        )
        multiple = round(math.exp(rng.uniform(math.log(0.35), math.log(2.8))), 4)
        out.append((case, rng.choice((3, 4, 5)), multiple))
    return out


def long_key(case: BlockCase, seed: int, multiple: float) -> str:
    return f"{case.name} | seed {seed} | x{multiple:.4g} | {LONG_STEPS} steps"


def long_runs(
    block: dict[str, Any], cases_in: tuple[BlockCase, ...] = BLOCK
) -> list[tuple[BlockCase, int, float, dict[str, Any]]]:
    """(case, seed, multiple, long run) for every stored long run in ``block["runs"]`` of ``cases_in``."""
    cases = {c.name: c for c in cases_in}
    out = []
    for key, run in block["runs"].items():
        name, seed, rest = key.split(" | ", 2)
        if "short" in rest or name not in cases:
            continue
        multiple = float(rest.split(" |")[0][1:])
        out.append((cases[name], int(seed.split()[1]), multiple, run))
    return out


def short_key(case: BlockCase, seed: int, multiple: float) -> str:
    return f"{case.name} | seed {seed} | x{multiple:.4g} | short {SHORT_STEPS}"


class Runner:
    """The results file and the short trials (``jobs`` at a time) that fill it."""

    def __init__(self, threads: int | None):
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        self.work = Path(tempfile.mkdtemp(prefix="critical-lr-"))
        self.lock = threading.Lock()
        self.path = RESULTS / "critical_lr.json"
        self.runs: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            self.runs = json.loads(self.path.read_text()).get("runs", {})
        self._model: Path | None = None

    def _pending(self, key: str) -> bool:
        """Whether run ``key`` is still to measure (not stored, or stored as a failed run); resolves the model once."""
        with self.lock:
            done = self.runs.get(key)
            if self._model is None:
                self._model = resolve_model(BLOCK[0].config(SHORT_STEPS, 0).model)
        return done is None or done["status"] in ("crash", "timeout", "error")

    def short(self, case: BlockCase, seed: int, multiple: float) -> None:
        key = short_key(case, seed, multiple)
        if not self._pending(key):
            return
        start = time.monotonic()
        config = case.config(SHORT_STEPS, seed, multiple)
        result = _common.run_trial(config, self.work / key.replace(" ", "_").replace("/", "_").replace("|", ""),
                           model_path=str(self._model), env=self.env, experimental=("critical_lr",))  # fmt: skip
        stored = result.to_dict()
        stored.update(stored.get("experimental", {}).get("critical_lr", {}))  # outside the stable names (issue 69)
        data = {k: stored.get(k) for k in KEEP}
        data["learning_rate"] = config.learning_rate
        data["wall_s"] = round(time.monotonic() - start, 1)
        print(f"{key}: {result.status} critical={data['critical_lr_multiple']} margin={data['stability_margin']} "
              f"({data['wall_s']:.0f} s)", flush=True)  # fmt: skip
        with self.lock:
            self.runs[key] = data
            self.save()

    def long(self, case: BlockCase, seed: int, multiple: float) -> None:
        """The held-out run's 200-step constant-rate run (no stress phase, no line search), unless stored."""
        key = long_key(case, seed, multiple)
        if not self._pending(key):
            return
        start = time.monotonic()
        folder = self.work / key.replace(" ", "_").replace("|", "")
        result = _common.run_trial(case.config(LONG_STEPS, seed, multiple), folder,
                                   model_path=str(self._model), env=self.env, stress=False)  # fmt: skip
        data = {k: result.to_dict().get(k) for k in ("status", "reason", "fail_step", "steps_done", "train_time_s")}
        data["wall_s"] = round(time.monotonic() - start, 1)
        print(f"{key}: {result.status} step {result.fail_step or result.constant.steps_done} ({data['wall_s']:.0f} s)",
              flush=True)  # fmt: skip
        with self.lock:
            self.runs[key] = data
            self.save()

    def save(self) -> None:
        payload = {"version": 1, "short_steps": SHORT_STEPS, "runs": self.runs}
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        os.replace(tmp, self.path)


# --- the pre-registered figures (docs/validity.md) -------------------------------------------------------------------

HORIZON = 200


def _end_multiple(short: dict[str, Any]) -> float | None:
    readings = short.get("critical_lr_readings") or []
    if not readings:
        return None
    last = max(r[0] for r in readings)
    return statistics.median(r[2] for r in readings if r[0] == last)


def scores(case: BlockCase, multiple: float, short: dict[str, Any]) -> dict[str, float]:
    """Every pre-registered figure as a score, higher = closer to failing; a short trial that failed scores inf."""
    lr = case.learning_rate * multiple
    failed = short["status"] in FAILED
    inf = math.inf

    def inv(x: Any) -> float:
        return inf if failed else (1.0 / x if x else math.nan)

    instability = short.get("instability")
    crit = short.get("critical_lr_multiple")
    step = short.get("critical_lr_projected_step")
    return {
        "1 / stability margin": inv(short.get("stability_margin")),
        "1 / critical multiple": inv(crit),
        "1 / critical multiple at the end": inv(_end_multiple(short)),
        "1 / projected step": inf if failed else (1.0 / step if step else 0.0),
        "instability": inf if failed else (instability if instability is not None else math.nan),
        "(1 + instability) / critical multiple": inf
        if failed
        else ((1 + instability) / crit if crit and instability is not None else math.nan),
        # Registered after the block's outcome (docs/validity.md): the search read on the step's own micro-batches.
        "1 / critical multiple on the step's batch": inv(short.get("critical_lr_step_multiple")),
        "learning_rate x lora_alpha": lr * case.lora_alpha,
        "learning_rate": lr,
    }


def decision_margin(short: dict[str, Any]) -> str:
    """Today's call: ``fails`` (the trial itself failed), ``near edge`` (headroom under its safety factor), ``safe``."""
    if short["status"] in FAILED:
        return "fails"
    stress = StressOutcome(**{k: short.get(k) for k in (
        "predicted_max_lr", "predicted_max_lr_low", "predicted_max_lr_high", "margin_capped",
        "predicted_max_lr_calibrated")})  # fmt: skip
    room = headroom_of(short.get("learning_rate"), stress)
    if room is None:
        return "near edge"
    return "near edge" if room.near_edge else "safe"


def decision_critical(short: dict[str, Any]) -> str:
    """The critical rate's call (pre-registered): ``fails`` when the trial failed or the whole interval of the projected
    step lies within the long horizon; ``safe`` when the last point's low end is at least 2x the trial's rate and the
    projection's early end (if any) lies beyond the horizon; else ``near edge``."""
    if short["status"] in FAILED:
        return "fails"
    high = short.get("critical_lr_projected_step_high")
    if short.get("critical_lr_projected_step") is not None and high is not None and high <= HORIZON:
        return "fails"
    low_multiple = short.get("critical_lr_multiple_low")
    early = short.get("critical_lr_projected_step_low")
    if low_multiple is not None and low_multiple >= 2.0 and (early is None or early > HORIZON):
        return "safe"
    return "near edge"


def decision_critical_step(short: dict[str, Any]) -> str:
    """:func:`decision_critical`'s rules on the readings of the step's own micro-batches (registered after the block's
    outcome, before the held-out set ran); ``-`` where a trial has none (run before they were recorded)."""
    if short["status"] in FAILED:
        return "fails"
    readings = [tuple(r) for r in short.get("critical_lr_step_readings") or []]
    if not readings:
        return "-"
    rate = critical_rate_of(readings, SHORT_STEPS)  # type: ignore[arg-type]
    return decision_critical({
        "status": short["status"], "critical_lr_projected_step": rate.projected_step,
        "critical_lr_projected_step_high": rate.projected_step_high, "critical_lr_multiple_low": rate.multiple_low,
        "critical_lr_projected_step_low": rate.projected_step_low,
    })  # fmt: skip


def summarize(
    block: dict[str, Any], runs: dict[str, dict[str, Any]], cases_in: tuple[BlockCase, ...] = BLOCK
) -> dict[str, Any]:
    rows = []
    for case, seed, multiple, long in long_runs(block, cases_in):
        short = runs.get(short_key(case, seed, multiple))
        if short is None or short["status"] in ("crash", "timeout", "error", "oom"):
            continue
        edge = edge_of(block["runs"], case, seed, HORIZON)
        rows.append({
            "case": case.name, "seed": seed, "multiple": multiple, "failed": long["status"] in FAILED,
            "fail_step": long.get("fail_step"), "edge": math.sqrt(edge[0] * edge[1]) if edge else None,
            "scores": scores(case, multiple, short), "margin_call": decision_margin(short),
            "critical_call": decision_critical(short), "critical_step_call": decision_critical_step(short),
        })  # fmt: skip
    if not rows:
        return {"runs": 0}
    failed = [r["failed"] for r in rows]
    soon = [-(r["fail_step"] or HORIZON + 1) if r["failed"] else -(HORIZON + 1) for r in rows]
    configs = sorted({r["case"] for r in rows})
    by_config = {c: [i for i, r in enumerate(rows) if r["case"] == c] for c in configs}
    groups = [by_config[c] for c in configs]
    figures = {name: _figure([r["scores"][name] for r in rows], failed, soon, groups) for name in rows[0]["scores"]}
    calls = {}
    for rule in ("margin_call", "critical_call", "critical_step_call"):
        near2 = [r for r in rows if r["edge"] and r["edge"] / 2 <= r["multiple"] <= 2 * r["edge"] and r[rule] != "-"]
        calls[rule] = {
            "safe": sum(r[rule] == "safe" for r in rows),
            "safe_that_failed": sum(r[rule] == "safe" and r["failed"] for r in rows),
            "near edge": sum(r[rule] == "near edge" for r in rows),
            "near_edge_that_failed": sum(r[rule] == "near edge" and r["failed"] for r in rows),
            "fails": sum(r[rule] == "fails" for r in rows),
            "fails_that_held": sum(r[rule] == "fails" and not r["failed"] for r in rows),
            "within_2x_of_edge": len(near2),
            "near_edge_share_within_2x": sum(r[rule] == "near edge" for r in near2) / len(near2) if near2 else None,
        }
    return {"runs": len(rows), "failed": sum(failed), "configurations": len(configs), "figures": figures,
            "calls": calls, "rows": rows}  # fmt: skip


def _figure(xs: list[float], failed: list[bool], soon: list[int], groups: list[list[int]]) -> dict[str, Any]:
    """AUC and Spearman of one score with their bootstrap intervals (over runs; AUC also over configurations)."""
    ok = [i for i, x in enumerate(xs) if not math.isnan(x)]
    fin = [min(x, 1e12) for x in xs]
    kept = set(ok)

    def a(idx: list[int]) -> float:
        return auc([xs[i] for i in idx], [failed[i] for i in idx])

    def rho(idx: list[int]) -> float:
        return spearman([fin[i] for i in idx], [soon[i] for i in idx])

    return {
        "auc": a(ok),
        "auc_interval_runs": bootstrap(lambda idx: a([ok[i] for i in idx]), len(ok)),
        "auc_interval_configs": bootstrap(
            lambda picks: a([i for c in picks for i in groups[c] if i in kept]), len(groups)
        ),
        "spearman_time_to_failure": rho(ok),
        "spearman_interval": bootstrap(lambda idx: rho([ok[i] for i in idx]), len(ok)),
        "n": len(ok),
    }


def markdown(summary: dict[str, Any], runs: dict[str, dict[str, Any]], held: bool = False) -> str:
    if not summary.get("runs"):
        return "# The critical learning rate against the long runs\n\nNo short trial yet.\n"

    def f(x: Any, spec: str = ".3f") -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)

    out = [
        "# The critical learning rate against the long runs" + (": the held-out set" if held else ""),
        "",
        f"`python benchmarks/stability/critical_lr.py{' --phase heldout' if held else ''} --jobs 2 --threads 1`: "
        f"{summary['runs']} {'new' if held else 'stored'} 200-step runs of "
        f"{summary['configurations']} configurations ({summary['failed']} failed), each with the sweep's "
        f"{SHORT_STEPS}-step trial at its configuration, seed and rate. Bootstrap 95% intervals (2000 resamples).",
        "",
        "| figure (higher = closer to failing) | AUC, fails within 200 steps | over runs | over configurations "
        "| Spearman with how soon it failed |",
        "|---|---|---|---|---|",
    ]
    for name, fig in summary["figures"].items():
        lo, hi = fig["auc_interval_runs"]
        clo, chi = fig["auc_interval_configs"]
        slo, shi = fig["spearman_interval"]
        out.append(f"| {name} | {f(fig['auc'])} | {f(lo, '.2f')}-{f(hi, '.2f')} | {f(clo, '.2f')}-{f(chi, '.2f')} "
                   f"| {f(fig['spearman_time_to_failure'], '.2f')} ({f(slo, '.2f')} to {f(shi, '.2f')}) |")  # fmt: skip
    out += ["", "| call | safe (failed) | near edge (failed) | fails (held) | near edge among runs within 2x of "
            "their edge |", "|---|---|---|---|---|"]  # fmt: skip
    for rule, c in summary["calls"].items():
        out.append(f"| {rule.replace('_call', '')} | {c['safe']} ({c['safe_that_failed']}) | {c['near edge']} "
                   f"({c['near_edge_that_failed']}) | {c['fails']} ({c['fails_that_held']}) | "
                   f"{f(c['near_edge_share_within_2x'], '.2f')} of {c['within_2x_of_edge']} |")  # fmt: skip
    shares = [r["line_search_time_share"] for r in runs.values() if r.get("line_search_time_share") is not None]
    forwards = [r["line_search_forwards"] for r in runs.values() if r.get("line_search_forwards")]
    if shares:
        median, low, high = statistics.median(shares), min(shares), max(shares)
        out += ["", f"Line search cost: a median {median:.1%} of the constant phase ({low:.1%}-{high:.1%}), "
                f"{statistics.median(forwards):.0f} forwards a trial."]  # fmt: skip
    out += ["", "| run | long run | margin | critical multiple (low-high) | slope/step | projected step | calls "
            "(margin, critical) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in summary["rows"]:
        key = f"{r['case']} | seed {r['seed']} | x{r['multiple']:.4g} | short {SHORT_STEPS}"
        s = runs[key]
        long = f"failed at {r['fail_step']}" if r["failed"] else "held"
        proj = s.get("critical_lr_projected_step")
        proj_s = (
            "-"
            if proj is None
            else f"{proj} ({s.get('critical_lr_projected_step_low')}-"
            f"{s.get('critical_lr_projected_step_high') or 'beyond'})"
        )
        out.append(f"| {r['case']}, seed {r['seed']}, x{r['multiple']:.4g} | {long} | "
                   f"{f(s.get('stability_margin'), '.3g')} | {f(s.get('critical_lr_multiple'), '.3g')} "
                   f"({f(s.get('critical_lr_multiple_low'), '.3g')}-{f(s.get('critical_lr_multiple_high'), '.3g')}) "
                   f"| {f(s.get('critical_lr_slope_per_step'), '.3f')} | {proj_s} | {r['margin_call']}, "
                   f"{r['critical_call']} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", action="store_true", help="rewrite the tables from what is stored; run nothing")
    parser.add_argument("--limit", type=int, default=None, help="run at most this many short trials")
    parser.add_argument("--phase", choices=("block", "heldout"), default="block")
    args = parser.parse_args(argv)
    block = json.loads((RESULTS / "validity_block.json").read_text())
    runner = Runner(args.threads)
    held = heldout_cases()
    if args.phase == "heldout" and not args.report:
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda t: (runner.long(*t), runner.short(*t)), held[: args.limit]))
    heldout_summary = summarize({"runs": runner.runs}, runner.runs, tuple(c for c, _, _ in held))
    if heldout_summary.get("runs"):
        (RESULTS / "critical_lr_heldout_summary.json").write_text(json.dumps(_nulls(heldout_summary), indent=1))
        (RESULTS / "critical_lr_heldout.md").write_text(markdown(heldout_summary, runner.runs, held=True))
    if args.phase == "block" and not args.report:
        todo = [(c, s, m) for c, s, m, _ in long_runs(block)]
        todo.sort(key=lambda t: (t[0].per_device_train_batch_size * t[0].max_seq_length, t[1], t[2]))
        todo = [t for t in todo if t[0].bnb_4bit_compute_dtype == "float32"][: args.limit]
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda t: runner.short(*t), todo))
    summary = summarize(block, runner.runs)
    (RESULTS / "critical_lr_summary.json").write_text(json.dumps(_nulls(summary), indent=1, default=str))
    (RESULTS / "critical_lr.md").write_text(markdown(summary, runner.runs))
    print(markdown(summary, runner.runs).split("\n| run |")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
