"""``benchmarks/gpu/gpu_check.sh`` in its CPU dry run (``GPU_CHECK_DRY_RUN=1``): every part of the GPU check runs,
shrunk, so that the one call a lent GPU gets does not fail on a typo (the figures are the GPU's only on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_gpu_check_runs_every_part_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu" / "gpu_check.sh"), str(out)],
        env={**os.environ, "GPU_CHECK_DRY_RUN": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "GPU_CHECK_DRY_RUN=1" in (out / "gpu.txt").read_text()
    stages = json.loads((out / "cold_start.json").read_text())["summary"]
    assert [s["stage"] for s in stages][:2] == ["import torch", "import transformers, its model code"]
    assert all(s["driver_initialized"] is None for s in stages)  # no CUDA driver here
    assert "(auto) of this machine's" in (out / "card.txt").read_text()
    assert "no CUDA device or no nvidia-smi here" in (out / "cuda_context.txt").read_text()
    assert json.loads((out / "estimate_8b.json").read_text())["points"]
    figures = json.loads((out / "sweep_8b.json").read_text())
    assert figures["trials_run"] == 1 and figures["trials_per_hour"] > 0, figures
    (trial,) = figures["trials"]
    assert trial["status"] == "complete" and trial["predicted_peak_gib"] > 0
    assert set(trial["phase_peak_memory_gib"]) >= {"load", "train", "worst_case", "probe", "stress"}
    assert trial["worst_case_shape"] == [1, 256] and 0 < trial["data_token_share"] <= 1
    exported = json.loads((out / "export_peak.json").read_text())  # the trl file's runs against that trial's peak
    assert exported["device"] == "cpu" and exported["peaks"]["trial"] == [
        pytest.approx(trial["peak_memory_gib"], abs=1e-3)
    ]
    assert all(len(exported["peaks"][run]) == 1 and exported["peaks"][run][0] > 0 for run in ("trl", "trl-full-logits"))
