"""The instability and the divergence rule on synthetic probe traces: a constant probe scores 0, a probe that learns
scores 0, rising after learning scores its rise, a probe that doubles and stays is diverged; the diagnostics are
recorded but not summed."""

import math
import random

import pytest

from sweeper.stability import (
    DIVERGED_RATIO,
    DTYPE_MAX,
    PROBE_COST,
    PROBE_SHARE,
    activation_growth,
    compute_instability,
    divergence,
    grad_norm_growth,
    loss_spike,
    probe_interval_steps,
    probe_rebound,
    projected_fail_step,
    skipped_step_fraction,
)


def test_constant_probe_scores_zero_whatever_the_training_loss_does():
    rng = random.Random(0)
    noisy_loss = [rng.uniform(2.6, 6.6) for _ in range(40)]  # sample-to-sample variety, as at learning rate 1e-9
    noisy_grad = [rng.uniform(1.0, 9.0) for _ in range(40)]
    parts = compute_instability(
        probe_loss=[3.2] * 5,
        probe_max_activation=[40.0] * 5,
        loss=noisy_loss,
        grad_norm=noisy_grad,
        compute_dtype="float16",
    )
    assert parts.instability == 0.0
    assert parts.loss_spike > 0.3  # the old term saw the data's variety; it is kept, not summed


def test_order_learning_wobbling_rebounding_diverging():
    learning = [3.0, 2.5, 2.2, 2.0, 1.9]
    wobbling = [3.0, 2.5, 2.6, 2.4, 2.45]
    rebounding = [3.0, 2.0, 2.4, 3.0, 3.2]
    diverging = [3.0, 6.0, 9.0, 12.0, 20.0]
    scores = [compute_instability(probe_loss=p).instability for p in (learning, wobbling, rebounding, diverging)]
    assert scores[0] == 0.0
    assert scores == sorted(scores) and len(set(scores)) == 4, scores


def test_rebound_is_measured_over_the_best_value_so_far():
    assert probe_rebound([2.0, 1.0, 1.5]) == pytest.approx(0.5)  # rose 50% over the best, though under the start
    assert probe_rebound([2.0, 1.5, 1.0]) == 0.0
    assert probe_rebound([2.0, None]) == pytest.approx(DIVERGED_RATIO - 1)  # non-finite after finite
    assert probe_rebound([]) == 0.0


@pytest.mark.parametrize(
    ("trace", "dtype", "expected"),
    [
        ([10.0, 10.0, 10.0], "float16", 0.0),  # constant: no growth whatever the headroom
        ([1.0, 256.0], "float16", 0.5),  # 8 of fp16's 16 bits of headroom above 1 used
        ([1.0, DTYPE_MAX["float16"]], "float16", 1.0),
        ([1.0, float("inf")], "float16", 1.0),
        ([1.0, 1e6], "float32", 0.0),
        ([100.0, 50.0], "float16", 0.0),  # shrinking activations use no headroom
    ],
)
def test_activation_growth(trace, dtype, expected):
    assert activation_growth(trace, dtype) == pytest.approx(expected, abs=1e-3)


def test_skipped_steps_after_the_scaler_calibration():
    assert skipped_step_fraction([True, True, False, False], 4) == 0.0  # the scaler finding its scale
    assert skipped_step_fraction([True, False, True, False], 4) == 0.25
    assert skipped_step_fraction([], 0) == 0.0


def test_diverged_needs_the_rise_to_stay():
    spike = divergence([0, 10, 20, 30], [2.0, 4.0, 2.1, 2.0], final=True)
    assert spike is None  # back down at the next probe: a spike, scored by the instability, not a divergence
    found = divergence([0, 10, 20], [2.0, 4.0, 5.0], final=False)
    assert found is not None and found.step == 20 and found.first_step == 10
    assert "step 10" in found.reason and "step 20" in found.reason and "5 (2.50x) at step 20" in found.reason
    last = divergence([0, 10, 20], [2.0, 2.0, 3.5], final=True)
    assert last is not None and last.step == 20  # the run ends there
    assert divergence([0, 10, 20], [2.0, 2.0, 3.5], final=False) is None  # not yet: wait for the next probe
    nonfinite = divergence([0, 10, 20], [2.0, None, None], final=False)
    assert nonfinite is not None and "non-finite" in nonfinite.reason and math.isinf(nonfinite.ratio)


def test_projected_fail_step_extrapolates_a_rising_probe():
    assert projected_fail_step([0, 10, 20, 30], [2.0, 1.5, 1.8, 2.16]) is not None
    step = projected_fail_step([0, 10, 20, 30], [2.0, 1.5, 1.8, 2.16])
    assert 30 < step < 200
    assert projected_fail_step([0, 10, 20, 30], [2.0, 1.8, 1.6, 1.5]) is None  # falling: no failure in sight
    assert projected_fail_step([0, 10], [2.0, 3.0]) is None  # too few probes


def test_probe_interval_spends_about_the_target_share():
    assert probe_interval_steps(1) == 4
    assert probe_interval_steps(2) == 3
    assert probe_interval_steps(4) == 2
    assert probe_interval_steps(16) == 1
    assert probe_interval_steps(1, 2) == probe_interval_steps(2)
    for rows in (1, 2, 3, 4, 5, 8, 16, 64):
        share = PROBE_COST / (math.sqrt(rows) * probe_interval_steps(rows))
        assert share <= PROBE_SHARE + 1e-9, (rows, share)


def test_diagnostics_are_recorded_not_summed():
    parts = compute_instability(probe_loss=[2.0, 1.0], loss=[2.0, 2.0, 2.0, 3.0], grad_norm=[1, 1, 1, 2, 2, 2, 4, 4, 4])
    assert parts.loss_spike == pytest.approx(0.5) and parts.grad_norm_growth == pytest.approx(2.0)
    assert parts.instability == 0.0


def test_spike_and_growth_diagnostics():
    assert loss_spike([2.0, 2.0, 2.0, 3.0]) == pytest.approx(0.5)
    assert loss_spike([3.0, 2.0, 1.0]) == 0.0
    assert grad_norm_growth([1, 1, 1, 2, 2, 2, 4, 4, 4]) == pytest.approx(2.0)
    assert grad_norm_growth([4, 4, 4, 1, 1, 1]) == 0.0


def test_unknown_dtype_raises():
    with pytest.raises(ValueError, match="compute_dtype"):
        compute_instability(probe_loss=[1.0], compute_dtype="float8")


def test_module_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, sweeper.stability, sweeper.space._parse; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
