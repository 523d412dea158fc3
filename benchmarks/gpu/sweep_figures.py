"""The figures of one sweep, for the GPU check: trials per hour, each trial's phase peaks against the memory model's
prediction, the preflight's decisions, and the share of each trial's tokens that were the data's own.

    python benchmarks/gpu/sweep_figures.py STUDY [--wall-s SECONDS] [--json OUT.json]  # STUDY as sweep report takes it

``--wall-s`` is the sweep's wall time (``sweep run`` from start to end, as the caller timed it); without it trials
per hour are over the trials' own wall times (no model loading between trials is counted then). Run it from the
folder the sweep ran in (its ``studies/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

from sweeper.study import load_existing_study, snapshot

#: Statuses the preflight gives without running a trial.
PREFLIGHT = ("predicted_oom", "dominated_oom")


def figures(study_ref: str, wall_s: float | None) -> dict:
    """One row per trial and the sweep's totals (see the module's docstring)."""
    loaded, url = load_existing_study(study_ref)
    study = snapshot(loaded)
    rows = []
    for t in study.trials:
        if t.config is None:
            continue
        m, c = t.result.memory, t.result.constant
        peak, predicted = m.peak_memory_gib, m.predicted_peak_gib
        rows.append(
            {
                "number": t.number,
                "status": str(t.status),
                "params": dict(t.params),
                "phase_peak_memory_gib": {k: round(v, 3) for k, v in m.phase_peak_memory_gib.items()},
                "peak_memory_gib": None if peak is None else round(peak, 3),
                "predicted_peak_gib": None if predicted is None else round(predicted, 3),
                "error": None
                if not (peak and predicted) or t.status.value in PREFLIGHT
                else round((predicted - peak) / peak, 4),
                "worst_case_shape": m.worst_case_shape,
                "data_token_share": c.data_token_share,
                "tokens_per_s": c.tokens_per_s,
                "wall_time_s": None
                if t.result.provenance.wall_time_s is None
                else round(t.result.provenance.wall_time_s, 1),
                "repeat_of": t.repeat_of,
            }
        )
    ran = [r for r in rows if r["status"] not in PREFLIGHT and r["repeat_of"] is None and r["wall_time_s"]]
    errors = [abs(r["error"]) for r in ran if r["error"] is not None and r["status"] == "complete"]
    seconds = wall_s if wall_s else sum(r["wall_time_s"] for r in ran)
    return {
        "study": study.name,
        "storage": url,
        "trials": rows,
        "trials_run": len(ran),
        "preflight": {s: [r["number"] for r in rows if r["status"] == s] for s in PREFLIGHT},
        "trials_per_hour": round(3600 * len(ran) / seconds, 1) if ran and seconds else None,
        "trials_per_hour_over": "the sweep's wall time" if wall_s else "the trials' own wall times",
        "median_abs_error_complete": round(statistics.median(errors), 4) if errors else None,
        "largest_abs_error_complete": round(max(errors), 4) if errors else None,
    }


def lines(f: dict) -> list[str]:
    """The figures as text."""
    out = [f"study {f['study']} ({f['storage']})"]
    for r in f["trials"]:
        phases = " ".join(f"{k} {v:.2f}" for k, v in r["phase_peak_memory_gib"].items())
        err = "" if r["error"] is None else f" error {100 * r['error']:+.1f}%"
        share = "" if r["data_token_share"] is None else f" data tokens {100 * r['data_token_share']:.0f}%"
        out.append(
            f"#{r['number']} {r['status']:<14} {json.dumps(r['params'], sort_keys=True)} peak {r['peak_memory_gib']} "
            f"predicted {r['predicted_peak_gib']}{err} [{phases}] worst {r['worst_case_shape']}{share} "
            f"wall {r['wall_time_s']}"
        )
    out.append(
        f"trials run {f['trials_run']}, {f['trials_per_hour']} an hour (over {f['trials_per_hour_over']}); "
        f"preflight: {f['preflight']}; predicted vs measured on complete trials: median "
        f"{f['median_abs_error_complete']}, largest {f['largest_abs_error_complete']}"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study")
    parser.add_argument("--wall-s", type=float)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    f = figures(args.study, args.wall_s)
    print("\n".join(lines(f)))
    if args.json:
        args.json.write_text(json.dumps(f, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
