"""The stress phase (:mod:`sweeper.stability`, "stability margin"): after a trial's constant phase, an LR range test
on the same adapter and optimizer. Real trials on the tiny Llama: the constant phase is the same run with and without
it, its margin is read off a real divergence, a run that learns nothing reaches the cap, its weights never reach the
next trial of a warm process, and a warm process runs each job's own stress and probe settings."""

import pytest

from sweeper.stability import STRESS_GROWTH, STRESS_STEPS
from sweeper.stability._margin import STRESS_CAP
from sweeper.testing import tiny_trial_config
from sweeper.trial import Measures, TrialProcess, TrialProgress, run_trial
from sweeper.trial._job import ProbeSettings, StressSettings

pytestmark = pytest.mark.slow


def test_the_stress_phase_measures_a_margin_without_changing_the_constant_phase(tiny_model, tmp_path):
    config = tiny_trial_config(tiny_model, max_steps=8, learning_rate=1e-3)
    plain = run_trial(config, tmp_path / "plain", model_path=str(tiny_model), measures=Measures(stress=None))
    reports: list[TrialProgress] = []
    stressed = run_trial(config, tmp_path / "stressed", model_path=str(tiny_model), on_progress=reports.append)
    assert plain.status == stressed.status == "complete", (plain.reason, stressed.reason)
    # Its progress came from the trial process as it ran: loading, the constant steps of 8, the stress steps of 11
    # (each phase change is sent; steps within half a second of the last report may be skipped).
    phases = [r.phase for r in reports]
    assert phases[0] == "load" and "train" in phases and phases[-1] == "stress", phases
    assert phases.index("train") < phases.index("stress")
    train = [r for r in reports if r.phase == "train"]
    assert all(r.of == 8 for r in train) and [r.step for r in train] == sorted(r.step for r in train)
    assert all(r.of == STRESS_STEPS for r in reports if r.phase == "stress")
    # Training's start is sent at step 0 (no loss yet), so that a slow first step does not read as loading.
    assert train[0].step == 0 and train[0].loss is None, train[0]
    assert all(r.peak_memory_gib > 0 for r in reports) and all(r.loss is not None for r in train[1:])
    # The constant phase is the same run, bit for bit: the stress steps enter none of its traces.
    assert stressed.constant.loss_trace == plain.constant.loss_trace and len(stressed.constant.loss_trace) == 8
    assert (
        stressed.constant.probe_loss_trace == plain.constant.probe_loss_trace
        and stressed.constant.probe_steps == plain.constant.probe_steps
    )
    assert stressed.constant.instability == plain.constant.instability and stressed.constant.steps_done == 8
    assert plain.stress.stability_margin is None and plain.stress.stop is None and plain.stress.steps is None
    # The stress phase: rates growing 1.8x a step from the trial's, one probe after each, stopped at the edge.
    n = stressed.stress.steps
    assert 1 <= n <= STRESS_STEPS and len(stressed.stress.probe_loss_trace) == len(stressed.stress.lr_trace) == n
    assert stressed.stress.lr_trace == pytest.approx([1e-3 * STRESS_GROWTH**j for j in range(1, n + 1)])
    assert stressed.stress.stop in ("diverged", "nan", "cap")
    if stressed.stress.stop == "cap":
        assert stressed.stress.margin_capped and stressed.stress.stability_margin == pytest.approx(STRESS_CAP)
    else:
        assert stressed.stress.margin_capped is False and stressed.stress.lr_ceiling in stressed.stress.lr_trace
        assert stressed.stress.stability_margin == pytest.approx(stressed.stress.lr_ceiling / 1e-3)
        assert stressed.stress.predicted_max_lr is not None and stressed.stress.predicted_max_lr > 0
    assert stressed.stress.time_s > 0 and stressed.stress.time_share == pytest.approx(
        stressed.stress.time_s / stressed.constant.train_time_s
    )
    # The trial's peak is its training steps' and worst-case step's; the stress phase's is kept apart.
    phases = stressed.memory.phase_peak_memory_gib
    assert stressed.memory.peak_memory_gib == max(phases["train"], phases["worst_case"])
    assert stressed.memory.stress_peak_memory_gib == phases["stress"] > 0
    assert stressed.constant.learning_progress == pytest.approx(
        (stressed.constant.probe_loss_trace[0] - stressed.constant.probe_loss_trace[-1])
        / stressed.constant.probe_loss_trace[0]
    )


def test_a_run_that_learns_nothing_reaches_the_cap_and_says_it_barely_learns(tiny_model, tmp_path):
    config = tiny_trial_config(tiny_model, max_steps=4, learning_rate=1e-9)
    result = run_trial(config, tmp_path / "t", model_path=str(tiny_model))
    assert result.status == "complete", result.reason
    assert result.stress.stop == "cap" and result.stress.margin_capped is True and result.stress.lr_ceiling is None
    assert result.stress.stability_margin == pytest.approx(STRESS_CAP) and result.stress.steps == STRESS_STEPS
    assert abs(result.constant.learning_progress) < 1e-4  # the probe loss did not move


def test_a_diverging_stress_phase_leaves_nothing_for_the_next_warm_trial(tiny_model, tmp_path):
    """A stress phase at up to 643x a high rate (the tiny random model's probe cannot rise to 1.5x its near-uniform
    start, so it may reach the cap, but its weights moved far), then the next trial in the same process: it trains as
    in a fresh process (its base model reused), so neither the stressed adapter nor its optimizer state reached it."""
    path = str(tiny_model)
    wild = tiny_trial_config(tiny_model, max_steps=4, learning_rate=2e-2)
    calm = tiny_trial_config(tiny_model, max_steps=4, learning_rate=1e-3)
    cold = run_trial(calm, tmp_path / "cold", model_path=path)
    process = TrialProcess()
    try:
        first = process.run(wild, tmp_path / "w1", model_path=path)
        second = process.run(calm, tmp_path / "w2", model_path=path)
    finally:
        process.close()
    assert first.status == "complete" and first.stress.steps >= 3, (first.reason, first.stress.stop)
    moved = [x for x in first.stress.probe_loss_trace if x is not None]
    assert (
        not moved or abs(moved[-1] - first.constant.probe_loss_trace[-1]) > 0.01
    )  # the stress steps changed the adapter
    assert second.provenance.warm is True and second.provenance.model_reused is True
    assert (
        second.constant.loss_trace == cold.constant.loss_trace
        and second.constant.probe_loss_trace == cold.constant.probe_loss_trace
    )
    assert second.stress.probe_loss_trace == cold.stress.probe_loss_trace
    assert second.stress.stability_margin == cold.stress.stability_margin


def test_a_warm_process_runs_each_job_with_its_own_stress_and_probe_settings(tiny_model, tmp_path):
    """One warm process, three jobs of a run that learns nothing (so each stress phase reaches its cap): a short stress
    phase growing 3x a step; none, with a probe at every step; then the defaults. Each result is its own job's: the
    settings travel in the job, not in the process's environment, and none sticks to the process."""
    path = str(tiny_model)
    config = tiny_trial_config(tiny_model, max_steps=4, learning_rate=1e-9)
    process = TrialProcess()
    try:
        short_stress = Measures(stress=StressSettings(steps=3, growth=3.0))
        short = process.run(config, tmp_path / "short", model_path=path, measures=short_stress)
        pid = process.pid
        every_step = ProbeSettings(interval_steps=1)
        off = process.run(config, tmp_path / "off", model_path=path, measures=Measures(stress=None, probe=every_step))
        default = process.run(config, tmp_path / "default", model_path=path)
        assert process.pid == pid  # one process served the three
    finally:
        process.close()
    assert short.status == off.status == default.status == "complete", (short.reason, off.reason, default.reason)
    assert off.provenance.warm is True and default.provenance.warm is True
    assert short.stress.stop == "cap" and short.stress.steps == 3 and short.stress.margin_capped is True
    assert short.stress.lr_trace == pytest.approx([1e-9 * 3.0**j for j in range(1, 4)])
    assert short.stress.stability_margin == pytest.approx(27.0)
    assert off.stress.stop is None and off.stress.steps is None and off.stress.stability_margin is None
    assert off.stress.lr_trace == [] and off.constant.probe_steps == [0, 1, 2, 3, 4]
    assert default.stress.stop == "cap" and default.stress.steps == STRESS_STEPS
    assert default.stress.lr_trace == pytest.approx([1e-9 * STRESS_GROWTH**j for j in range(1, STRESS_STEPS + 1)])
    assert default.stress.stability_margin == pytest.approx(STRESS_CAP)
    assert (
        default.constant.probe_steps == short.constant.probe_steps != off.constant.probe_steps
    )  # the batch's interval again
    # The constant phase is the same run whatever the stress phase and probe after or around it.
    assert (
        short.constant.loss_trace == off.constant.loss_trace == default.constant.loss_trace
        and len(default.constant.loss_trace) == 4
    )
