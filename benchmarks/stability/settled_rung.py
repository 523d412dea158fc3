"""What stopping the stress phase at the settled rung would save (issue 66, item 5): once a trial has held to the rung
whose margin makes the chance of diverging within H steps safe (its upper end under 5%,
``DivergenceModel.safe_margin``), further rungs change no call. On the completed short trials of the registered
validation (``results/divergence_chance.json``, 30 constant steps), the stress steps each would skip at horizon H and
the stress phase's median share of the constant phase before and after.

    .venv/bin/python benchmarks/stability/settled_rung.py > benchmarks/stability/results/settled_rung.md
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from sweeper.benchmarking import DIVERGENCE_MODEL
from sweeper.stability import STRESS_GROWTH, STRESS_STEPS

RESULTS = Path(__file__).parent / "results" / "divergence_chance.json"


def main() -> None:
    runs = json.loads(RESULTS.read_text())["runs"]
    shorts = [r for k, r in runs.items() if k.endswith("| short") and r["status"] == "complete"]
    model = DIVERGENCE_MODEL
    print(f"{len(shorts)} completed short trials of {RESULTS.name}")
    print("| horizon H | settled rung | stress steps skipped | stress share, median: now -> stopped at the rung |")
    print("|---|---|---|---|")
    for horizon in (60, 200, 400, 1000, 2000):
        rung = min(STRESS_STEPS, math.ceil(math.log(model.safe_margin(horizon)) / math.log(STRESS_GROWTH)))
        used = [r["stress_steps"] for r in shorts]
        skipped = [max(0, s - rung) for s in used]
        shares = [r["stress_time_share"] for r in shorts]
        stopped = [sh * (1 - k / s if s else 1) for sh, k, s in zip(shares, skipped, used)]
        print(
            f"| {horizon} | {rung} ({STRESS_GROWTH**rung:.1f}x) | {sum(skipped)} of {sum(used)} | "
            f"{statistics.median(shares):.3f} -> {statistics.median(stopped):.3f} |"
        )


if __name__ == "__main__":
    main()
