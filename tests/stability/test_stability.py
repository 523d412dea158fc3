"""The instability and the divergence rule on synthetic probe traces: a constant probe scores 0, a probe that learns
scores 0, rising after learning scores its rise, a probe that doubles and stays is diverged; the diagnostics are
recorded but not summed."""

import math
import random

import pytest

from sweeper.stability import DTYPE_MAX, compute_instability, divergence, probe_interval_steps, projected_fail_step
from sweeper.stability._instability import (
    DIVERGED_RATIO,
    PROBE_COST,
    PROBE_SHARE,
    activation_growth,
    grad_norm_growth,
    loss_spike,
    probe_rebound,
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


# --- the stability margin -----------------------------------------------------------------------------------------


def test_a_margin_is_the_ceiling_over_the_rate_and_a_capped_one_is_a_lower_bound():
    from sweeper.stability import STRESS_GROWTH, margin_of
    from sweeper.stability._margin import STRESS_CAP

    found = margin_of(2e-4, "diverged", 5)
    assert found.lr_ceiling == pytest.approx(2e-4 * STRESS_GROWTH**5)
    assert found.stability_margin == pytest.approx(STRESS_GROWTH**5) and found.margin_capped is False
    assert margin_of(2e-4, "nan", 2).stability_margin == pytest.approx(STRESS_GROWTH**2)
    capped = margin_of(2e-4, "cap", None)
    assert capped.lr_ceiling is None and capped.margin_capped is True
    assert capped.stability_margin == pytest.approx(STRESS_CAP) and capped.predicted_max_lr > 0
    for unknown in (margin_of(2e-4, "oom", None), margin_of(2e-4, None, None), margin_of(2e-4, "error", 3)):
        assert unknown.stability_margin is None and unknown.predicted_max_lr is None
    with pytest.raises(ValueError, match="stress stop"):
        margin_of(2e-4, "exploded", 1)


def test_edge_proximity_ranks_a_wider_margin_as_more_stable():
    from sweeper.stability import edge_proximity

    assert edge_proximity(50.0) < edge_proximity(5.0) < 1
    assert edge_proximity(None) is None and edge_proximity(0.0) is None and edge_proximity(math.inf) is None


def test_learning_progress_is_the_probes_relative_drop():
    from sweeper.stability import learning_progress

    assert learning_progress([4.0, 3.5, 3.0]) == pytest.approx(0.25)
    assert learning_progress([4.0, 4.0]) == 0.0
    assert learning_progress([4.0, 5.0]) == pytest.approx(-0.25)  # it got worse
    assert learning_progress([4.0]) is None and learning_progress([4.0, None]) is None and learning_progress([]) is None


def test_a_run_that_barely_learns_is_named_so_relative_to_the_best():
    from sweeper.stability import barely_learns

    assert barely_learns(0.013, 0.45) and not barely_learns(0.09, 0.45)  # a tenth of the best is the line
    assert barely_learns(0.0, 0.0) and barely_learns(-0.1, 0.3)  # no progress at all is always barely
    assert not barely_learns(None, 0.45) and not barely_learns(0.2, None)


def test_a_margin_is_shown_with_its_unit_and_its_bound():
    from sweeper.notation import format_margin

    assert [format_margin(v) for v in (3.4, 12.2, 357.0, None)] == ["3.4x", "12x", "357x", "-"]
    assert format_margin(642.7, True) == ">=643x"


def test_every_margin_and_prediction_carries_its_interval():
    from sweeper.notation import format_margin_range, format_rate_range
    from sweeper.stability import STRESS_GROWTH, margin_of
    from sweeper.stability._chance import DIVERGENCE_MODEL
    from sweeper.stability._margin import MARGIN_SEED_SD_STEPS

    found = margin_of(2e-4, "diverged", 5)
    margin = STRESS_GROWTH**5
    noise = STRESS_GROWTH ** (1.96 * MARGIN_SEED_SD_STEPS)  # the measured seed noise, 95% each side
    assert (found.stability_margin_low, found.stability_margin_high) == pytest.approx((margin / noise, margin * noise))
    assert 1.5 < noise < 1.7  # narrower than the one whole ladder step (1.8x) it replaced
    # predicted_max_lr is the chance's edge (P = 50% at the horizon), inside its interval
    assert found.predicted_max_lr_low < found.predicted_max_lr < found.predicted_max_lr_high
    assert found.predicted_max_lr_source == DIVERGENCE_MODEL.source and found.horizon_steps == 400
    capped = margin_of(2e-4, "cap", None)  # a lower bound: no upper end
    assert capped.stability_margin_high is None and capped.predicted_max_lr_high is None
    assert capped.stability_margin_low == pytest.approx(capped.stability_margin / noise)
    assert format_margin_range(5.832, False, 3.24, 10.4976) == "5.8x (3.2-10x)"
    assert format_margin_range(642.7, True, 357.0, None) == ">=643x (>=357x)"
    assert format_margin_range(None, None, None, None) == "-" and format_margin_range(34.0, False, None, None) == "34x"
    assert format_rate_range(3.36e-3, 1.5e-3, 7.5e-3) == "0.00336 (0.0015-0.0075)"
    assert format_rate_range(None, None, None) == "-"


def test_margins_within_each_others_noise_are_tied_and_a_tenfold_step_is_not():
    from sweeper.stability import margin_of
    from sweeper.study._objectives import EDGE_PROXIMITY, PEAK_MEMORY, dominates_beyond_noise
    from sweeper.trial import StressOutcome, TrialResult

    def point(peak: float, stop_step: int, learning_rate: float = 2e-4) -> list[tuple[float, float]]:
        m = margin_of(learning_rate, "diverged", stop_step)
        result = TrialResult(
            status="complete",
            stress=StressOutcome(
                stability_margin=m.stability_margin,
                stability_margin_low=m.stability_margin_low,
                stability_margin_high=m.stability_margin_high,
            ),
        )
        objectives = (PEAK_MEMORY, EDGE_PROXIMITY)
        return [o.signed_interval(result, v) for o, v in zip(objectives, (peak, 1 / m.stability_margin))]

    # One ladder step apart, more memory for the wider margin: a tie on stability, so the lighter one dominates.
    assert dominates_beyond_noise(point(1.0, 4), point(2.0, 5))
    assert not dominates_beyond_noise(point(2.0, 5), point(1.0, 4))
    # Same memory, one ladder step apart: tied both ways.
    assert not dominates_beyond_noise(point(1.0, 5), point(1.0, 4))
    assert not dominates_beyond_noise(point(1.0, 4), point(1.0, 5))
    # Two ladder steps apart (intervals meeting at an end): beyond the noise of a difference of two readings (sqrt(2)
    # times one reading's, 1.4 steps), so the wider margin counts even at more memory.
    assert dominates_beyond_noise(point(1.0, 6), point(1.0, 4))
    assert not dominates_beyond_noise(point(1.0, 4), point(2.0, 6)) and not dominates_beyond_noise(
        point(2.0, 6), point(1.0, 4)
    )
    # Four ladder steps apart (10.5x, about a tenfold change of the learning rate): beyond the noise.
    assert dominates_beyond_noise(point(1.0, 8), point(1.0, 4))
    assert not dominates_beyond_noise(point(1.0, 4), point(1.0, 8))
