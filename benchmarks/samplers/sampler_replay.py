"""Samplers replayed on the table of real trials (``benchmarks/samplers/sampler_table.py``): how many trials, and how
much wall time, each needs to find the front of peak memory against edge proximity.

Each replay is an Optuna study with the product's objectives (``DEFAULT_OBJECTIVES`` of ``sweeper.study._objectives``,
both minimized) and distributions (``to_distributions`` of ``sweeper.study._sampling``, on the table's space); a trial's
outcome is the table's row for the configuration it asked for, told as ``sweep run`` tells it (COMPLETE with its
objectives' values, PRUNED for nan, diverged, OOM and the other failures). Per trial the replay charges what the sweep
would spend:

- a measured trial: its measured wall time (``wall_time_s``, a cold trial process);
- a configuration asked for again (``repeated``): nothing;
- with the product's memory pruning: a configuration the preflight prunes (``predicted_oom``: the memory model's
  prediction, corrected by the complete trials so far, over the cap; ``dominated_oom``: at least as large as a
  measured OOM; :func:`sweeper.memory.preflight`): nothing. Without it, every configuration is measured.

Samplers: random, TPE (the product's settings: ``make_sampler``), ``tpe-ordered`` (the same TPE, each list of numbers
searched as ordered: :func:`ordered`), NSGA-II, Optuna's GP sampler, and ``tpe+front-seeds``,
TPE started on what the product knows before any trial runs (:func:`front_seeds`). Figures, over ``--seeds`` seeds at
budgets of 10, 20, 40 and 80 trials: the hypervolume of the complete trials' front over the table's true front
(reference point: each objective's worst value among the table's complete trials plus a tenth of its range), the trials
and the wall time to reach 90% of it, and the one-sided Mann-Whitney U p-value of each sampler's hypervolume ratio
against random's (Mann & Whitney 1947, ``scipy.stats.mannwhitneyu``).

    python benchmarks/samplers/sampler_replay.py                   # every sampler, 20 seeds (pip install -e '.[bench]')
    python benchmarks/samplers/sampler_replay.py --samplers random,tpe --seeds 5
    python benchmarks/samplers/sampler_replay.py --where r=4                             # on a part of the grid

Writes ``benchmarks/samplers/results/sampler_replay.{json,md,html,png}``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))

import yaml
from sampler_table import grid, key_of, table_space

from sweeper.benchmarking import (  # the product's, as sweep run tells them and draws its front line
    DEFAULT_OBJECTIVES,
    hypervolume,  # Optuna's WFG, as sweep run's front line uses it
    reference_point,  # the same reference as sweep run's front line
    resolve_objectives,
)
from sweeper.memory import CalibrationPoint, Known, fit_calibration, group_of, preflight
from sweeper.space import SearchSpace
from sweeper.study import Objective, make_sampler, to_distributions
from sweeper.trial import TrialResult

BUDGETS = (10, 20, 40, 80)
SAMPLERS = ("random", "tpe", "tpe-ordered", "nsgaii", "gp", "tpe+front-seeds")
TARGET = 0.9
#: The memory kind of the table's trials (CPU resident set), which the preflight's correction is fitted in.
KIND = "cpu_peak_rss"
#: The output files' name: ``sampler_replay``, with ``_`` and the third objective's name under ``--objectives``.
STEM = "sampler_replay"
#: The objectives replayed: the product's default two, or those of ``--objectives`` (set once in :func:`main`).
OBJECTIVES: tuple[Objective, ...] = DEFAULT_OBJECTIVES


@dataclass
class Replay:
    """One replayed study: per trial, its cost (s), whether it was measured, and the hypervolume ratio after it."""

    sampler: str
    seed: int
    prune: bool
    costs: list[float] = field(default_factory=list)
    measured: list[bool] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)

    def ratio_at(self, trials: int) -> float:
        """The hypervolume ratio after ``trials`` trials (the last one when the replay ran fewer)."""
        return self.ratios[min(trials, len(self.ratios)) - 1] if self.ratios else 0.0

    def to_target(self) -> tuple[int | None, float | None]:
        """(trials, wall time in s) to reach :data:`TARGET` of the true hypervolume; (None, None) if never."""
        for i, r in enumerate(self.ratios):
            if r >= TARGET - 1e-12:
                return i + 1, sum(self.costs[: i + 1])
        return None, None


def minimized(values: Sequence[float]) -> list[float]:
    """The objectives' values signed so that lower is better."""
    return [o.better(v) for o, v in zip(OBJECTIVES, values)]


class Table:
    """The measured table: per configuration key, its result, predicted peak and the objectives' values."""

    def __init__(self, path: Path, fixed: dict[str, Any] | None = None):
        data = json.loads(path.read_text())
        fixed = fixed or {}
        self.space: SearchSpace = table_space(fixed)
        self.rows: dict[str, dict[str, Any]] = {
            key_of({k: v for k, v in row["params"].items() if k not in fixed}): row
            for row in data["rows"].values()
            if all(row["params"][k] == v for k, v in fixed.items())
        }
        self.results = {k: TrialResult.from_dict(r) for k, r in self.rows.items()}
        self.values = {
            k: minimized([o.value_of(r) for o in OBJECTIVES])
            for k, r in self.results.items()
            if r.status.value == "complete"
        }
        if not self.values:
            raise SystemExit(f"{path}: no complete trial; run benchmarks/samplers/sampler_table.py first")
        self.reference = reference_point(list(self.values.values()))
        self.true_hypervolume = hypervolume(list(self.values.values()), self.reference)
        self.missing = len(grid(self.space)) - len(self.rows)


def front_seeds(table: Table) -> list[dict[str, Any]]:
    """Configurations to run first, from what the product knows before any trial: for each ``lora_alpha`` (``r x
    lora_alpha_ratio``, with the learning rate the step size that moves the stability margin most: docs/validity.md)
    the configuration of least predicted peak memory. These span the stability axis at the memory axis's low end, where
    the front's points lie unless the cheapest shape diverges."""
    best: dict[float, tuple[float, dict[str, Any]]] = {}
    for row in table.rows.values():
        params = row["params"]
        alpha = params["r"] * params["lora_alpha_ratio"]
        predicted = row["predicted_peak_gib"] or math.inf
        if alpha not in best or predicted < best[alpha][0]:
            best[alpha] = (predicted, params)
    return [params for _, params in sorted(best.values(), key=lambda x: x[0])]


def make(name: str, seed: int, n_trials: int, space: SearchSpace) -> optuna.samplers.BaseSampler:
    """The sampler ``name`` at ``seed``: the product's for random, tpe and nsgaii; Optuna's GP sampler for gp."""
    if name == "gp":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(seed=seed)
    base: Any = "tpe" if name.startswith("tpe") else name  # one of the product's sampler names
    return make_sampler(replace(space.study, sampler=base, seed=seed), n_trials, seed)


def ordered(distributions: dict[str, Any]) -> dict[str, Any]:
    """The distributions TPE samples under ``tpe-ordered``: a list of numbers (``r: [4, 8, 16, 32]``) becomes the
    index of its sorted values, an ``IntDistribution(0, n - 1)``, so that TPE's kernel on it knows that 16 lies
    between 8 and 32 (one step each way: the lists are geometric); other distributions are kept. Optuna 5.1 has no
    ``categorical_distance_func`` (removed in optuna#6783), the other way to give TPE the order."""
    out = dict(distributions)
    for key, dist in distributions.items():
        choices = getattr(dist, "choices", None)
        if choices and all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in choices):
            out[key] = optuna.distributions.IntDistribution(0, len(choices) - 1)
    return out


def values_of(params: dict[str, Any], distributions: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """``params`` asked under :func:`ordered` distributions, as the values of the space's own ``distributions``."""
    out = dict(params)
    for key, dist in distributions.items():
        if asked[key] is not dist:
            out[key] = sorted(dist.choices)[params[key]]
    return out


def replay(table: Table, name: str, seed: int, prune: bool, n_trials: int) -> Replay:
    """Replay ``n_trials`` trials of sampler ``name`` at ``seed`` on ``table``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["minimize"] * len(OBJECTIVES),
                                sampler=make(name, seed, n_trials, table.space))  # fmt: skip
    if name.endswith("front-seeds"):
        for params in front_seeds(table):
            study.enqueue_trial(params)
    distributions = to_distributions(table.space)
    asked = ordered(distributions) if name == "tpe-ordered" else distributions
    out = Replay(name, seed, prune)
    seen: dict[str, tuple[TrialState, list[float] | None]] = {}
    known: list[Known] = []
    points: list[CalibrationPoint] = []
    front: list[list[float]] = []
    for number in range(n_trials):
        trial = study.ask(asked)
        params = values_of(trial.params, distributions, asked)
        key = key_of(params)
        if key not in table.rows:
            raise SystemExit(f"the table has no row {key!r} ({table.missing} configurations missing): measure it")
        config = table.space.trial_config(params)
        cost, measured = 0.0, False
        if key in seen:
            state, values = seen[key]
        elif prune and preflight(config, table.rows[key]["predicted_peak_gib"], known, device="cpu",
                                 calibration=fit_calibration(points, KIND)):  # fmt: skip
            state, values = TrialState.PRUNED, None
        else:
            result = table.results[key]
            cost, measured = float(table.rows[key]["wall_time_s"] or 0.0), True
            values = table.values.get(key)
            state = TrialState.COMPLETE if values is not None else TrialState.PRUNED
            if result.status.fits is not None:
                known.append(Known(number=number, config=config, fits=result.status.fits, memory_kind=KIND))
            peak, predicted = result.memory.peak_memory_gib, table.rows[key]["predicted_peak_gib"]
            if values is not None and peak and predicted:
                points.append(CalibrationPoint(number=number, group=group_of(config), predicted_gib=predicted,
                                               measured_gib=peak))  # fmt: skip
            if values is not None:
                front.append(values)
        seen[key] = (state, values)
        study.tell(trial, values, state=None if values is not None else state)
        out.costs.append(cost)
        out.measured.append(measured)
        out.ratios.append(hypervolume(front, table.reference) / table.true_hypervolume)
    return out


def summarize(replays: list[Replay], short: dict[tuple[str, bool, int, int], float] | None = None) -> dict[str, Any]:
    """Per sampler and pruning: the hypervolume ratio at each budget (median, 10th-90th percentile over seeds),
    trials and wall time to :data:`TARGET` (median and the same percentiles; a seed that never reached it counts as
    beyond the budget), and the Mann-Whitney p-value against random at each budget.

    ``short`` holds the final ratio of studies run with a smaller ``n_trials`` (sampler, pruning, seed, budget): where
    given, a budget's figure is that study's, not the longer study's prefix."""
    short = short or {}

    def at(r: Replay, budget: int) -> float:
        return short.get((r.sampler, r.prune, r.seed, budget), r.ratio_at(budget))

    from scipy.stats import mannwhitneyu

    groups: dict[tuple[str, bool], list[Replay]] = {}
    for r in replays:
        groups.setdefault((r.sampler, r.prune), []).append(r)

    def spread(xs: list[float]) -> dict[str, float]:
        q = np.percentile(xs, [10, 50, 90])
        return {"median": float(q[1]), "p10": float(q[0]), "p90": float(q[2])}

    out: dict[str, Any] = {}
    for (sampler, prune), rs in sorted(groups.items()):
        n = max(len(r.ratios) for r in rs)
        reached = [r.to_target() for r in rs]
        trials = [t if t is not None else math.inf for t, _ in reached]
        walls = [w if w is not None else math.inf for _, w in reached]
        entry: dict[str, Any] = {
            "seeds": len(rs),
            "trials": n,
            "reached_target": sum(t is not None for t, _ in reached),
        }
        for budget in BUDGETS:
            if budget > n:
                continue
            ratios = [at(r, budget) for r in rs]
            entry[f"ratio_at_{budget}"] = spread(ratios)
            baseline = groups.get(("random", prune))
            if baseline is not None and sampler != "random":
                base = [at(r, budget) for r in baseline]
                entry[f"p_vs_random_at_{budget}"] = float(mannwhitneyu(ratios, base, alternative="greater").pvalue)
        entry["trials_to_target"] = {k: (v if math.isfinite(v) else None) for k, v in spread(trials).items()}
        entry["wall_s_to_target"] = {k: (v if math.isfinite(v) else None) for k, v in spread(walls).items()}
        entry["median_ratio_by_trial"] = [statistics.median(r.ratio_at(i + 1) for r in rs) for i in range(n)]
        out[f"{sampler} | {'pruning' if prune else 'no pruning'}"] = entry
    return out


_TABLE: Table | None = None


def _replay_job(job: tuple[str, int, bool, int]) -> tuple[Replay, dict[int, float]]:
    """One sampler's replay at one seed (in a worker process), and for TPE the final ratio of a study run with each
    smaller budget as its ``n_trials``: TPE's random start is a quarter of the study's trials (``n_startup_trials``),
    so a 10-trial night is its own study, not the first 10 trials of an 80-trial one."""
    name, seed, prune, trials = job
    assert _TABLE is not None
    shorter = {
        budget: replay(_TABLE, name, seed, prune, budget).ratios[-1]
        for budget in BUDGETS
        if budget < trials and name.startswith("tpe")
    }
    return replay(_TABLE, name, seed, prune, trials), shorter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default=str(Path(__file__).parent / "results" / "sampler_table.json"))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--trials", type=int, default=max(BUDGETS))
    parser.add_argument("--objectives", help="e.g. peak_memory_gib,edge_proximity,learning_progress (default: the "
                        "product's two)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="replays run at once (processes)")
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        help="KEY=VALUE: replay on the part of the grid with that setting fixed (a partial table)",
    )
    args = parser.parse_args(argv)
    global OBJECTIVES, STEM
    if args.objectives:
        OBJECTIVES = resolve_objectives(args.objectives.split(","), "--objectives")
        STEM = "_".join(["sampler_replay", *(o.name for o in OBJECTIVES if o not in DEFAULT_OBJECTIVES)])
    fixed = {k: yaml.safe_load(v) for k, _, v in (w.partition("=") for w in args.where)}
    table = Table(Path(args.table), fixed)
    names = [s.strip() for s in args.samplers.split(",")]
    unknown = [s for s in names if s not in SAMPLERS]
    if unknown:
        parser.error(f"--samplers: no sampler {unknown[0]!r}; choose among {', '.join(SAMPLERS)}")
    global _TABLE
    _TABLE = table  # inherited by the forked workers
    jobs = [(name, seed, prune, args.trials) for name in names for prune in (False, True) for seed in range(args.seeds)]
    replays, short = [], {}
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        for (name, seed, prune, _), (full, shorter) in zip(jobs, pool.map(_replay_job, jobs)):
            replays.append(full)
            short.update({(name, prune, seed, budget): ratio for budget, ratio in shorter.items()})
    print(f"{len(jobs)} replays ({', '.join(names)}; {args.seeds} seeds, with and without pruning)", flush=True)
    summary = summarize(replays, short)
    write(Path(args.out), table, summary, args)
    return 0


def write(out: Path, table: Table, summary: dict[str, Any], args: argparse.Namespace) -> None:
    """``sampler_replay.json`` (every figure), ``.md`` (the table of them) and ``.html``/``.png`` (the median
    hypervolume ratio against trials)."""
    payload = {"table": args.table, "true_hypervolume": table.true_hypervolume, "reference_point": table.reference,
               "objectives": [o.name for o in OBJECTIVES], "target": TARGET, "summary": summary}  # fmt: skip
    (out / f"{STEM}.json").write_text(json.dumps(payload, indent=1))
    lines = [
        "# Samplers replayed on the table of real trials (`benchmarks/samplers/sampler_replay.py`)",
        "",
        f"Table: {len(table.rows)} configurations, {len(table.values)} complete; objectives "
        f"{', '.join(o.name for o in OBJECTIVES)} (each signed to be minimized); reference point "
        f"({', '.join(f'{x:.4g}' for x in table.reference)}); true hypervolume {table.true_hypervolume:.4g}.",
        "",
        "| sampler | memory pruning | "
        + " | ".join(f"HV at {b} (p10-p90)" for b in BUDGETS)
        + f" | trials to {TARGET:.0%} (p10-p90) | wall s to {TARGET:.0%} | p vs random at 40 |",
        "|---|---|" + "---|" * (len(BUDGETS) + 3),
    ]

    def fmt(d: dict[str, Any] | None, digits: int = 2) -> str:
        if not d:
            return "-"
        f = lambda v: ">budget" if v is None else f"{v:.{digits}f}"  # noqa: E731
        return f"{f(d['median'])} ({f(d['p10'])}-{f(d['p90'])})"

    for name, e in summary.items():
        sampler, prune = name.split(" | ")
        cells = [fmt(e.get(f"ratio_at_{b}")) for b in BUDGETS]
        p = e.get("p_vs_random_at_40")
        lines.append(f"| {sampler} | {prune} | " + " | ".join(cells) + f" | {fmt(e['trials_to_target'], 0)} | "
                     f"{fmt(e['wall_s_to_target'], 0)} | {'-' if p is None else f'{p:.3g}'} |")  # fmt: skip
    (out / f"{STEM}.md").write_text("\n".join(lines) + "\n")
    plot(out, summary)


def plot(out: Path, summary: dict[str, Any]) -> None:
    """The median hypervolume ratio against trials, one line per sampler and pruning, as HTML (plotly) and PNG
    (plotly's kaleido when installed)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, e in summary.items():
        ys = e["median_ratio_by_trial"]
        fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines", name=name,
                                 line={"dash": "solid" if "no pruning" not in name else "dot"}))  # fmt: skip
    fig.add_hline(y=TARGET, line={"color": "grey", "dash": "dash"})
    fig.update_layout(title="Hypervolume of the found front over the true front (median over seeds)",
                      xaxis_title="trials", yaxis_title="hypervolume ratio", width=900, height=520)  # fmt: skip
    fig.write_html(out / f"{STEM}.html", include_plotlyjs="cdn")
    try:
        fig.write_image(out / f"{STEM}.png")
    except Exception as exc:  # kaleido absent, or without a browser: the HTML stands
        print(f"no PNG ({type(exc).__name__}: {exc}); the HTML is {out / f'{STEM}.html'}")


if __name__ == "__main__":
    sys.exit(main())
