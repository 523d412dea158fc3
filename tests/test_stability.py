"""The instability function on synthetic traces: flat < noisy < spiking < diverging, each term where expected."""

import math
import random

import pytest

from sweeper.stability import (
    DTYPE_MAX,
    activation_pressure,
    compute_instability,
    grad_norm_growth,
    loss_spike,
)


def _trace(kind: str, n: int = 30) -> tuple[list[float], list[float]]:
    rng = random.Random(0)
    if kind == "flat":
        return [2.0] * n, [1.0] * n
    if kind == "noisy":
        return [2.0 + rng.uniform(-0.05, 0.05) for _ in range(n)], [1.0 + rng.uniform(-0.1, 0.1) for _ in range(n)]
    if kind == "spiking":
        loss = [2.0 - 0.01 * t for t in range(n)]
        loss[20] = 3.5
        return loss, [1.0] * 19 + [6.0] + [1.0] * (n - 20)
    if kind == "diverging":
        return [2.0 * 1.1**t for t in range(n)], [1.0 * 1.3**t for t in range(n)]
    raise ValueError(kind)


def _score(kind: str) -> float:
    loss, grad = _trace(kind)
    return compute_instability(loss=loss, grad_norm=grad).instability


def test_flat_trace_scores_zero():
    assert _score("flat") == 0.0


def test_order_flat_noisy_spiking_diverging():
    scores = [_score(k) for k in ("flat", "noisy", "spiking", "diverging")]
    assert scores == sorted(scores) and len(set(scores)) == 4, scores


def test_spike_is_relative_jump_over_recent_median():
    assert loss_spike([2.0, 2.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert loss_spike([3.0, 2.0, 1.0]) == 0.0  # falling loss is calm


def test_grad_norm_growth_counts_doublings():
    assert grad_norm_growth([1, 1, 1, 2, 2, 2, 4, 4, 4]) == pytest.approx(2.0)
    assert grad_norm_growth([4, 4, 4, 1, 1, 1]) == 0.0


def test_skipped_steps_and_nonfinite_entries():
    parts = compute_instability(
        loss=[1.0, None, 1.0, float("nan")],
        grad_norm=[1.0, float("inf"), 1.0, None],
        skipped=[False, True, False, False],
    )
    assert parts.skipped_step_fraction == 0.25
    assert math.isfinite(parts.instability)


@pytest.mark.parametrize(
    ("peak", "dtype", "expected"),
    [
        (1.0, "float16", 0.0),
        (256.0, "float16", 0.5),
        (DTYPE_MAX["float16"], "float16", 1.0),
        (float("inf"), "float16", 1.0),
        (1e6, "bfloat16", 0.0),
        (1e6, "float32", 0.0),
    ],
)
def test_activation_pressure(peak, dtype, expected):
    assert activation_pressure([0.5, peak], dtype) == pytest.approx(expected, abs=1e-3)


def test_unknown_dtype_raises():
    with pytest.raises(ValueError, match="compute_dtype"):
        compute_instability(loss=[1.0], grad_norm=[1.0], compute_dtype="float8")


def test_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, sweeper.stability, sweeper.space._parse; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
