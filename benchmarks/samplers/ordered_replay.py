"""Does TPE find the front sooner when it knows that ``r: [4, 8, 16, 32]`` is ordered? The product's TPE against the
same TPE with each list of numbers searched as the index of its sorted values (``tpe-ordered``:
``sampler_replay.ordered``), replayed on the table of real trials (``benchmarks/samplers/sampler_replay.py``), seed by
seed: the same seeds for both, each budget its own study (TPE's random start is a quarter of ``n_trials``).

Figures per sampler: the hypervolume ratio at 10, 20 and 40 trials and the trials to 90% of the true front (median,
10th-90th percentile over seeds), and per budget the paired difference (ordered minus unordered: median, wins,
ties, losses) with the two-sided Wilcoxon signed-rank p-value (Wilcoxon 1945, ``scipy.stats.wilcoxon``; ties
dropped). With ``--objectives peak_memory_gib,edge_proximity,learning_progress`` on the three-objective front, which
separates samplers more than the two-objective one (random reaches 90% of the latter in a median 10 trials too).

    python benchmarks/samplers/ordered_replay.py [--seeds 40] [--objectives ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))

import sampler_replay as sr
from scipy.stats import wilcoxon

from sweeper.benchmarking import resolve_objectives

BUDGETS = (10, 20, 40)
SAMPLERS = ("tpe", "tpe-ordered")


def _job(job: tuple[str, int]) -> tuple[str, int, dict[int, float], int | None]:
    name, seed = job
    assert sr._TABLE is not None
    ratios = {budget: sr.replay(sr._TABLE, name, seed, False, budget).ratios[-1] for budget in BUDGETS}
    longest = sr.replay(sr._TABLE, name, seed, False, max(BUDGETS))
    return name, seed, ratios, longest.to_target()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", default=str(Path(__file__).parent / "results" / "sampler_table.json"))
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--objectives", help="e.g. peak_memory_gib,edge_proximity,learning_progress")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.objectives:
        sr.OBJECTIVES = resolve_objectives(args.objectives.split(","), "--objectives")
    sr._TABLE = sr.Table(Path(args.table))
    jobs = [(name, seed) for name in SAMPLERS for seed in range(args.seeds)]
    with ProcessPoolExecutor(mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(_job, jobs))
    by = {(name, seed): (ratios, to90) for name, seed, ratios, to90 in results}

    def spread(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        at = lambda q: xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]  # noqa: E731
        return {"median": statistics.median(xs), "p10": at(0.1), "p90": at(0.9)}

    out: dict = {
        "what": __doc__.split("\n\n")[0].replace("\n", " "),
        "objectives": [o.name for o in sr.OBJECTIVES],
        "seeds": args.seeds,
        "samplers": {},
        "paired": {},
    }
    for name in SAMPLERS:
        out["samplers"][name] = {
            **{f"ratio_at_{b}": spread([by[name, s][0][b] for s in range(args.seeds)]) for b in BUDGETS},
            "trials_to_90": spread([float(by[name, s][1] or max(BUDGETS) + 1) for s in range(args.seeds)]),
        }
    for b in [*BUDGETS, "trials_to_90"]:
        if b == "trials_to_90":  # fewer is better: the difference is signed so that positive favours ordered
            diffs = [float((by["tpe", s][1] or 81) - (by["tpe-ordered", s][1] or 81)) for s in range(args.seeds)]
        else:
            diffs = [by["tpe-ordered", s][0][b] - by["tpe", s][0][b] for s in range(args.seeds)]
        nonzero = [d for d in diffs if abs(d) > 1e-12]
        p = float(wilcoxon(nonzero).pvalue) if len(nonzero) >= 5 else None
        out["paired"][str(b)] = {
            "median_difference": statistics.median(diffs),
            "ordered_better": sum(d > 1e-12 for d in diffs),
            "ties": len(diffs) - len(nonzero),
            "ordered_worse": sum(d < -1e-12 for d in diffs),
            "wilcoxon_p": p,
        }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
