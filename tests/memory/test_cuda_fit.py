"""The memory model's CUDA factors against the H200 rows they were fitted on and the rows held out
(``benchmarks/gpu/fit_cuda_memory.py``, ``benchmarks/gpu/results/gpu-h200-2026-12-04-train``): measured GPU peaks, read
from the committed file (no GPU needed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks" / "gpu"))

import fit_cuda_memory

from sweeper.memory import ModelShape
from sweeper.memory._model import CUDA_ACTIVATION_FACTOR, CUDA_LOGITS_FACTOR, MemorySettings, estimate_memory
from sweeper.memory._shapes import KNOWN_SHAPES

ROWS = json.loads(fit_cuda_memory.ROWS.read_text())["rows"]


def _predicted(row: dict) -> float:
    """``sweep estimate``'s own prediction (estimate_memory on CUDA) for one row's settings."""
    s = fit_cuda_memory.settings(row)
    return estimate_memory(ModelShape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-8B"]), s).predicted_peak_gib


def test_the_shipped_factors_are_the_fit_on_the_r16_rows():
    result = fit_cuda_memory.fit(ROWS, "r16")
    assert (result["fit_rows"], result["held_out_rows"]) == (8, 7)
    assert round(result["a_saved_for_backward"], 3) == CUDA_ACTIVATION_FACTOR
    assert round(result["b_logits_per_token"], 3) == CUDA_LOGITS_FACTOR


def test_estimate_is_within_5_percent_median_10_largest_on_the_held_out_rows():
    held_out = [row for row in ROWS if row["r"] == 64]
    errors = sorted(abs(_predicted(row) - row["measured_gib"]) / row["measured_gib"] for row in held_out)
    assert len(errors) == 7
    assert errors[3] <= 0.05 and errors[-1] <= 0.10, errors
    # and the model before the fit (its predictions are in the rows) was not: the test can fail
    before = sorted(abs(row["predicted_gib"] - row["measured_gib"]) / row["measured_gib"] for row in held_out)
    assert before[3] > 0.05 and before[-1] > 0.10


def test_the_cpu_prediction_has_no_cuda_factor():
    row = ROWS[0]
    shape = ModelShape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-8B"])
    s = MemorySettings(r=row["r"], max_seq_length=row["max_seq_length"], device="cpu")
    terms = estimate_memory(shape, s).terms_gib
    gpu = estimate_memory(shape, MemorySettings(r=row["r"], max_seq_length=row["max_seq_length"])).terms_gib
    assert terms["quantized_weights"] == gpu["quantized_weights"]
    assert gpu["activations"] < terms["activations"] and "process_baseline" in terms
