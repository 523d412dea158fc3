"""TrialResult groups its fields into typed parts, and stores them flat: ``to_dict()`` is the contract's dict
(docs/contract.md), the same keys in the same order as when the result was one flat dataclass, and ``from_dict()``
reads it back, and the flat attributes of old studies."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import optuna
import pytest

from sweeper.stability._margin import MARGIN_FIGURES
from sweeper.study._stored import stored_trial
from sweeper.testing import make_study
from sweeper.trial import MemoryReading, Provenance, StressOutcome, TrialResult, TrialStatus
from sweeper.trial._memory_phases import PhasePeakMemory
from sweeper.trial._result import ConstantPhase, DataReading, NanFindings

FIXTURE_DB = Path(__file__).parents[1] / "fixtures" / "study_v010.db"

#: The stored user attributes of a result, in the order sweeper 0.2's flat TrialResult wrote them (the contract); the
#: critical learning rate's 14 left them for ``experimental`` (issue 69: an experimental figure, outside the contract).
STORED_ORDER = (
    "status", "reason", "fail_step", "fail_phase", "peak_memory_gib", "load_peak_memory_gib", "memory_kind",
    "instability", "instability_components", "loss_trace", "grad_norm_trace", "max_activation_trace",
    "skipped_steps", "steps_done", "wall_time_s", "import_time_s", "load_time_s", "train_time_s", "setup_time_s",
    "warm", "model_reused", "tokens_per_s", "quantized_linear_count", "lora_alpha", "effective_batch_size", "device",
    "versions", "nan_cause", "nan_samples", "nan_module", "supervised_tokens_trace", "min_supervised_tokens",
    "longest_sample_tokens", "longest_sample_index", "truncated_sample_fraction", "predicted_peak_gib",
    "probe_steps", "probe_loss_trace", "probe_max_activation_trace", "probe_time_s", "probe_time_share",
    "projected_fail_step", "lr_ceiling", "stability_margin", "margin_capped", "predicted_max_lr",
    "learning_progress", "stress_stop", "stress_steps", "stress_lr_trace", "stress_loss_trace",
    "stress_probe_loss_trace", "stress_time_s", "stress_time_share", "stress_peak_memory_gib", "update_ratio_trace",
    "stability_margin_low", "stability_margin_high", "predicted_max_lr_low", "predicted_max_lr_high",
    "predicted_max_lr_source", "phase_peak_memory_gib", "worst_case_shape", "data_token_share",
    "predicted_max_lr_calibrated", "worst_case_time_s", "cuda_alloc_conf", "peak_allocated_gib",
    "horizon_steps", "p_diverge", "p_diverge_low", "p_diverge_high", "stability_call", "safe_learning_rate",
    "worst_case_rows", "worst_case_supervised_tokens",
)  # fmt: skip


def _full() -> TrialResult:
    """A result with every field set to a value of its own."""
    return TrialResult(
        status=TrialStatus.NAN,
        reason="loss is nan at step 3 (forward)",
        fail_step=3,
        fail_phase="forward",
        memory=MemoryReading(
            peak_memory_gib=1.5,
            load_peak_memory_gib=1.25,
            memory_kind="cpu_peak_rss",
            predicted_peak_gib=1.4,
            stress_peak_memory_gib=1.75,
            phase_peak_memory_gib=PhasePeakMemory(load=1.25, train=1.5, worst_case=1.45, probe=1.3, stress=1.75),
            worst_case_shape=(4, 1320),
            peak_allocated_gib=1.375,
        ),
        constant=ConstantPhase(
            instability=0.25,
            instability_components={"probe_rebound": 0.125},
            loss_trace=[2.0, 1.5, None],
            grad_norm_trace=[1.0, 0.5, None],
            max_activation_trace=[10.0, 11.0],
            skipped_steps=[2],
            steps_done=2,
            train_time_s=3.5,
            tokens_per_s=100.0,
            worst_case_time_s=0.25,
            data_token_share=0.9,
            probe_steps=[0, 2],
            probe_loss_trace=[2.5, 2.25],
            probe_max_activation_trace=[9.0, 9.5],
            probe_time_s=0.5,
            probe_time_share=0.1,
            projected_fail_step=40,
            learning_progress=0.1,
            update_ratio_trace=[0.0, 0.01],
        ),
        stress=StressOutcome(
            lr_ceiling=0.01,
            stability_margin=10.0,
            margin_capped=False,
            predicted_max_lr=0.005,
            stop="diverged",
            steps=4,
            lr_trace=[0.002, 0.004],
            loss_trace=[2.0, None],
            probe_loss_trace=[2.1, 9.0],
            time_s=0.75,
            time_share=0.2,
            stability_margin_low=3.2,
            stability_margin_high=10.5,
            predicted_max_lr_low=1e-3,
            predicted_max_lr_high=5e-3,
            predicted_max_lr_source="uncalibrated: factor from SmolLM2-135M (8 edges, geometric SD 1.51)",
            predicted_max_lr_calibrated=False,
            horizon_steps=400,
            p_diverge=0.12,
            p_diverge_low=0.06,
            p_diverge_high=0.23,
            stability_call="undecided",
            safe_learning_rate=1e-4,
        ),
        nan=NanFindings(cause="precision", samples=[4, 5], module="model.layers.0.mlp"),
        data=DataReading(
            supervised_tokens_trace=[10, 7, 3],
            min_supervised_tokens=3,
            longest_sample_tokens=300,
            longest_sample_index=6,
            truncated_sample_fraction=0.5,
            worst_case_rows=[280],
            worst_case_supervised_tokens=0,
        ),
        provenance=Provenance(
            wall_time_s=9.0,
            cuda_alloc_conf="expandable_segments:True",
            import_time_s=2.0,
            load_time_s=1.0,
            setup_time_s=3.0,
            warm=True,
            model_reused=False,
            quantized_linear_count=14,
            lora_alpha=16.0,
            effective_batch_size=4,
            device="cpu",
            versions={"torch": "2.9"},
        ),
    )


def test_to_dict_has_the_stored_keys_in_the_stored_order():
    assert tuple(TrialResult(status="complete").to_dict()) == STORED_ORDER == TrialResult.stored_names()
    assert tuple(_full().to_dict()) == STORED_ORDER


def test_part_fields_are_stored_under_their_contract_names_and_read_back():
    data = _full().to_dict()
    assert data["status"] == "nan" and type(data["status"]) is str  # the value, not the enum
    assert (data["stress_stop"], data["stress_steps"], data["stress_time_share"]) == ("diverged", 4, 0.2)
    assert (data["nan_cause"], data["nan_samples"], data["nan_module"]) == ("precision", [4, 5], "model.layers.0.mlp")
    assert data["stress_loss_trace"] == [2.0, None] and data["loss_trace"] == [2.0, 1.5, None]
    assert data["stress_peak_memory_gib"] == 1.75 and data["versions"] == {"torch": "2.9"}
    assert all(v is not None for v in data.values())
    back = TrialResult.from_dict(json.loads(json.dumps(data)))
    assert back == _full() and back.status is TrialStatus.NAN
    data["loss_trace"].append(0.5)  # a copy: the result's own lists are untouched
    assert _full().constant.loss_trace == back.constant.loss_trace == [2.0, 1.5, None]


def test_from_dict_ignores_unknown_keys_defaults_missing_ones_and_needs_a_status():
    result = TrialResult.from_dict({"status": "oom", "peak_memory_gib": 3.9, "a_newer_field": 1})
    assert result.status is TrialStatus.OOM and result.memory.peak_memory_gib == 3.9
    assert result.stress == StressOutcome() and result.constant.loss_trace == [] and result.constant.steps_done == 0
    with pytest.raises(TypeError):
        TrialResult.from_dict({"peak_memory_gib": 1.0})
    with pytest.raises(ValueError):
        TrialResult.from_dict({"status": "exploded"})


def test_update_sets_fields_by_stored_name_and_refuses_unknown_ones():
    result = TrialResult(status="complete")
    result.update({"stress_stop": "cap", "device": "cpu", "min_supervised_tokens": 0})
    assert (result.stress.stop, result.provenance.device, result.data.min_supervised_tokens) == ("cap", "cpu", 0)
    with pytest.raises(KeyError, match="stop"):
        result.update({"stop": "cap"})  # the field's name in its part is not a stored name


def _round_trips(study: optuna.Study) -> int:
    """Every measured trial's result, read from its user attributes, gives back those attributes (the instability
    terms are stored flat, outside ``to_dict``; the figures derived from the margin are derived again on reading, at
    the study's horizon: :data:`MARGIN_FIGURES`); returns how many values were compared."""
    compared = 0
    for frozen in study.get_trials():
        result = stored_trial(frozen).result
        attrs = frozen.user_attrs
        data = result.to_dict()
        assert TrialResult.from_dict(data) == result
        for key in STORED_ORDER:
            if key in attrs and key != "instability_components" and key not in MARGIN_FIGURES:
                assert data[key] == attrs[key], (frozen.number, key)
                compared += 1
    return compared


def test_stored_studies_round_trip_through_to_dict(tmp_path):
    """A study sweeper.testing records (every attribute written by record_result), and sweeper 0.1.0's fixture
    (older: fewer attributes, the others take their defaults)."""
    made = make_study(tmp_path)
    assert _round_trips(made) == 6 * (len(STORED_ORDER) - 1 - len(MARGIN_FIGURES))
    shutil.copy(FIXTURE_DB, tmp_path / "old.db")
    storage = f"sqlite:///{tmp_path / 'old.db'}"
    [summary] = optuna.get_all_study_summaries(storage)
    old = optuna.load_study(study_name=summary.study_name, storage=storage)
    assert _round_trips(old) > 6 * 20


def test_the_stress_outcome_is_the_stress_record_with_its_margin_and_share():
    """The worker's ``result.stress`` is one call on the child's record: its margin at the trial's learning rate
    (sweeper.stability.margin_of), its traces and steps under the result's names, its time over the constant
    phase's."""
    from sweeper.stability import margin_of
    from sweeper.trial._child.instruments.stress import StressPhase

    record = StressPhase(after_step=8, steps=11, learning_rate=1e-3, growth=2.0, done=3)
    record.lr, record.loss, record.probe_loss = [2e-3, 4e-3, 8e-3], [2.0, 2.5, None], [2.1, 3.0, 9.0]
    record.stop, record.stop_step, record.time_s = "diverged", 3, 1.5
    outcome = record.outcome(train_time_s=6.0)
    margin = margin_of(1e-3, "diverged", 3, growth=2.0, steps=11)
    assert (outcome.lr_ceiling, outcome.stability_margin) == (margin.lr_ceiling, margin.stability_margin)
    assert (outcome.margin_capped, outcome.predicted_max_lr) == (margin.margin_capped, margin.predicted_max_lr)
    assert outcome.stability_margin == pytest.approx(8.0) and outcome.margin_capped is False
    assert (outcome.stop, outcome.steps, outcome.time_s, outcome.time_share) == ("diverged", 3, 1.5, 0.25)
    assert (outcome.lr_trace, outcome.loss_trace, outcome.probe_loss_trace) == (
        record.lr,
        record.loss,
        record.probe_loss,
    )
    assert record.outcome(train_time_s=None).time_share is None and record.outcome(0.0).time_share is None
    stored = TrialResult(status="complete", stress=outcome).to_dict()
    assert (stored["stress_stop"], stored["stress_steps"], stored["stress_probe_loss_trace"]) == (
        "diverged",
        3,
        [2.1, 3.0, 9.0],
    )


def test_a_confirmation_is_made_of_the_long_runs_result():
    from sweeper.study._confirmation import Confirmation

    full = _full()
    done = Confirmation.of(full, steps=300, artifact_id="a1", predicted_max_lr=5e-3, predicted_to_hold=True)
    assert done == Confirmation(
        steps=300,
        status="nan",
        reason="loss is nan at step 3 (forward)",
        fail_step=3,
        steps_done=2,
        instability=0.25,
        peak_memory_gib=1.5,
        probe_loss_start=2.5,
        probe_loss_end=2.25,
        wall_time_s=9.0,
        artifact_id="a1",
        predicted_max_lr=5e-3,
        predicted_to_hold=True,
        margin_held=None,
    )
    empty = Confirmation.of(TrialResult(status="error"), steps=300)
    assert (empty.probe_loss_start, empty.probe_loss_end, empty.steps_done, empty.label) == (None, None, 0, "error")


def test_the_phase_peaks_are_a_typed_record_stored_as_the_dict_of_the_measured_phases():
    # one declaration of the phases (PhasePeakMemory's fields): the trial process's meter and the report read them
    from sweeper.trial._child.memory import JUDGED_PHASES, MEMORY_PHASES

    assert MEMORY_PHASES == ("load", "train", "worst_case", "probe", "stress") and JUDGED_PHASES == (
        "train",
        "worst_case",
    )
    peaks = PhasePeakMemory.of({"train": 1.5, "load": 1.25, "later_phase": 9.0})  # a newer worker's phase: left out
    assert (peaks.train, peaks.load, peaks.probe) == (1.5, 1.25, None) and dict(peaks) == {"load": 1.25, "train": 1.5}
    result = TrialResult(status="complete", memory=MemoryReading(phase_peak_memory_gib=peaks, worst_case_shape=(2, 64)))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["phase_peak_memory_gib"] == {"load": 1.25, "train": 1.5} and data["worst_case_shape"] == [2, 64]
    back = TrialResult.from_dict(data).memory
    assert back.phase_peak_memory_gib == peaks and back.worst_case_shape == (2, 64)
    assert not TrialResult.from_dict({"status": "complete"}).memory.phase_peak_memory_gib  # an older study's: none
