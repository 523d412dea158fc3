"""Does a short trial's stability margin say how far a configuration is from its long-run divergence edge?

Each configuration of the built-in model runs a short trial (30 constant steps, then the stress phase: the sweep's
trial, through the same trial process as ``sweep run``), and then, for the configurations chosen below, the long-run
edge: the smallest constant multiple of its learning rate at which a 300-step run fails (NaN or diverged), bisected to
a factor of 2 (one multiple that holds 300 steps, twice it fails). The script prints and writes:

- per configuration, the short trial's ``stability_margin``, ``lr_ceiling``, instability and learning progress;
- the Spearman rank correlation of the margin with the measured edge multiple, beside the naive predictors (the
  learning rate, learning_rate x lora_alpha/r, learning_rate x lora_alpha, the short run's training-loss trend, LLM
  Foundry's loss-spike rule and OLMo 2's spike score, each on the same short trace), with bootstrap 95% intervals;
- the calibration factor (edge learning rate over ``lr_ceiling``) on the calibration configurations, its spread, and
  the held-out check: configurations not used for the factor, run at half and at twice their ``predicted_max_lr``;
- on the first 15 configurations (learning rates up to 500x the recipe's), whether the short trial ranks the 1x long
  run's outcome (rows reused from the committed 1x long runs when the short trial's loss trace is the same bit for
  bit, which says the constant phase is the same run), and the rank agreement of the outcome at 30, 100 and 300 steps.

    python benchmarks/stability/validity.py --jobs 2 --threads 1          # everything: ~1.5 h on 2 cores
    python benchmarks/stability/validity.py --phase short --only 15,16    # some short trials only

Results go to ``benchmarks/stability/results/validity.json`` and ``validity.md`` (``--out`` to change), rewritten after
every run, so an interrupted run keeps what it measured and a rerun skips what is there. fp16 compute is left out: on
this CPU an fp16 step is about 8x slower than bf16 (no fp16 GEMM), and a 300-step fp16 run would take most of an hour.

Run nothing else that trains while it runs: torch processes on 2 cores, each with a thread per core, slow each other
down 10-40x (OpenMP threads spin while they wait). ``--jobs 2 --threads 1`` runs two trials at a time, one thread each.
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
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common

from sweeper.benchmarking import LONG_RUN_FACTOR, STRESS_CAP
from sweeper.model import resolve_model
from sweeper.space import DatasetSpec, ModelSpec, TrialConfig


@dataclass(frozen=True)
class Case:
    """One configuration: the settings that differ from :data:`BASE`, and its role."""

    learning_rate: float
    lora_alpha_ratio: float
    bnb_4bit_compute_dtype: str = "bfloat16"
    per_device_train_batch_size: int = 1
    r: int = 8
    bnb_4bit_quant_type: str = "nf4"
    bnb_4bit_use_double_quant: bool = True
    max_seq_length: int = 64
    dataset_seed: int = 0
    #: ``edge``: its long-run edge is bisected and it calibrates the factor; ``heldout``: run at half and twice its
    #: ``predicted_max_lr`` and never used for the factor; ``""``: short trial only (and the reused 1x long run).
    role: str = ""


#: 0-14: the first benchmark's configurations (learning_rate x lora_alpha/r from 2e-4 to 0.1, their 1x 300-step long
#: runs committed); 15-: at the rates people use (1e-4 to 5e-4), lora_alpha/r 0.25 to 32, quant type, double quant,
#: r, batch and max_seq_length varied.
CASES = [
    Case(1e-4, 2.0),
    Case(3e-4, 2.0, "float32"),
    Case(1e-3, 8.0),
    Case(3e-3, 1.0),
    Case(3e-3, 8.0, "float32"),
    Case(2e-3, 16.0),
    Case(4e-3, 8.0, per_device_train_batch_size=4),
    Case(5e-3, 8.0),
    Case(8e-3, 8.0),
    Case(1e-2, 8.0, "float32"),
    Case(2e-2, 8.0),
    Case(5e-2, 2.0, per_device_train_batch_size=2),
    Case(4e-3, 8.0),
    Case(3e-3, 16.0),
    Case(6e-3, 4.0, "float32"),
    # At the rates people use. The edge set spans lora_alpha/r 0.25-32 and the card's other settings.
    Case(2e-4, 0.5, role="edge"),
    Case(2e-4, 2.0, role="edge"),
    Case(2e-4, 8.0, role="edge"),
    Case(2e-4, 32.0, role="edge"),
    Case(1e-4, 0.25, r=16, bnb_4bit_quant_type="fp4", role="edge"),
    Case(3e-4, 4.0, r=4, bnb_4bit_use_double_quant=False, role="edge"),
    Case(5e-4, 16.0, "float32", r=16, per_device_train_batch_size=2, role="edge"),
    Case(1e-4, 16.0, r=32, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=False, role="edge"),
    # Held out of the factor, on other data (another shuffle: other probe rows, other batches).
    Case(3e-4, 8.0, r=16, bnb_4bit_quant_type="fp4", dataset_seed=1, role="heldout"),
    Case(2e-4, 1.0, per_device_train_batch_size=2, max_seq_length=128, dataset_seed=1, role="heldout"),
    # Short trials only: the margin's spread over the rest of the card.
    Case(2e-4, 2.0, per_device_train_batch_size=4),
    Case(2e-4, 2.0, max_seq_length=128),
    Case(2e-4, 2.0, bnb_4bit_quant_type="fp4"),
    Case(2e-4, 2.0, bnb_4bit_use_double_quant=False),
    Case(2e-4, 2.0, r=32),
    Case(2e-4, 2.0, "float32"),
    Case(5e-4, 0.5, r=16),
    Case(1e-4, 32.0, per_device_train_batch_size=2),
    Case(3e-4, 16.0, bnb_4bit_quant_type="fp4", max_seq_length=128),
    Case(5e-4, 1.0, "float32", bnb_4bit_use_double_quant=False),
]

#: Everything else: built-in data, 4 attention projections, the QLoRA recipe's optimizer and clipping.
BASE = TrialConfig(
    r=8,
    bnb_4bit_compute_dtype="bfloat16",
    bnb_4bit_use_double_quant=True,
    bnb_4bit_quant_type="nf4",
    max_seq_length=64,
    optim="paged_adamw_8bit",
    gradient_checkpointing=True,
    max_grad_norm=1.0,
    lora_dropout=0.05,
    memory_limit_gib=4.0,
    trial_timeout_s=3 * 3600.0,
    model=ModelSpec(name_or_path="builtin:smollm2-135m-instruct", attn_implementation="sdpa"),
    dataset=DatasetSpec(path="builtin:pydoc-topics", max_samples=256),
)

FAILED = ("nan", "diverged")
HORIZONS = (30, 100, 300)


def config_of(case: Case, steps: int, multiple: float = 1.0) -> TrialConfig:
    """The case's trial config at ``steps`` steps and ``multiple`` times its learning rate."""
    return replace(
        BASE,
        learning_rate=case.learning_rate * multiple,
        lora_alpha_ratio=case.lora_alpha_ratio,
        bnb_4bit_compute_dtype=case.bnb_4bit_compute_dtype,
        per_device_train_batch_size=case.per_device_train_batch_size,
        r=case.r,
        bnb_4bit_quant_type=case.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=case.bnb_4bit_use_double_quant,
        max_seq_length=case.max_seq_length,
        max_steps=steps,
        dataset=replace(BASE.dataset, seed=case.dataset_seed),
    )


# --- statistics ------------------------------------------------------------------------------------------------------


def _ranks(v: Sequence[float]) -> list[float]:
    order = sorted(range(len(v)), key=lambda i: v[i])
    out = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan with fewer than 3 pairs or a constant side."""
    if len(xs) < 3:
        return math.nan
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def auc(scores: Sequence[float], positives: Sequence[bool]) -> float:
    """Area under the ROC curve of ``scores`` for ``positives`` (Mann-Whitney, ties count half); nan without both."""
    pos = [s for s, p in zip(scores, positives) if p]
    neg = [s for s, p in zip(scores, positives) if not p]
    if not pos or not neg:
        return math.nan
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def bootstrap(stat: Callable[[list[int]], float], n: int, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of ``stat`` over ``draws`` resamples (with replacement) of the indices ``0..n-1``
    (Efron & Tibshirani 1993, ch. 13); resamples where ``stat`` is nan are dropped."""
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        value = stat([rng.randrange(n) for _ in range(n)])
        if not math.isnan(value):
            values.append(value)
    if not values:
        return math.nan, math.nan
    values.sort()
    return values[int(0.025 * len(values))], values[min(len(values) - 1, int(0.975 * len(values)))]


# --- the naive predictors and the published detectors, on the short run's training loss ---------------------------


def loss_trend(loss: Sequence[float | None]) -> float:
    """The mean of the last 5 training losses over the mean of the first 5 (higher: worse)."""
    xs = [x for x in loss if x is not None]
    if len(xs) < 10:
        return math.nan
    return statistics.fmean(xs[-5:]) / statistics.fmean(xs[:5])


def foundry_spike(loss: Sequence[float | None], patience: int = 4, multiplier: float = 2.0) -> float:
    """LLM Foundry's ``KillLossSpike`` rule (llmfoundry/callbacks/kill_loss_spike_callback.py: a loss above
    ``outlier_multiplier`` (2) times the rolling mean of the window, ``patience + 1`` (5) times in a row), as a
    score: the largest ratio of loss to the mean of the losses before it that held ``patience + 1`` steps in a row
    (>= 2 is the rule firing). Its window (at least 100 steps) is longer than a short trial, so the mean runs over
    every step before."""
    xs = [x for x in loss if x is not None]
    ratios = [xs[t] / statistics.fmean(xs[:t]) for t in range(5, len(xs))]
    run = patience + 1
    if len(ratios) < run:
        return math.nan
    return max(min(ratios[i : i + run]) for i in range(len(ratios) - run + 1))


def olmo_spike_score(loss: Sequence[float | None], sigmas: float = 7.0) -> float:
    """OLMo 2's spike score (OLMo et al. 2024, "2 OLMo 2 Furious", sec. 3.1): the share of steps whose loss is at least
    7 standard deviations from the rolling mean of the steps before it (their window is 1000 steps; here every step
    before, from the 6th)."""
    xs = [x for x in loss if x is not None]
    flags = []
    for t in range(5, len(xs)):
        window = xs[:t]
        sd = statistics.pstdev(window)
        flags.append(sd > 0 and abs(xs[t] - statistics.fmean(window)) >= sigmas * sd)
    return sum(flags) / len(flags) if flags else math.nan


# --- running ---------------------------------------------------------------------------------------------------------

KEEP = (
    "status",
    "reason",
    "fail_step",
    "steps_done",
    "instability",
    "peak_memory_gib",
    "probe_loss_trace",
    "probe_time_share",
    "train_time_s",
    "loss_trace",
    "lr_ceiling",
    "stability_margin",
    "margin_capped",
    "predicted_max_lr",
    "learning_progress",
    "stress_stop",
    "stress_steps",
    "stress_time_s",
    "stress_time_share",
    "stress_probe_loss_trace",
    "stress_peak_memory_gib",
)


class Runner:
    """Runs trials (``jobs`` at a time) and keeps the results file current."""

    def __init__(self, out: Path, threads: int | None, command: str):
        self.out, self.command = out, command
        self.env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
        self.model_path = resolve_model(BASE.model)
        self.work = Path(tempfile.mkdtemp(prefix="validity-"))
        self.lock = threading.Lock()
        self.rows: dict[int, dict[str, Any]] = {}
        self.commands: list[str] = []
        path = out / "validity.json"
        if path.is_file():
            data = json.loads(path.read_text())
            if data.get("version") == 2:
                self.rows = {int(k): v for k, v in data["rows"].items()}
                self.commands = list(data.get("commands", []))
        self.commands.append(command)

    def run(self, config: TrialConfig, name: str, stress: bool) -> dict[str, Any]:
        start = time.monotonic()
        result = _common.run_trial(config, self.work / name, model_path=self.model_path, env=self.env, stress=stress)
        data = {k: result.to_dict().get(k) for k in KEEP}
        data["wall_s"] = round(time.monotonic() - start, 1)
        print(
            f"{name}: lr={config.learning_rate:.3g} {result.status} "
            f"step {result.fail_step or result.constant.steps_done} "
            f"margin={result.stress.stability_margin} ({data['wall_s']:.0f} s)",
            flush=True,
        )
        return data

    def save(self) -> None:
        with self.lock:
            summary = summarize(self.rows)
            data = {"version": 2, "commands": self.commands, "summary": summary, "rows": self.rows}
            tmp = self.out / "validity.json.tmp"
            tmp.write_text(json.dumps(data, indent=1, default=str))
            os.replace(tmp, self.out / "validity.json")
            (self.out / "validity.md").write_text(markdown(self.rows, summary, "; ".join(self.commands)))

    def row(self, index: int) -> dict[str, Any]:
        with self.lock:
            return self.rows.setdefault(index, {"index": index, "case": CASES[index].__dict__})


def short_phase(runner: Runner, index: int) -> None:
    """The sweep's trial of case ``index``: 30 constant steps, then the stress phase."""
    row = runner.row(index)
    if row.get("short") and row["short"]["status"] not in ("crash", "timeout", "error"):
        return  # measured (a run that failed as a run, not as a configuration, is measured again)
    row["short"] = runner.run(config_of(CASES[index], 30), f"{index}-short", stress=True)
    runner.save()


def edge_phase(runner: Runner, index: int, long: int = 300) -> None:
    """Bisect the smallest constant multiple of the case's learning rate at which a ``long``-step run fails, to a
    factor of 2: start at the short trial's margin over 4 (a range test overshoots: the rate grows while the probe is
    still catching up), halve while it fails, double while it holds."""
    row = runner.row(index)
    short = row.get("short")
    if not short or short.get("stability_margin") is None:
        return
    runs = row.setdefault("edge_runs", [])
    done = {r["multiple"]: r for r in runs}
    multiple = 2.0 ** round(math.log2(max(1.0, short["stability_margin"] / 4)))
    for _ in range(8):
        if multiple not in done:
            result = runner.run(config_of(CASES[index], long, multiple), f"{index}-x{multiple:g}", stress=False)
            done[multiple] = {"multiple": multiple, **{k: result[k] for k in ("status", "fail_step", "steps_done")}}
            runs.append(done[multiple])
            runner.save()
        failed = done[multiple]["status"] in FAILED
        lower, upper = multiple / 2, multiple * 2
        if failed and lower in done and done[lower]["status"] not in FAILED:
            break
        if not failed and upper in done and done[upper]["status"] in FAILED:
            break
        if failed and multiple <= 1.0 / 8:
            break
        multiple = lower if failed else upper
    runner.save()


def _space_file(case: Case, folder: Path, **training: Any) -> Path:
    """A space file of the case for ``sweep trial`` (no search: every key fixed), with ``training`` on top."""
    import yaml

    config = config_of(case, 30)
    keys = (
        "learning_rate", "max_steps", "lora_alpha_ratio", "r", "bnb_4bit_compute_dtype", "bnb_4bit_quant_type",
        "bnb_4bit_use_double_quant", "per_device_train_batch_size", "max_seq_length", "optim", "gradient_checkpointing",
        "max_grad_norm", "lora_dropout", "memory_limit_gib",
    )  # fmt: skip
    space = {
        "study": {"name": "heldout"},
        "model": {"name_or_path": BASE.model.name_or_path, "attn_implementation": BASE.model.attn_implementation},
        "dataset": {"path": config.dataset.path, "max_samples": config.dataset.max_samples, "seed": case.dataset_seed},
        "training": {
            **{k: getattr(config, k) for k in keys},
            "target_modules": list(config.target_modules),
            "trial_timeout": "3h",
            **training,
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"space-{time.monotonic_ns()}.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def sweep_trial_json(runner: Runner, case: Case, name: str, **training: Any) -> dict[str, Any]:
    """``sweep trial SPACE --json`` of the case, as a user runs it; its result (the trial's JSON)."""
    import subprocess

    folder = runner.work / name
    start = time.monotonic()
    out = subprocess.run(
        [str(Path(sys.executable).parent / "sweep"), "trial", str(_space_file(case, folder, **training)), "--json"],
        cwd=folder,
        env=runner.env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"sweep trial failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    result = json.loads(out.stdout)
    data = {k: result.get(k) for k in KEEP}
    data["wall_s"] = round(time.monotonic() - start, 1)
    print(
        f"{name}: sweep trial {training or ''}: {result['status']} margin={result.get('stability_margin')}", flush=True
    )
    return data


def heldout_phase(runner: Runner, index: int, long: int = 300) -> None:
    """A held-out case, never used for the calibration factor, as a user checks it: ``sweep trial --json`` at its
    own rate (30 steps), then ``sweep trial --json`` at half and at twice the ``predicted_max_lr`` that run printed,
    ``long`` steps each. The first should hold and the second fail."""
    row = runner.row(index)
    if not row.get("heldout_short"):
        row["heldout_short"] = sweep_trial_json(runner, CASES[index], f"{index}-heldout")
        runner.save()
    predicted = row["heldout_short"].get("predicted_max_lr")
    if not predicted:
        return
    checks = row.setdefault("heldout_runs", [])
    done = {c["share"] for c in checks}
    for share in (0.5, 2.0):
        if share in done:
            continue
        rate = predicted * share
        result = sweep_trial_json(
            runner, CASES[index], f"{index}-p{share:g}", learning_rate=float(f"{rate:.4g}"), max_steps=long
        )
        checks.append({"share": share, "learning_rate": rate, **{k: result[k] for k in ("status", "fail_step")}})
        runner.save()


# --- summary ---------------------------------------------------------------------------------------------------------


def edge_multiple(row: dict[str, Any]) -> float | None:
    """The geometric mean of the largest multiple that held and the smallest that failed, when both are known."""
    runs = row.get("edge_runs") or []
    held = [r["multiple"] for r in runs if r["status"] not in FAILED and r["status"] == "complete"]
    failed = [r["multiple"] for r in runs if r["status"] in FAILED]
    if not held or not failed:
        return None
    lo, hi = max(m for m in held if m < min(failed)) if any(m < min(failed) for m in held) else None, min(failed)
    return math.sqrt(lo * hi) if lo is not None else None


def predictors(row: dict[str, Any]) -> dict[str, float]:
    """Each predictor of the edge, signed so that higher means "further from the edge"."""
    case, short = CASES[row["index"]], row["short"]
    loss = short.get("loss_trace") or []
    return {
        "stability_margin": short["stability_margin"],
        "1 / learning_rate": 1 / case.learning_rate,
        "1 / (learning_rate x lora_alpha/r)": 1 / (case.learning_rate * case.lora_alpha_ratio),
        "1 / (learning_rate x lora_alpha)": 1 / (case.learning_rate * case.lora_alpha_ratio * case.r),
        "- loss trend (last 5 / first 5)": -loss_trend(loss),
        "- LLM Foundry spike ratio": -foundry_spike(loss),
        "- OLMo 2 spike score": -olmo_spike_score(loss),
        "- instability": -(short.get("instability") or 0.0),
    }


def _risk(row: dict[str, Any], name: str) -> float:
    """A predictor's score of how close the row is to failing (the negated :func:`predictors` value); a short trial
    that already failed is the closest there is for the margin (it has none) and scores its own failure step for the
    others too only through their own formula."""
    short = row["short"]
    if name == "stability_margin":
        if short["status"] in FAILED or not short.get("stability_margin"):
            return 1e9 - (short.get("fail_step") or 0)
        return -short["stability_margin"]
    value = predictors({**row, "short": {**short, "stability_margin": short.get("stability_margin") or 1.0}})[name]
    return -value


def _figure(xs: list[float], ys: list[float]) -> dict[str, Any]:
    pairs = [(x, y) for x, y in zip(xs, ys) if not math.isnan(x)]
    rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
    lo, hi = bootstrap(lambda idx: spearman([pairs[i][0] for i in idx], [pairs[i][1] for i in idx]), len(pairs))
    return {"spearman": rho, "ci95": [lo, hi], "n": len(pairs)}


def summarize(rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The figures over what is measured so far (see the module docstring)."""
    out: dict[str, Any] = {"stress_cap": STRESS_CAP, "long_run_factor_in_code": LONG_RUN_FACTOR}
    shorts = [r for r in rows.values() if r.get("short")]
    margins = [r["short"]["stability_margin"] for r in shorts if r["short"].get("stability_margin")]
    shares = [r["short"]["stress_time_share"] for r in shorts if r["short"].get("stress_time_share")]
    out["short_trials"] = len(shorts)
    out["stress_time_share"] = {
        "median": statistics.median(shares) if shares else None,
        "max": max(shares, default=None),
    }
    recipe = [
        r["short"]["stability_margin"]
        for r in shorts
        if CASES[r["index"]].learning_rate <= 5e-4 and r["short"].get("stability_margin")
    ]
    out["margin_spread_at_recipe_rates"] = [min(recipe), max(recipe)] if recipe else None
    out["margins"] = len(margins)
    # Edge: margin against the bisected long-run edge.
    edged = [r for r in rows.values() if r.get("short") and edge_multiple(r) is not None]
    edges = [edge_multiple(r) for r in edged]
    out["edges"] = len(edged)
    if len(edged) >= 3:
        table = {}
        for name in predictors(edged[0]):
            table[name] = _figure([predictors(r)[name] for r in edged], edges)  # type: ignore[arg-type]
        out["edge_spearman"] = table
        factors = [
            edge_multiple(r) * CASES[r["index"]].learning_rate / r["short"]["lr_ceiling"]  # type: ignore[operator]
            for r in edged
            if r["short"].get("lr_ceiling")
        ]
        if factors:
            logs = [math.log(f) for f in factors]
            out["calibration_factor"] = {
                "geometric_mean": math.exp(statistics.fmean(logs)),
                "min": min(factors),
                "max": max(factors),
                "geometric_sd": math.exp(statistics.pstdev(logs)) if len(logs) > 1 else None,
                "n": len(factors),
                "note": "capped margins are left out (their ceiling is unknown)",
            }
    # Held out: predicted_max_lr checks.
    held = [r for r in rows.values() if r.get("heldout_runs")]
    out["heldout"] = [
        {
            "index": r["index"],
            "runs": [(c["share"], c["status"], c.get("fail_step")) for c in r["heldout_runs"]],
            "as_predicted": all((c["status"] in FAILED) == (c["share"] > 1) for c in r["heldout_runs"]),
        }
        for r in held
    ]
    # The 1x long runs of the first benchmark (0-14): does each predictor rank the long outcome?
    longs = [r for r in rows.values() if r.get("short") and r.get("long") and r["short"]["status"] != "crash"]
    if len(longs) >= 3:
        fails = [r["long"]["status"] in FAILED for r in longs]
        outcome = [
            2 + (300 - (r["long"].get("fail_step") or 300)) / 300 if f else (r["long"].get("instability") or 0.0)
            for r, f in zip(longs, fails)
        ]
        table = {}
        for name in predictors({"index": longs[0]["index"], "short": {**longs[0]["short"], "stability_margin": 1}}):
            risk = [_risk(r, name) for r in longs]
            n = len(longs)
            table[name] = {
                **_figure(risk, outcome),
                "auc_fails": auc(risk, fails),
                "auc_ci95": list(
                    bootstrap(lambda idx: auc([risk[i] for i in idx], [fails[i] for i in idx]), n)  # noqa: B023
                ),
            }
        out["long_1x"] = {
            "n": len(longs),
            "failed": sum(fails),
            "failed_after_the_short_horizon": sum(
                1 for r, f in zip(longs, fails) if f and r["short"]["status"] not in FAILED
            ),
            "auc_late_failures_margin": auc(
                [_risk(r, "stability_margin") for r in longs if r["short"]["status"] not in FAILED],
                [f for r, f in zip(longs, fails) if r["short"]["status"] not in FAILED],
            ),
            "identical_constant_phase": sum(1 for r in longs if r.get("same_short_trace")),
            "largest_first_loss_rel_diff": max((r.get("first_loss_rel_diff") or 0.0) for r in longs),
            "largest_short_trace_rel_diff": max((r.get("short_trace_max_rel_diff") or 0.0) for r in longs),
            "predictors": table,
        }
        agreement = {}
        for h in HORIZONS[:-1]:
            a = [
                float(min(r["long"].get("fail_step") or h + 1, h + 1)) if f else float(h + 1)
                for r, f in zip(longs, fails)
            ]
            b = [float(r["long"].get("fail_step") or 301) if f else 301.0 for r, f in zip(longs, fails)]
            agreement[f"{h}_vs_300"] = _figure([-x for x in a], [-y for y in b])
        out["horizon_agreement"] = agreement
    return out


def _fmt(x: Any, spec: str = ".3g") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _long(row: dict[str, Any]) -> str:
    long = row.get("long")
    if not long:
        return "-"
    return long["status"] + (f"@{long['fail_step']}" if long["status"] in FAILED else "")


def markdown(rows: dict[int, dict[str, Any]], summary: dict[str, Any], command: str) -> str:
    """The tables and the summary as markdown."""
    lines = [
        f"`{command}`",
        "",
        "| # | role | lr | lora_alpha/r | r | compute | quant | dq | batch | seq | data seed | short status | margin | "
        "lr_ceiling | learns | instability | stress share | 1x long run | long-run edge (x lr) | "
        "runs (multiple: outcome) |",
        "|" + "---|" * 20,
    ]
    for index in sorted(rows):
        r = rows[index]
        c, s = CASES[index], r.get("short") or {}
        runs = ", ".join(
            f"{e['multiple']:g}: {e['status']}{'@' + str(e['fail_step']) if e.get('fail_step') else ''}"
            for e in sorted(r.get("edge_runs") or [], key=lambda e: e["multiple"])
        )
        runs += "; ".join(
            f"{h['share']:g}x predicted ({h['learning_rate']:.3g}): {h['status']}" for h in r.get("heldout_runs") or []
        )
        margin = _fmt(s.get("stability_margin"), ".3g") + (" (cap)" if s.get("margin_capped") else "")
        lines.append(
            f"| {index} | {c.role or '-'} | {c.learning_rate:g} | {c.lora_alpha_ratio:g} | {c.r} | "
            f"{c.bnb_4bit_compute_dtype} | {c.bnb_4bit_quant_type} | "
            f"{'yes' if c.bnb_4bit_use_double_quant else 'no'} | "
            f"{c.per_device_train_batch_size} | {c.max_seq_length} | {c.dataset_seed} | {s.get('status', '-')} | "
            f"{margin} | {_fmt(s.get('lr_ceiling'))} | {_fmt(s.get('learning_progress'), '.1%')} | "
            f"{_fmt(s.get('instability'))} | {_fmt(s.get('stress_time_share'), '.0%')} | {_long(r)} | "
            f"{_fmt(edge_multiple(r))} | {runs or '-'} |"
        )
    lines += ["", "```json", json.dumps(summary, indent=1, default=str), "```"]
    return "\n".join(lines) + "\n"


def reuse_long_runs(runner: Runner, old: Path) -> None:
    """Attach the committed 1x long runs (the first benchmark, ``validity_1x_long.json``) to cases 0-14, with how far
    their short trial's first loss is from this run's (``first_loss_rel_diff``; 0 is the same first step bit for bit)
    and how far its first 5 are (``short_trace_max_rel_diff``). They are attached when the first step agrees within
    1%: the same configuration on the same code path, whose bfloat16 kernels may round differently on another
    machine (later steps then drift apart, as any two runs near an edge do)."""
    if not old.is_file():
        return
    data = json.loads(old.read_text())
    for old_row in data.get("rows", []):
        row = runner.rows.get(old_row["index"])
        if row is None or not row.get("short") or row.get("long"):
            continue
        new, before = row["short"].get("loss_trace") or [], old_row["short"].get("loss_trace") or []
        pairs = [(a, b) for a, b in zip(new[:5], before[:5]) if a is not None and b is not None]
        diffs = [abs(a - b) / abs(b) for a, b in pairs if b]
        row["same_short_trace"] = new == before
        row["short_trace_max_rel_diff"] = max(diffs, default=math.inf)
        row["first_loss_rel_diff"] = diffs[0] if diffs else math.inf
        if row["first_loss_rel_diff"] < 0.01:
            row["long"] = old_row["long"]
    runner.save()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("short", "edge", "heldout", "all"), default="all")
    parser.add_argument("--only", help="comma-separated case indices")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the results")
    parser.add_argument("--old", default=str(Path(__file__).parent / "results" / "validity_1x_long.json"))
    parser.add_argument("--jobs", type=int, default=1, help="trials at a time (default 1)")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each trial (default: torch's own)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/stability/validity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    runner = Runner(out, args.threads, command)
    chosen = [int(i) for i in args.only.split(",")] if args.only else list(range(len(CASES)))
    # Edge and held-out cases first: their long runs wait for their short trials.
    order = sorted(chosen, key=lambda i: (CASES[i].role == "", i))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        if args.phase in ("short", "all"):
            list(pool.map(lambda i: short_phase(runner, i), order))
            reuse_long_runs(runner, Path(args.old))
        if args.phase in ("edge", "all"):
            list(pool.map(lambda i: edge_phase(runner, i), [i for i in order if CASES[i].role == "edge"]))
        if args.phase in ("heldout", "all"):
            list(pool.map(lambda i: heldout_phase(runner, i), [i for i in order if CASES[i].role == "heldout"]))
    runner.save()
    print(markdown(runner.rows, summarize(runner.rows), "; ".join(runner.commands)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
