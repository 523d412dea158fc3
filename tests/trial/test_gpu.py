"""The CUDA path, on a real GPU: the memory cap, the peak that decides OOM, fp16 loss-scaler skips, and a warm trial
process's own peak. Skipped where no CUDA device is visible (``conftest.py``); run by ``benchmarks/gpu/gpu_check.sh``.

Real trials of the tiny Llama (``sweeper.testing.build_tiny_model``) on ``cuda:0``:
``set_per_process_memory_fraction`` turns a real allocation past ``memory_limit_gib`` into ``torch.OutOfMemoryError``,
and the peak is ``max_memory_reserved``.
"""

import pytest

from sweeper.space import DatasetSpec, TrialConfig
from sweeper.testing import tiny_trial_config
from sweeper.trial import TrialProcess, run_trial

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _config(model, **kw) -> TrialConfig:
    return tiny_trial_config(
        model,
        **{
            **dict(
                max_steps=4,
                learning_rate=1e-3,
                memory_limit_gib=8.0,
                trial_timeout_s=300.0,
                dataset=DatasetSpec(max_samples=64),
            ),
            **kw,
        },
    )


def test_the_peak_is_max_memory_reserved_on_the_card(tiny_model, tmp_path):
    result = run_trial(_config(tiny_model), tmp_path, model_path=str(tiny_model))
    assert result.status == "complete", result.reason
    assert result.provenance.device.startswith("cuda") and result.memory.memory_kind == "cuda_max_reserved"
    assert 0 < result.memory.peak_memory_gib < 1.0  # the tiny model: megabytes, not the CPU process's resident set
    assert result.provenance.versions["cuda"]


def test_the_cuda_cap_turns_a_real_allocation_into_oom(tiny_model, tmp_path):
    # Logits alone are 64 x 2048 x 512 x 4 bytes = 0.25 GiB in fp32: far past a 0.1 GiB cap.
    big = _config(tiny_model, per_device_train_batch_size=64, max_seq_length=2048, memory_limit_gib=0.1)
    result = run_trial(big, tmp_path, model_path=str(tiny_model))
    assert result.status == "oom", result.reason
    assert result.fail_phase in ("forward", "backward", "optimizer") and result.fail_step == 1
    assert result.memory.memory_kind == "cuda_max_reserved" and result.memory.peak_memory_gib <= 0.1 + 0.01


def test_fp16_steps_the_scaler_skips_are_counted_not_nan(tiny_model, tmp_path):
    # A step the fp16 loss scaler skips (its gradients overflowed) is counted, not taken for a NaN: a complete trial's
    # skipped steps are exactly its steps without a finite gradient norm. This test assumed until 2026-12-04 that
    # the scaler's first scale (65536) always overflows; on an H200 it overflowed nothing at the tiny model's
    # gradients (norm ~0.3) and no step was skipped (benchmarks/gpu/results/gpu-2026-12-04): both outcomes pass now.
    result = run_trial(
        _config(tiny_model, bnb_4bit_compute_dtype="float16", max_steps=24, learning_rate=1e-4),
        tmp_path,
        model_path=str(tiny_model),
    )
    assert result.status == "complete", result.reason
    norms = result.constant.grad_norm_trace
    assert len(norms) == 24
    assert result.constant.skipped_steps == [step for step, norm in enumerate(norms, start=1) if norm is None]
    assert "skipped_step_fraction" in result.constant.instability_components


def test_a_warm_process_resets_its_peak_between_trials(tiny_model, tmp_path):
    small = _config(tiny_model)
    large = _config(tiny_model, per_device_train_batch_size=32, max_seq_length=512)
    cold_small = run_trial(small, tmp_path / "cold", model_path=str(tiny_model))
    process = TrialProcess()
    try:
        first = process.run(large, tmp_path / "large", model_path=str(tiny_model))
        warm_small = process.run(small, tmp_path / "small", model_path=str(tiny_model))
    finally:
        process.close()
    assert first.status == warm_small.status == cold_small.status == "complete"
    assert warm_small.provenance.warm is True and warm_small.provenance.model_reused is True
    assert (
        first.memory.peak_memory_gib > warm_small.memory.peak_memory_gib + 0.05
    )  # the large trial's peak did not carry over
    assert abs(warm_small.memory.peak_memory_gib - cold_small.memory.peak_memory_gib) <= 0.05
    assert warm_small.constant.loss_trace == pytest.approx(cold_small.constant.loss_trace, abs=1e-6)


def test_expandable_segments_is_the_trials_own_and_recorded(tiny_model, tmp_path, monkeypatch):
    # issue 57: the space's expandable_segments decides the trial's allocator, the environment's other options kept,
    # and the trial records what it ran under; a warm process switching it keeps no model from the other value
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,garbage_collection_threshold:0.9")
    off = run_trial(_config(tiny_model), tmp_path / "off", model_path=str(tiny_model))
    assert off.status == "complete", off.reason
    assert off.provenance.cuda_alloc_conf == "garbage_collection_threshold:0.9"
    process = TrialProcess()
    try:
        first = process.run(_config(tiny_model, expandable_segments=True), tmp_path / "on", model_path=str(tiny_model))
        second = process.run(_config(tiny_model), tmp_path / "off2", model_path=str(tiny_model))
    finally:
        process.close()
    assert first.status == second.status == "complete", (first.reason, second.reason)
    assert first.provenance.cuda_alloc_conf == "garbage_collection_threshold:0.9,expandable_segments:True"
    assert second.provenance.cuda_alloc_conf == "garbage_collection_threshold:0.9"
    assert second.provenance.warm and not second.provenance.model_reused
