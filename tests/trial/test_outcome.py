"""The trial process's exception ladder (:func:`sweeper.trial._child.outcome.outcome_of`) and its measurements
(:mod:`sweeper.trial._child.measurements`), as pure functions: no torch, no trial process, milliseconds."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields

import pytest

from sweeper.stability import Divergence
from sweeper.testing import tiny_trial_config
from sweeper.trial._child.checks import QuantizationCheckError
from sweeper.trial._child.diagnosis import NanDiagnosis
from sweeper.trial._child.measurements import Measurements, copy_onto
from sweeper.trial._child.outcome import Outcome, outcome_of
from sweeper.trial._child.record import DivergedError, NonFiniteError, TrainingRecord
from sweeper.trial._result import Provenance, TrialResult
from sweeper.trial._status import TrialStatus

CONFIG = tiny_trial_config("unused", per_device_train_batch_size=4, max_seq_length=256, memory_limit_gib=1.5)


def _record(phase: str = "load", step: int = 0) -> TrainingRecord:
    record = TrainingRecord()
    record.fail_phase, record.step = phase, step  # type: ignore[assignment]
    return record


def test_a_finished_run_is_complete():
    out = outcome_of(None, _record("optimizer", 3), CONFIG)
    assert out == Outcome(status=TrialStatus.COMPLETE, reason="3 steps finished")


def test_a_nan_names_the_step_being_run_and_its_phase_and_appends_the_diagnosis():
    exc = NonFiniteError("loss", float("nan"), "forward")
    out = outcome_of(exc, _record("forward", 2), CONFIG)
    assert (out.status, out.fail_phase, out.fail_step) == (TrialStatus.NAN, "forward", 3)
    assert out.reason == "loss is nan at step 3 (forward)" and out.nan_cause is None and out.nan_samples == []
    exc.diagnosis = NanDiagnosis(cause="precision", samples=[4, 5], reason="precision: it overflowed", module="m.o")
    out = outcome_of(exc, _record("forward", 2), CONFIG)
    assert out.reason == "loss is nan at step 3 (forward); precision: it overflowed"
    assert (out.nan_cause, out.nan_samples, out.nan_module) == ("precision", [4, 5], "m.o")
    bad_id = outcome_of(NonFiniteError("input id", 600, "forward"), _record("forward", 0), CONFIG)
    assert bad_id.reason == "input id 600 has no embedding row at step 1 (forward)"


def test_a_divergence_is_diverged_at_its_step_without_a_phase():
    found = Divergence(step=12, first_step=8, ratio=3.5, reason="probe loss rose 3.5x")
    out = outcome_of(DivergedError(found), _record("optimizer", 12), CONFIG)
    assert out == Outcome(status=TrialStatus.DIVERGED, reason="probe loss rose 3.5x", fail_step=12)


@pytest.mark.parametrize(
    ("message", "what"),
    [("target_modules ['x'] matched no module", "LoRA target check"), ("no 4-bit layer", "4-bit quantization check")],
)
def test_a_failed_check_is_an_error_while_loading(message, what):
    out = outcome_of(QuantizationCheckError(message), _record("forward", 5), CONFIG)
    assert out == Outcome(status=TrialStatus.ERROR, reason=f"{what} failed: {message}", fail_phase="load", fail_step=0)


def test_an_allocation_failure_during_a_step_is_an_oom_naming_the_steps_shape():
    import torch

    # The step's own shape: its micro-batch padded to its longest row, not max_seq_length.
    record = _record("backward", 1)
    record.step_batches = [{"input_ids": torch.zeros((4, 190), dtype=torch.long)}]
    out = outcome_of(MemoryError(), record, CONFIG)
    assert (out.status, out.fail_phase, out.fail_step) == (TrialStatus.OOM, "backward", 2)
    assert out.reason == (
        "out of memory at step 2 (backward) under memory_limit_gib=1.5 on a step of 4 x 190 tokens "
        "(rows; per_device_train_batch_size=4, max_seq_length=256)"
    )
    # The worst-case step: the data's longest rows, after step 1.
    from sweeper.trial._child.instruments.worst_case import WorstCase

    record = _record("forward", 1)
    worst = WorstCase()
    worst.record, worst.batch = record, {"input_ids": torch.zeros((4, 256), dtype=torch.long)}
    record.running = worst  # as the instrument leaves it after a failure inside it (it owns its failure)
    out = outcome_of(MemoryError(), record, CONFIG)
    assert out.reason == (
        "out of memory at the worst-case step, after step 1 (forward) under memory_limit_gib=1.5 on a step of "
        "4 x 256 tokens (the data's 4 longest rows; per_device_train_batch_size=4, max_seq_length=256)"
    )


def test_an_oom_in_the_cause_chain_or_in_the_load_report_is_an_oom_while_loading():
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError as inner:
            raise ValueError("conversion failed") from inner
    except ValueError as exc:
        chained = exc
    out = outcome_of(chained, _record(), CONFIG)
    assert out == Outcome(
        status=TrialStatus.OOM, reason="out of memory while loading under memory_limit_gib=1.5", fail_phase="load",
        fail_step=0,
    )  # fmt: skip
    bare = RuntimeError("Error(s) in loading weights")
    assert outcome_of(bare, _record(), CONFIG).status is TrialStatus.ERROR
    assert outcome_of(bare, _record(), CONFIG, load_oom=True).status is TrialStatus.OOM
    # The load report counts only while loading: after it, the exception itself decides.
    assert outcome_of(bare, _record("forward", 0), CONFIG, load_oom=True).status is TrialStatus.ERROR


def test_anything_else_is_an_error_with_its_type_and_the_first_line_of_its_message():
    out = outcome_of(ValueError("bad value\nmore detail"), _record("optimizer", 4), CONFIG)
    assert out == Outcome(
        status=TrialStatus.ERROR, reason="ValueError at step 5 (optimizer): bad value", fail_phase="optimizer",
        fail_step=5,
    )  # fmt: skip
    assert outcome_of(KeyboardInterrupt(), _record(), CONFIG).reason == "KeyboardInterrupt while loading"
    assert len(outcome_of(ValueError("x" * 1000), _record(), CONFIG).reason) == len("ValueError while loading: ") + 300


def test_onednn_failing_to_create_a_primitive_is_an_oom_only_under_the_cpu_cap():
    # Under RLIMIT_DATA oneDNN reports an allocation it could not make only as this (issue 53: the edge-of-the-cap
    # trial, 1 run in 4); elsewhere (CUDA, no cap) it stays an error with its message.
    exc = RuntimeError("could not create a primitive")
    capped = outcome_of(exc, _record("backward", 2), CONFIG, cpu_capped=True)
    assert (capped.status, capped.fail_phase, capped.fail_step) == (TrialStatus.OOM, "backward", 3)
    assert capped.reason.startswith("out of memory at step 3 (backward) under memory_limit_gib=1.5 (oneDNN: ")
    uncapped = outcome_of(exc, _record("backward", 2), CONFIG)
    assert uncapped.status == TrialStatus.ERROR and "could not create a primitive" in uncapped.reason
    # A plain allocation failure under the cap is named as before, without oneDNN's note.
    assert "oneDNN" not in outcome_of(MemoryError(), _record("backward", 2), CONFIG, cpu_capped=True).reason


def test_a_step_whose_resident_set_passed_the_cpu_cap_is_an_oom_at_that_step_with_its_peak():
    from sweeper.trial._child.memory import CapExceeded, PhasePeaks, peak_memory_gib

    # This process's own resident set, read as a trial's: the judged phases (a training step, the worst-case step)
    # are held to the cap; the probe, the stress phase and CUDA (whose allocator cap binds its own reading) are not.
    held = peak_memory_gib("cpu")
    peaks = PhasePeaks("cpu", cap_gib=held / 2)
    for phase in ("train", "worst_case"):
        peaks.enter(phase)
        with pytest.raises(CapExceeded) as raised:
            peaks.check_cap()
        assert raised.value.cap_gib == held / 2 and raised.value.peak_gib > held / 2
    for phase in ("probe", "stress"):
        peaks.enter(phase)
        peaks.check_cap()
    roomy = PhasePeaks("cpu", cap_gib=held * 4)
    roomy.enter("train")
    roomy.check_cap()
    cuda = PhasePeaks("cuda", cap_gib=held / 2)
    assert cuda.cap_gib is None
    out = outcome_of(CapExceeded(1.62, 1.5), _record("optimizer", 1), CONFIG, cpu_capped=True)
    assert (out.status, out.fail_phase, out.fail_step) == (TrialStatus.OOM, "optimizer", 2)
    assert out.reason == (
        "out of memory at step 2 (optimizer) under memory_limit_gib=1.5 (the resident set peaked at 1.62 GiB, over "
        "the 1.5 GiB cap: on the CPU the cap binds the resident set at each step's end, as a card would)"
    )


def test_outcome_and_measurements_fields_are_result_fields_copied_by_name_when_known():
    names = set(TrialResult.stored_names())
    assert {f.name for f in fields(Outcome)} <= names
    assert {f.name for f in fields(Measurements)} - names == {"train_start"}
    result = TrialResult(status=TrialStatus.COMPLETE, provenance=Provenance(device="cpu"))
    measured = Measurements(warm=True, model_reused=False, load_time_s=1.5, train_start=123.0)
    copy_onto(result, measured)
    assert (
        result.provenance.warm,
        result.provenance.model_reused,
        result.provenance.load_time_s,
        result.provenance.device,
    ) == (True, False, 1.5, "cpu")
    measured.device = "cuda:0 (H200)"
    copy_onto(result, measured)
    assert result.provenance.device == "cuda:0 (H200)" and result.provenance.quantized_linear_count is None


def test_seen_lengths_count_the_failing_step_and_the_truncated_share():
    record = _record("forward", 2)
    record.supervised, record.step_supervised, record.step_batches = [10, 7], 0, [{}]
    record.seen = {1, 2, 3, 9}  # 9: not a sample of the data (not counted)
    measured = Measurements()
    measured.add_seen_lengths(record, {1: 100, 2: 300, 3: 300}, max_seq_length=256)
    assert measured.supervised_tokens_trace == [10, 7, 0] and measured.min_supervised_tokens == 0
    assert (measured.longest_sample_tokens, measured.longest_sample_index) == (300, 3)
    assert measured.truncated_sample_fraction == pytest.approx(2 / 3)


def test_the_ladder_imports_no_torch():
    code = (
        "import sys, json; import sweeper.trial._child.outcome, sweeper.trial._child.measurements; "
        "print(json.dumps([m for m in ('torch', 'transformers', 'sweeper.trial._launch') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
