"""Issue 66: the chance that a long run diverges within its horizon, from a short trial's stability margin.

Three parts, each a phase of this script (the pre-registration is docs/validity.md, "The chance of diverging within
the run: pre-registration (issue 66)", committed before any validation run below was scored):

1. ``--fit``: the model, fitted once on the stored 200-step runs whose short trial completed ("survivors": the
   equal-step block, ``validity_block.json`` with ``critical_lr.json``'s short trials, and the held-out set,
   ``critical_lr.json``). A log-logistic accelerated-failure-time model of the step ``T`` a constant-rate run first
   fails at, right-censored at the run's horizon: ``ln T = mu + gamma ln(margin) + sigma e``, ``e`` standard logistic
   (Kalbfleisch & Prentice 2002, "The Statistical Analysis of Failure Time Data", sec. 2.2.6), so that
   ``P(T <= H) = logistic((ln H - mu - gamma ln margin) / sigma)``. Its covariance is the configurations' cluster
   bootstrap (a configuration's seeds and rates resampled together). Also the within-configuration slope: how far
   ``ln margin`` falls per ``ln`` of the rate, least squares per block configuration over its short trials at 0.35x-2x
   its rate. Written to ``results/divergence_chance_fit.json``; ``sweeper/stability/_chance.py`` holds the same
   numbers (``tests/stability/test_chance.py`` checks they agree).
2. ``--run``: the validation, on configurations no earlier benchmark used (:func:`validation_cases`): per
   configuration and seed, the sweep's short trial (30 constant steps, the stress phase) and a ``--long`` step (400)
   constant-rate run at the configuration's rate; then, for the first :data:`EDGE_CASES` configurations at their
   first seed, the long-run edge bisected to a factor of 1.5. Each run is written to
   ``results/divergence_chance.json`` as it ends (an atomic rename): a stopped run keeps what it measured, a rerun
   skips what is stored.
3. ``--report``: the registered scores (``results/divergence_chance.md``).

    python benchmarks/stability/divergence_chance.py --fit
    setsid nice -n 19 python benchmarks/stability/divergence_chance.py --run --jobs 2 --threads 1  # hours, resumable
    python benchmarks/stability/divergence_chance.py --report

Run nothing else that trains at full priority while it runs (see ``validity.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
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

from critical_lr import heldout_cases, long_key, long_runs, short_key
from validity import FAILED
from validity_block import STEP, BlockCase, edge_of

from sweeper.model import resolve_model

RESULTS = Path(__file__).parent / "results"
FIT = RESULTS / "divergence_chance_fit.json"
OUT = RESULTS / "divergence_chance.json"
STORED_HORIZON = 200
SHORT_STEPS = 30
BOOTSTRAP_DRAWS = 400

# --- 1. the fit on the stored runs -----------------------------------------------------------------------------------


def stored_survivors() -> list[dict[str, Any]]:
    """Every stored 200-step run whose short trial (same configuration, seed and rate) completed with a margin:
    ``{"set", "case", "seed", "multiple", "margin", "capped", "failed", "fail_step"}``."""
    block = json.loads((RESULTS / "validity_block.json").read_text())
    crit = json.loads((RESULTS / "critical_lr.json").read_text())["runs"]
    pairs = [("block", c, s, m, long, crit.get(short_key(c, s, m))) for c, s, m, long in long_runs(block)]
    pairs += [("heldout", c, s, m, crit.get(long_key(c, s, m)), crit.get(short_key(c, s, m)))
              for c, s, m in heldout_cases()]  # fmt: skip
    rows = []
    for name, case, seed, multiple, long, short in pairs:
        if long is None or short is None or short["status"] != "complete" or not short.get("stability_margin"):
            continue
        rows.append({"set": name, "case": case.name, "seed": seed, "multiple": multiple,
                     "margin": short["stability_margin"], "capped": bool(short.get("margin_capped")),
                     "failed": long["status"] in FAILED, "fail_step": long.get("fail_step"),
                     "learning_rate": case.learning_rate * multiple, "lora_alpha": case.lora_alpha})  # fmt: skip
    return rows


def _neg_log_likelihood(theta: Any, ln_m: Any, ln_t: Any, failed: Any) -> float:
    """The log-logistic AFT model's negative log-likelihood: a failure at ``t`` contributes the density of ``ln t``,
    a run that held to its horizon the survival beyond it."""
    import numpy as np

    mu, gamma, log_sigma = theta
    sigma = math.exp(log_sigma)
    z = (ln_t - mu - gamma * ln_m) / sigma
    log_density = -z - log_sigma - 2 * np.logaddexp(0.0, -z)
    log_survival = -np.logaddexp(0.0, z)
    return float(-np.sum(np.where(failed, log_density, log_survival)))


def fit_aft(rows: list[dict[str, Any]], covariate: str = "margin") -> tuple[float, float, float]:
    """(mu, gamma, ln sigma) of the log-logistic AFT model by maximum likelihood (scipy's Nelder-Mead), in the ln of
    each row's ``covariate`` (the margin; a baseline's safety score)."""
    import numpy as np
    from scipy.optimize import minimize

    ln_m = np.log([r[covariate] for r in rows])
    failed = np.array([r["failed"] for r in rows])
    ln_t = np.log([r["fail_step"] if r["failed"] else r.get("horizon", STORED_HORIZON) for r in rows])
    res = minimize(_neg_log_likelihood, [4.0, 1.2, math.log(0.3)], args=(ln_m, ln_t, failed), method="Nelder-Mead",
                   options={"xatol": 1e-7, "fatol": 1e-9, "maxiter": 10000})  # fmt: skip
    return tuple(float(x) for x in res.x)  # type: ignore[return-value]


def within_configuration_slopes() -> dict[str, float]:
    """Per block configuration, the least-squares slope of ``-ln margin`` over ``ln`` of the rate multiple, over its
    complete short trials (``critical_lr.json``) at two or more multiples."""
    import numpy as np

    crit = json.loads((RESULTS / "critical_lr.json").read_text())["runs"]
    points: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for key, run in crit.items():
        name, _seed, multiple, phase = key.split(" | ")
        usable = run["status"] == "complete" and run.get("stability_margin") and not run.get("margin_capped")
        if "short" in phase and not name.startswith("heldout") and usable:
            points[name].append((math.log(float(multiple[1:])), math.log(run["stability_margin"])))
    out = {}
    for name, pts in sorted(points.items()):
        if len({x for x, _ in pts}) > 1:
            out[name] = float(-np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)[0])
    return out


def margin_seed_sd() -> tuple[float, int]:
    """The seed noise of one short trial's margin, in ladder steps (factors of 1.8): the pooled standard deviation of
    ``log_1.8(margin)`` over seeds of the same configuration at the same rate (the block's complete, uncapped short
    trials in ``critical_lr.json``), with the number of such groups."""
    crit = json.loads((RESULTS / "critical_lr.json").read_text())["runs"]
    groups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for key, run in crit.items():
        name, _seed, multiple, phase = key.split(" | ")
        usable = run["status"] == "complete" and run.get("stability_margin") and not run.get("margin_capped")
        if "short" in phase and usable:
            groups[(name, multiple)].append(math.log(run["stability_margin"], 1.8))
    sums = [(sum((x - sum(v) / len(v)) ** 2 for x in v), len(v) - 1) for v in groups.values() if len(v) > 1]
    return math.sqrt(sum(a for a, _ in sums) / sum(b for _, b in sums)), len(sums)


def fit() -> dict[str, Any]:
    """The frozen model: the AFT fit, its cluster-bootstrap covariance, and the within-configuration slopes."""
    import numpy as np

    rows = stored_survivors()
    theta = fit_aft(rows)
    clusters: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for r in rows:
        clusters[(r["set"], r["case"])].append(r)
    keys = sorted(clusters)
    rng = random.Random(66)
    draws = [fit_aft([x for k in (rng.choice(keys) for _ in keys) for x in clusters[k]])
             for _ in range(BOOTSTRAP_DRAWS)]  # fmt: skip
    cov = np.cov(np.array(draws).T)
    slopes = within_configuration_slopes()
    values = sorted(slopes.values())
    noise, groups = margin_seed_sd()
    return {
        "model": "ln T = mu + gamma ln(margin) + sigma e, e standard logistic; T right-censored at 200 steps",
        "survivors": len(rows), "failed": sum(r["failed"] for r in rows), "configurations": len(keys),
        "mu": theta[0], "gamma": theta[1], "log_sigma": theta[2], "sigma": math.exp(theta[2]),
        "covariance_mu_gamma_log_sigma": cov.tolist(), "bootstrap_draws": BOOTSTRAP_DRAWS,
        "slopes": slopes, "slope_median": float(np.median(values)), "slope_low": values[0], "slope_high": values[-1],
        "margin_seed_sd_steps": noise, "margin_seed_groups": groups,
    }  # fmt: skip


# --- 2. the validation runs ------------------------------------------------------------------------------------------

#: The validation set (issue 66): drawn once with this seed, pre-registered in docs/validity.md before any run; seeds
#: (6, 7) and data shuffles (4, 5) that no earlier benchmark used.
VALIDATION_SEED = 66
VALIDATION_CASES = 48
SEEDS = (6, 7)
LONG_STEPS = 400
EDGE_CASES = 16
EDGE_RESOLUTION = 1.5


def validation_cases() -> list[tuple[BlockCase, float]]:
    """(case, multiple of the block's step) for each of :data:`VALIDATION_CASES` configurations: r and
    ``lora_alpha/r`` over the product's range, float32 and bfloat16 compute alternating, both quant types and double
    quant, batch 1-2 and 64-128 tokens (the costly batch 2 x 128 left out), at ``multiple`` x :data:`STEP` /
    ``lora_alpha``, log-uniform in 1/8-2 (the block's 200-step edges lay at 0.5-1.41)."""
    rng = random.Random(VALIDATION_SEED)
    out = []
    for i in range(VALIDATION_CASES):
        r = rng.choice((4, 8, 16, 32, 64))
        ratio = rng.choice((0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0))
        batch = rng.choice((1, 1, 2))
        case = BlockCase(
            name=f"validation {i}",
            r=r,
            lora_alpha=r * ratio,
            bnb_4bit_compute_dtype=("float32", "bfloat16")[i % 2],
            bnb_4bit_quant_type=rng.choice(("nf4", "fp4")),
            bnb_4bit_use_double_quant=rng.choice((True, False)),
            per_device_train_batch_size=batch,
            max_seq_length=64 if batch == 2 else rng.choice((64, 64, 128)),
            dataset_seed=rng.choice((4, 5)),
        )
        out.append((case, round(math.exp(rng.uniform(math.log(1 / 8), math.log(2.0))), 4)))
    return out


SHORT_KEEP = (
    "status", "reason", "fail_step", "steps_done", "instability", "train_time_s", "probe_time_share",
    "stability_margin", "stability_margin_low", "stability_margin_high", "margin_capped", "lr_ceiling",
    "predicted_max_lr", "stress_stop", "stress_steps", "stress_lr_trace", "stress_probe_loss_trace", "stress_time_s",
    "stress_time_share", "learning_progress",
)  # fmt: skip
LONG_KEEP = ("status", "reason", "fail_step", "steps_done", "train_time_s", "instability")


def run_key(case: BlockCase, seed: int, multiple: float, phase: str) -> str:
    return f"{case.name} | seed {seed} | x{multiple:.4g} | {phase}"


class Validation:
    """The results file and the runs (``jobs`` at a time) that fill it."""

    def __init__(self, threads: int | None):
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        self.work = Path(tempfile.mkdtemp(prefix="divergence-chance-"))
        self.lock = threading.Lock()
        self.runs: dict[str, dict[str, Any]] = json.loads(OUT.read_text())["runs"] if OUT.is_file() else {}
        self._model: str | None = None

    def run(self, case: BlockCase, seed: int, multiple: float, phase: str) -> dict[str, Any]:
        """The run (``short`` or ``400 steps``) unless stored (a run that failed as a run is measured again)."""
        key = run_key(case, seed, multiple, phase)
        with self.lock:
            done = self.runs.get(key)
            if self._model is None:
                self._model = str(resolve_model(case.config(1, seed).model))
        if done is not None and done["status"] not in ("crash", "timeout", "error"):
            return done
        short = phase == "short"
        start = time.monotonic()
        config = case.config(SHORT_STEPS if short else LONG_STEPS, seed, multiple)
        result = _common.run_trial(config, self.work / key.replace(" ", "_").replace("|", ""), model_path=self._model,
                           env=self.env, stress=short)  # fmt: skip
        data = {k: result.to_dict().get(k) for k in (SHORT_KEEP if short else LONG_KEEP)}
        data["learning_rate"] = config.learning_rate
        data["wall_s"] = round(time.monotonic() - start, 1)
        print(f"{key}: {result.status} step {result.fail_step or result.constant.steps_done} "
              f"margin={data.get('stability_margin')} ({data['wall_s']:.0f} s)", flush=True)  # fmt: skip
        with self.lock:
            self.runs[key] = data
            payload = {"version": 1, "short_steps": SHORT_STEPS, "long_steps": LONG_STEPS, "runs": self.runs}
            tmp = OUT.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(payload, indent=1, default=str))
            os.replace(tmp, OUT)
        return data

    def pair(self, case: BlockCase, seed: int, multiple: float) -> None:
        self.run(case, seed, multiple, "short")
        self.run(case, seed, multiple, f"{LONG_STEPS} steps")

    def edge(self, case: BlockCase, multiple: float) -> None:
        """The long-run edge of ``case`` at its first seed, as a multiple of its validation rate: from the own-rate
        run, a factor of 2 up (or down) until the outcome flips, then bisection in log space to
        :data:`EDGE_RESOLUTION`."""
        seed, phase = SEEDS[0], f"{LONG_STEPS} steps"
        own = self.run(case, seed, multiple, phase)
        held, failed = (multiple, None) if own["status"] not in FAILED else (None, multiple)
        while held is None or failed is None:
            nxt = failed / 2 if held is None else held * 2  # type: ignore[operator]
            if not multiple / 64 <= nxt <= multiple * 64:
                return
            if self.run(case, seed, round(nxt, 4), phase)["status"] in FAILED:
                failed = round(nxt, 4)
            else:
                held = round(nxt, 4)
        while failed / held > EDGE_RESOLUTION:
            nxt = round(math.sqrt(held * failed), 4)
            if self.run(case, seed, nxt, phase)["status"] in FAILED:
                failed = nxt
            else:
                held = nxt


# --- 3. the registered scores ----------------------------------------------------------------------------------------

#: The baselines (docs/validity.md): the same AFT form with ``ln margin`` replaced by ``-ln(learning_rate x
#: lora_alpha)`` or ``-ln(learning_rate)``, fitted on the same stored survivors.
BASELINES = {
    "learning_rate x lora_alpha": lambda lr, alpha: 1.0 / (lr * alpha),
    "learning_rate": lambda lr, alpha: 1.0 / lr,
}


def _chance(theta: tuple[float, float, float], x: float, horizon: int) -> float:
    mu, gamma, log_sigma = theta
    z = (math.log(horizon) - mu - gamma * math.log(x)) / math.exp(log_sigma)
    return 1.0 / (1.0 + math.exp(-max(min(z, 700.0), -700.0)))


def validation_rows(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration and seed with both runs stored: the short trial's outcome and margin, the long run's."""
    rows = []
    for case, multiple in validation_cases():
        for seed in SEEDS:
            short = runs.get(run_key(case, seed, multiple, "short"))
            long = runs.get(run_key(case, seed, multiple, f"{LONG_STEPS} steps"))
            if short is None or long is None or long["status"] not in (*FAILED, "complete"):
                continue
            rows.append({"case": case.name, "seed": seed, "dtype": case.bnb_4bit_compute_dtype,
                         "short": short["status"], "margin": short.get("stability_margin"),
                         "capped": bool(short.get("margin_capped")), "learning_rate": short["learning_rate"],
                         "lora_alpha": case.lora_alpha, "failed": long["status"] in FAILED,
                         "fail_step": long.get("fail_step")})  # fmt: skip
    return rows


def _brier(ps: list[float], ys: list[bool]) -> float:
    return sum((p - y) ** 2 for p, y in zip(ps, ys)) / len(ps) if ps else math.nan


def _calibration_slope(ps: list[float], ys: list[bool]) -> float:
    """The slope of a logistic regression of the outcome on logit P (1: calibrated spread)."""
    import numpy as np
    from scipy.optimize import minimize

    logits = np.log(np.clip(ps, 1e-6, 1 - 1e-6) / (1 - np.clip(ps, 1e-6, 1 - 1e-6)))
    y = np.array(ys, dtype=float)
    if y.min() == y.max():
        return math.nan

    def nll(beta: Any) -> float:
        z = beta[0] + beta[1] * logits
        return float(np.sum(np.logaddexp(0.0, z) - y * z))

    return float(minimize(nll, [0.0, 1.0], method="Nelder-Mead").x[1])


def score(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The registered figures (docs/validity.md) on the validation runs stored so far."""
    from validity import auc, bootstrap

    from sweeper.benchmarking import divergence_chance

    stored = stored_survivors()
    baselines = {}
    for name, f in BASELINES.items():
        for r in stored:
            r[name] = f(r["learning_rate"], r["lora_alpha"])
        baselines[name] = fit_aft(stored, name)
    rows = validation_rows(runs)
    survivors = [r for r in rows if r["short"] == "complete" and r["margin"]]
    out: dict[str, Any] = {"runs": len(rows), "trial_failed": len(rows) - len(survivors),
                           "trial_failed_long_failed": sum(r["failed"] for r in rows if r not in survivors),
                           "survivors": len(survivors), "horizons": {}}  # fmt: skip
    configs = sorted({r["case"] for r in survivors})
    groups = [[i for i, r in enumerate(survivors) if r["case"] == c] for c in configs]
    for horizon in (200, LONG_STEPS):
        ys = [r["failed"] and (r["fail_step"] or 0) <= horizon for r in survivors]
        found = [divergence_chance(r["learning_rate"], r["margin"], r["capped"], horizon) for r in survivors]
        ps = [c.p_diverge for c in found]  # type: ignore[union-attr]

        def by_config(stat: Any, xs: list[float], ys: list[bool] = ys) -> tuple[float, float]:
            def resampled(picks: list[int]) -> float:
                idx = [i for g in picks for i in groups[g]]
                return stat([xs[i] for i in idx], [ys[i] for i in idx])

            return bootstrap(resampled, len(groups))

        figure: dict[str, Any] = {
            "failed": sum(ys), "auc": auc(ps, ys), "auc_95": by_config(auc, ps), "brier": _brier(ps, ys),
            "brier_base_rate": _brier([sum(ys) / len(ys)] * len(ys), ys) if ys else math.nan,
            "calibration_slope": _calibration_slope(ps, ys),
        }  # fmt: skip
        for name, theta in baselines.items():
            xs = [_chance(theta, BASELINES[name](r["learning_rate"], r["lora_alpha"]), horizon) for r in survivors]
            figure[f"auc {name}"], figure[f"brier {name}"] = auc(xs, ys), _brier(xs, ys)
        calls = [c.call for c in found]  # type: ignore[union-attr]
        figure["calls"] = {call: calls.count(call) for call in ("safe", "undecided", "likely fails")}
        figure["safe_that_failed"] = sum(c == "safe" and y for c, y in zip(calls, ys))
        figure["likely_fails_that_held"] = sum(c == "likely fails" and not y for c, y in zip(calls, ys))
        figure["undecided_share"] = calls.count("undecided") / len(calls) if calls else math.nan
        figure["by_dtype"] = {
            dtype: {"survivors": len(idx), "failed": sum(ys[i] for i in idx), "auc": auc([ps[i] for i in idx],
                    [ys[i] for i in idx]), "brier": _brier([ps[i] for i in idx], [ys[i] for i in idx])}
            for dtype in ("float32", "bfloat16") if (idx := [i for i, r in enumerate(survivors) if r["dtype"] == dtype])
        }  # fmt: skip
        out["horizons"][str(horizon)] = figure
    out["late_failures"] = [
        {"case": r["case"], "seed": r["seed"], "fail_step": r["fail_step"], "margin": r["margin"],
         "p_200": divergence_chance(r["learning_rate"], r["margin"], r["capped"], 200).p_diverge,  # type: ignore[union-attr]
         "p_400": divergence_chance(r["learning_rate"], r["margin"], r["capped"], 400).p_diverge}  # type: ignore[union-attr]
        for r in survivors if r["failed"] and (r["fail_step"] or 0) > 200
    ]  # fmt: skip
    out["edges"] = _edges(runs)
    return out


def _edges(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The bisected 400-step edges stored so far, each against the seed's short trial: the edge as a rate (the
    geometric mean of the largest multiple that held and the smallest that failed), ``safe_learning_rate`` and
    ``predicted_max_lr``'s interval at 400 steps."""
    from sweeper.benchmarking import divergence_chance

    out = []
    for case, multiple in validation_cases()[:EDGE_CASES]:
        seed = SEEDS[0]
        bracket = edge_of(runs, case, seed, LONG_STEPS)  # the block's reading of the same keys
        short = runs.get(run_key(case, seed, multiple, "short"))
        if bracket is None or short is None or short["status"] != "complete":
            continue
        below, failed = bracket
        rate = case.learning_rate * math.sqrt(below * failed)
        found = divergence_chance(short["learning_rate"], short["stability_margin"], short["margin_capped"], LONG_STEPS)
        assert found is not None
        high = found.predicted_max_lr_high if found.predicted_max_lr_high is not None else math.inf
        out.append({"case": case.name, "edge_rate": rate, "bracket": [below, failed],
                    "safe_learning_rate": found.safe_learning_rate, "predicted_max_lr": found.predicted_max_lr,
                    "predicted_max_lr_low": found.predicted_max_lr_low,
                    "predicted_max_lr_high": found.predicted_max_lr_high,
                    "at_or_above_safe": rate >= found.safe_learning_rate,
                    "covered": found.predicted_max_lr_low <= rate <= high})  # fmt: skip
    return out


def markdown(result: dict[str, Any]) -> str:
    """The scores as tables, against the registered bars."""

    def f(x: Any, spec: str = ".3f") -> str:
        return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)

    lines = ["# The chance of diverging within the run: the validation (issue 66)", "",
             "Registered in docs/validity.md before any of these runs; "
             "`python benchmarks/stability/divergence_chance.py --report` rewrites this file from "
             "`divergence_chance.json`.", "",
             f"Pairs stored: {result['runs']} (of {VALIDATION_CASES * len(SEEDS)}); the short trial failed by itself "
             f"in {result['trial_failed']} (their long run failed in {result['trial_failed_long_failed']}); "
             f"survivors {result['survivors']}.", "",
             "| horizon | failed | AUC (95% over configurations) | Brier | base rate's | lr x alpha's (AUC, Brier) | "
             "lr's (AUC, Brier) | calibration slope | safe / undecided / likely fails | safe that failed | "
             "undecided share |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for horizon, g in result["horizons"].items():
        lo, hi = g["auc_95"]
        c = g["calls"]
        lines.append(
            f"| {horizon} | {g['failed']} | {f(g['auc'])} ({f(lo, '.2f')}-{f(hi, '.2f')}) | {f(g['brier'])} | "
            f"{f(g['brier_base_rate'])} | {f(g['auc learning_rate x lora_alpha'])}, "
            f"{f(g['brier learning_rate x lora_alpha'])} | {f(g['auc learning_rate'])}, {f(g['brier learning_rate'])} "
            f"| {f(g['calibration_slope'], '.2f')} | {c['safe']} / {c['undecided']} / {c['likely fails']} | "
            f"{g['safe_that_failed']} | {f(g['undecided_share'], '.2f')} |"
        )
    lines += ["", "By compute dtype (not scored): " + "; ".join(
        f"H={h} {d}: {v['survivors']} survivors, {v['failed']} failed, AUC {f(v['auc'])}, Brier {f(v['brier'])}"
        for h, g in result["horizons"].items() for d, v in g["by_dtype"].items())]  # fmt: skip
    lines += ["", "Failures after step 200: " + ("; ".join(
        f"{r['case']} seed {r['seed']} at {r['fail_step']} (margin {r['margin']:.3g}: P200 {r['p_200']:.3f}, "
        f"P400 {r['p_400']:.3f})" for r in result["late_failures"]) or "none yet")]  # fmt: skip
    edges = result["edges"]
    lines += ["", f"Bisected edges: {len(edges)} of {EDGE_CASES}; at or above safe_learning_rate in "
              f"{sum(e['at_or_above_safe'] for e in edges)}, inside predicted_max_lr's interval in "
              f"{sum(e['covered'] for e in edges)}."]  # fmt: skip
    return "\n".join(lines) + "\n"


def run_validation(jobs: int, threads: int | None) -> None:
    """Every pair (short trial, long run) of every configuration and seed, then the registered edges."""
    runner = Validation(threads)
    cases = validation_cases()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda t: runner.pair(*t), [(c, s, m) for c, m in cases for s in SEEDS]))
        list(pool.map(lambda t: runner.edge(*t), cases[:EDGE_CASES]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the model on the stored runs")
    parser.add_argument("--run", action="store_true", help="run the validation (resumable)")
    parser.add_argument("--cases", action="store_true", help="print the validation set")
    parser.add_argument("--report", action="store_true", help="score the stored validation runs; run nothing")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.fit:
        result = fit()
        FIT.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "slopes"}, indent=1))
    if args.cases:
        for case, multiple in validation_cases():
            print(f"{case.name}: r {case.r} lora_alpha {case.lora_alpha:g} {case.bnb_4bit_compute_dtype} "
                  f"{case.bnb_4bit_quant_type} dq={case.bnb_4bit_use_double_quant} batch "
                  f"{case.per_device_train_batch_size} x {case.max_seq_length} shuffle {case.dataset_seed} "
                  f"rate {multiple:g} x {STEP:g}/lora_alpha = {multiple * case.learning_rate:.3g}")  # fmt: skip
    if args.run:
        run_validation(args.jobs, args.threads)
    if args.report:
        runs = json.loads(OUT.read_text())["runs"] if OUT.is_file() else {}
        result = score(runs)
        (RESULTS / "divergence_chance_summary.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
        text = markdown(result)
        (RESULTS / "divergence_chance.md").write_text(text)
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
