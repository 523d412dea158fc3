"""The critical learning rate's line search inside a real trial (sweeper.trial._child.instruments.critical_lr, an
experimental instrument): it reads the optimizer's next update and the probe rows' losses along it, leaves training
exactly as it was, warns that it is experimental, and stores its figures under ``experimental``, outside the stable
stored attributes."""

from __future__ import annotations

import pytest

from sweeper.testing import tiny_trial_config


@pytest.mark.slow
def test_the_line_search_reads_the_critical_rate_and_leaves_training_bit_for_bit_as_it_was(tiny_model, tmp_path):
    from sweeper.errors import ExperimentalWarning
    from sweeper.trial import Measures, TrialResult, run_trial
    from sweeper.trial._job import StressSettings

    # r 64: the LoRA matrices of the tiny Llama (hidden 64) reach bitsandbytes' 4096 elements, so the paged
    # optimizer's state is 8-bit (blockwise-quantized), the state the search must put back bit for bit.
    config = tiny_trial_config(tiny_model, max_steps=12, learning_rate=2e-3, optim="paged_adamw_8bit", r=64)
    stress = StressSettings(steps=4)
    with pytest.warns(ExperimentalWarning, match="critical_lr: experimental"):
        measures = Measures(stress=stress, experimental=("critical_lr",))
    on = run_trial(config, tmp_path / "on", model_path=str(tiny_model), measures=measures)
    off = run_trial(config, tmp_path / "off", model_path=str(tiny_model), measures=Measures(stress=stress))  # default
    assert on.status == off.status == "complete", (on.reason, off.reason)
    # Weights, optimizer state, random state and modes put back: every trace the same, bit for bit.
    assert on.constant.loss_trace == off.constant.loss_trace
    assert on.constant.grad_norm_trace == off.constant.grad_norm_trace
    assert on.constant.probe_loss_trace == off.constant.probe_loss_trace
    assert on.constant.update_ratio_trace == off.constant.update_ratio_trace
    assert on.stress.stability_margin == off.stress.stability_margin
    critical = on.experimental["critical_lr"]
    assert critical["line_search_skipped"] is None
    # 3 points (steps 2, 7 and 12) x the probe's 2 rows, each a positive multiple of the trial's rate.
    assert sorted({r[0] for r in critical["critical_lr_readings"]}) == [2, 7, 12]
    assert {r[1] for r in critical["critical_lr_readings"]} == {0, 1}
    assert all(r[2] > 0 for r in critical["critical_lr_readings"])
    assert critical["critical_lr_multiple_low"] <= critical["critical_lr_multiple_high"]
    # And on the step's own micro-batch (batch 2, no accumulation: one per step), at each point.
    assert sorted({r[0] for r in critical["critical_lr_step_readings"]}) == [2, 7, 12]
    assert {r[1] for r in critical["critical_lr_step_readings"]} == {0} and critical["critical_lr_step_multiple"] > 0
    assert critical["line_search_forwards"] >= 3 * 3 and critical["line_search_time_s"] > 0
    assert critical["line_search_time_share"] == pytest.approx(
        critical["line_search_time_s"] / on.constant.train_time_s
    )
    assert off.experimental == {} and "experimental" not in off.to_dict()
    # Stored under one attribute, outside the stable stored names, and read back.
    stored = on.to_dict()
    assert (
        not any(k.startswith(("critical_lr", "line_search")) for k in stored)
        and "critical_lr" in stored["experimental"]
    )
    assert TrialResult.from_dict(stored).experimental == on.experimental
