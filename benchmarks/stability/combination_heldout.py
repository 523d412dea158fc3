"""The held-out check of the combined figures chosen on the equal-step block.

``benchmarks/stability/validity_block.py`` scored single candidates for "a figure that sees more than the step size"
and, after them, two parameter-free combinations chosen on that block: ``(1 + instability) / stability_margin`` and
``update-to-weight ratio / stability_margin``. A figure chosen on 11 configurations needs configurations it was not
chosen on. This script scores them on the first validity benchmark's 15 configurations with a 300-step run at their
own rate (``benchmarks/stability/results/validity.json``, rows 0-14; measured before the block existed, so not used to
choose anything), with the same outcome and statistics as ``validity.py``'s ``long_1x`` table: AUC for a failure within
300 steps, and Spearman with the long outcome (a failure ranks by how early it came, a hold by its long-run
instability), both with bootstrap 95% intervals over the 15 configurations (2000 resamples), all of them and the 11
whose short trial completed (where the formula cannot rank by a failure it already saw).

The update-to-weight ratio was not recorded by that benchmark, so only the first combination can be checked here.

    python benchmarks/stability/combination_heldout.py  # prints the table; writes results/combination_heldout.md

It reads committed results and runs no training (a second).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))

from validity import FAILED, auc, bootstrap, spearman

RESULTS = Path(__file__).parent / "results"
HORIZON = 300


def _margin_risk(short: dict[str, Any], of_margin: Callable[[dict[str, Any]], float]) -> float:
    """Higher = closer to failing; a short trial that already failed ranks above every complete one, earlier first."""
    if short["status"] in FAILED or not short.get("stability_margin"):
        return 1e9 - (short.get("fail_step") or 0)
    return of_margin(short)


def figures(row: dict[str, Any]) -> dict[str, float]:
    """Each figure's risk score for one row of ``validity.json`` (higher = closer to failing)."""
    case, short = row["case"], row["short"]
    inst = short.get("instability") or 0.0
    step = case["learning_rate"] * case["lora_alpha_ratio"] * case["r"]
    return {
        "1 / stability margin (the product's figure)": _margin_risk(short, lambda s: 1 / s["stability_margin"]),
        "(1 + instability) / stability margin (chosen on the block)": _margin_risk(
            short, lambda s: (1 + inst) / s["stability_margin"]
        ),
        "instability": inst,
        "learning_rate x lora_alpha": step,
        "learning_rate x lora_alpha / r": case["learning_rate"] * case["lora_alpha_ratio"],
        "learning_rate": case["learning_rate"],
    }


def score(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """AUC (failure within the horizon) and Spearman (with the long outcome) of each figure, with 95% intervals."""
    fails = [r["long"]["status"] in FAILED for r in rows]
    outcome = [
        2 + (HORIZON - (r["long"].get("fail_step") or HORIZON)) / HORIZON
        if f
        else (r["long"].get("instability") or 0.0)
        for r, f in zip(rows, fails)
    ]
    out: dict[str, dict[str, Any]] = {}
    for name in figures(rows[0]):
        risk = [figures(r)[name] for r in rows]
        n = len(rows)
        out[name] = {
            "auc": auc(risk, fails),
            "auc_ci95": bootstrap(lambda idx: auc([risk[i] for i in idx], [fails[i] for i in idx]), n),  # noqa: B023
            "spearman": spearman(risk, outcome),
            "spearman_ci95": bootstrap(
                lambda idx: spearman([risk[i] for i in idx], [outcome[i] for i in idx]),  # noqa: B023
                n,
            ),
        }
    return out


def _row(name: str, s: dict[str, Any]) -> str:
    a, (al, ah), p, (pl, ph) = s["auc"], s["auc_ci95"], s["spearman"], s["spearman_ci95"]
    return f"| {name} | {a:.3f} ({al:.2f}-{ah:.2f}) | {p:.3f} ({pl:.2f}-{ph:.2f}) |"


def main() -> int:
    data = json.loads((RESULTS / "validity.json").read_text())
    rows = sorted((r for r in data["rows"].values() if r.get("long")), key=lambda r: r["index"])
    complete = [r for r in rows if r["short"]["status"] not in FAILED]
    lines = [
        "# The block's combined figure on configurations it was not chosen on",
        "",
        "Written by `python benchmarks/stability/combination_heldout.py` from `validity.json` (the first validity",
        f"benchmark's configurations with a {HORIZON}-step run at their own rate). Bootstrap 95% intervals, 2000 resamples.",  # noqa: E501
    ]
    for title, subset in (("all", rows), ("short trial complete", complete)):
        fails = sum(r["long"]["status"] in FAILED for r in subset)
        lines += [
            "",
            f"## {title}: {len(subset)} configurations, {fails} failed within {HORIZON} steps",
            "",
            "| figure (higher = closer to failing) | AUC, fails within 300 steps | Spearman with the long outcome |",
            "|---|---|---|",
        ]
        lines += [_row(name, s) for name, s in score(subset).items()]
    text = "\n".join(lines) + "\n"
    (RESULTS / "combination_heldout.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
