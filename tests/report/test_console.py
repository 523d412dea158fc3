"""The terminal text of ``sweep run``, ``sweep report``, ``sweep trial`` and ``sweep doctor`` on hand-made inputs: a
trial line per status, a trace, the front table (from real Optuna trials read through ``stored_trial``), the status
counts and the data audit's lines. Pure formatting: nothing runs."""

from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from sweeper.audit import AuditReport, NanRisk
from sweeper.audit._nan import NanStep
from sweeper.audit._report import Finding
from sweeper.report import format_audit, format_data_warnings, format_instability, format_params
from sweeper.report._console import status_label
from sweeper.report._data_text import format_counts, format_data_nan_summary
from sweeper.report._front_text import format_front
from sweeper.report._trial_text import format_trace, format_trial_line
from sweeper.space import TrialConfig
from sweeper.study import snapshot
from sweeper.study._stored import stored_trial
from sweeper.trial import MemoryReading, Provenance, StressOutcome, TrialResult
from sweeper.trial._result import ConstantPhase, NanFindings

DOCTOR = "sweep doctor space.yaml"


def test_params_use_short_names_yes_no_and_short_floats():
    params = {
        "r": 4096,
        "lora_alpha_ratio": 2.0,
        "bnb_4bit_compute_dtype": "bfloat16",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_quant_type": "nf4",
        "per_device_train_batch_size": 2,
        "max_seq_length": 512,
        "learning_rate": 0.0002,
        "gradient_accumulation_steps": 4,
        "gradient_checkpointing": False,
        "lora_dropout": 0.123456,
        "weight_decay": 1e-5,
        "max_grad_norm": 3e6,
    }
    assert format_params(params) == (
        "r=4096 alpha/r=2 compute=bfloat16 dq=yes quant=nf4 batch=2 seq=512 lr=0.0002 ga=4 "
        "gradient_checkpointing=no lora_dropout=0.123 weight_decay=1e-05 max_grad_norm=3e+06"
    )
    assert format_params({"max_seq_length": 64, "r": 8}) == "seq=64 r=8"  # the given order, not the table's
    assert format_params({}) == ""


def test_status_label_names_the_nan_cause_only_for_nan():
    assert status_label("nan", "precision") == "nan/precision"
    assert status_label("nan", "data") == "nan/data"
    assert status_label("nan", None) == "nan"
    assert status_label("oom", "data") == "oom"
    assert status_label("complete", None) == "complete"


def test_complete_trial_line_has_progress_values_and_no_reason():
    result = TrialResult(
        status="complete",
        reason="finished 30 steps",
        memory=MemoryReading(peak_memory_gib=3.14159),
        constant=ConstantPhase(instability=0.12345),
        provenance=Provenance(wall_time_s=42.0),
        stress=StressOutcome(stability_margin=34.0),
    )
    line = format_trial_line(3, {"r": 16, "lora_alpha_ratio": 2.0, "bnb_4bit_use_double_quant": True}, result, 4, 10)
    assert line == (
        "[ 4/10] #3   r=16 alpha/r=2 dq=yes  complete           3.14 GiB  margin             34x  "
        "instability   0.123    42.0 s"
    )
    capped = TrialResult(status="complete", stress=StressOutcome(stability_margin=643.0, margin_capped=True))
    assert ">=643x  instability" in format_trial_line(3, {"r": 16}, capped, 4, 10)


def test_nan_trial_line_shows_its_cause_dashes_and_reason():
    result = TrialResult(
        status="nan",
        reason="loss is NaN at step 2",
        nan=NanFindings(cause="data"),
        memory=MemoryReading(peak_memory_gib=1.0),
        provenance=Provenance(wall_time_s=5.0),
    )
    line = format_trial_line(7, {"r": 8}, result, 12, 100)
    assert line == (
        "[ 12/100] #7   r=8  nan/data           1.00 GiB  margin               -  instability       -     5.0 s  "
        "(loss is NaN at step 2)"
    )


def test_oom_trial_line_appends_its_reason():
    result = TrialResult(
        status="oom", reason="CUDA out of memory at step 1 (backward)", memory=MemoryReading(peak_memory_gib=23.9)
    )
    line = format_trial_line(12, {"r": 64, "per_device_train_batch_size": 8}, result, 1, 8)
    assert line == (
        "[1/8] #12  r=64 batch=8  oom               23.90 GiB  margin               -  instability       -       - s"
        "  (CUDA out of memory at step 1 (backward))"
    )


def test_repeat_line_has_no_progress_counter_but_keeps_the_columns():
    params = {"r": 16}
    repeat = TrialResult(
        status="complete",
        reason="same configuration as trial 1",
        memory=MemoryReading(peak_memory_gib=1.0),
        constant=ConstantPhase(instability=0.5),
    )
    line = format_trial_line(5, params, repeat, 3, 10, repeat=True)
    assert (
        line
        == "        #5   r=16  complete           1.00 GiB  margin               -  instability   0.500       - s  "
        "(same configuration as trial 1)"
    )
    # A repeat at another max_seq_length that trains the same rows is said as a repeat too, with its reason, not as
    # a cold measurement (issue 55: it was recognized only by a reason starting "same configuration").
    same_rows = TrialResult(
        status="complete",
        reason="max_seq_length 2048 trains the same rows as 1536 on this data (longest 938 tokens): trial 1's result "
        "is reused",
        memory=MemoryReading(peak_memory_gib=1.35),
        provenance=Provenance(wall_time_s=0.0, warm=False),
    )
    line = format_trial_line(6, {"max_seq_length": 2048}, same_rows, 3, 10, repeat=True)
    assert line.startswith("        #6 ") and "cold" not in line and line.endswith(f"({same_rows.reason})"), line
    first = format_trial_line(
        1,
        params,
        TrialResult(
            status="complete", memory=MemoryReading(peak_memory_gib=1.0), constant=ConstantPhase(instability=0.5)
        ),
        2,
        10,
    )
    assert line.index("#") == first.index("#") == 8
    assert first.endswith("      - s")  # a complete trial that is no repeat adds no reason, even an empty one


def test_trace_rows_mark_non_finite_and_skipped_steps():
    result = TrialResult(
        status="nan",
        constant=ConstantPhase(
            loss_trace=[2.0, 1.5, None],
            grad_norm_trace=[1.0, 123456.0, None],
            max_activation_trace=[10.5, 2000.0],
            skipped_steps=[2],
        ),
    )
    assert format_trace(result).splitlines() == [
        "step        loss   grad_norm  max_activation  skipped",
        "----  ----------  ----------  --------------  -------",
        "   1      2.0000           1            10.5         ",
        "   2      1.5000   1.235e+05            2000      yes",
        "   3  non-finite  non-finite               -         ",
    ]


def test_trace_runs_to_the_longer_trace_and_is_a_header_for_an_empty_one():
    result = TrialResult(status="crash", constant=ConstantPhase(loss_trace=[0.5], grad_norm_trace=[0.25, 0.125]))
    rows = format_trace(result).splitlines()
    assert [r.split() for r in rows[2:]] == [["1", "0.5000", "0.25", "-"], ["2", "non-finite", "0.125", "-"]]
    assert format_trace(TrialResult(status="error")).splitlines() == [
        "step  loss  grad_norm  max_activation  skipped",
        "----  ----  ---------  --------------  -------",
    ]


def frozen(number, *, config, values, lora_alpha=None, **result):
    """A COMPLETE trial as sweeper stores it (``values`` are ``[peak_memory_gib, edge_proximity]``; ``result``: more
    stored result fields), read back through ``stored_trial``."""
    attrs = {"status": "complete", "reason": "ok", "config": config.to_dict(), **result}
    if lora_alpha is not None:
        attrs["lora_alpha"] = lora_alpha
    trial = create_trial(
        state=TrialState.COMPLETE,
        values=values,
        params={"r": config.r},
        distributions={"r": CategoricalDistribution([8, 16])},
        user_attrs=attrs,
    )
    trial.number = number
    return stored_trial(trial)


def test_front_table_reads_each_trials_stored_config():
    front = [
        frozen(
            0,
            config=TrialConfig(
                r=8,
                bnb_4bit_compute_dtype="float16",
                bnb_4bit_use_double_quant=False,
                per_device_train_batch_size=2,
                max_seq_length=256,
            ),
            values=[1.5, 1 / 36],
            lora_alpha=16.0,
            instability=0.25,
            stability_margin=36.0,
            learning_progress=0.3,
        ),
        frozen(
            12,
            config=TrialConfig(
                r=16,
                lora_alpha_ratio=0.5,
                bnb_4bit_quant_type="fp4",
                per_device_train_batch_size=1,
                max_seq_length=1024,
            ),
            values=[3.25, 1 / 643],
            instability=0.125,
            stability_margin=643.0,
            margin_capped=True,
            learning_progress=0.02,
        ),  # no stored lora_alpha: ratio * r of its config
    ]
    lines = format_front(front).splitlines()
    assert lines[0].split() == [
        "trial", "r", "lora_alpha", "compute", "double_quant", "quant", "batch", "max_seq_length", "peak_GiB",
        "margin", "headroom", "P(diverge@400)", "learns", "instability",
    ]  # fmt: skip
    assert lines[1].startswith("-----  --  ----------  --------  ------------  -----  -----  --------------  --------")
    # the margin's interval from its measured seed noise (*/ 1.59); the edge 1.8x its rate, not safe at 400 steps
    assert lines[2].split() == [
        "0", "8", "16", "float16", "no", "nf4", "2", "256", "1.500", "36x", "(23-57x)", "1.8x", "(1.4-4.1x,",
        "undecided)", "1.0%", "(<0.1-11%)", "undecided", "30%", "0.250",
    ]  # fmt: skip
    # Capped, and learning under a tenth of the front's best: said so.
    assert lines[3].split() == [
        "12", "16", "8", "bfloat16", "yes", "fp4", "1", "1024", "3.250", ">=643x", "(>=404x)", ">=8.7x", "(>=4.7x)",
        "<0.1%", "safe", "2%", "(barely)", "0.125",
    ]  # fmt: skip
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1  # right-aligned columns
    tiny = [
        frozen(1, config=TrialConfig(r=8), values=[1.0, 0.5], instability=6.85e-05),
        frozen(2, config=TrialConfig(r=8), values=[2.0, 0.25], instability=0.0),
    ]
    assert [line.split()[-1] for line in format_front(tiny).splitlines()[2:]] == ["6.85e-05", "0"]  # not 0.000 twice
    # issue 55, confusion 3: a front with packed trials says which rows were packed (the HTML front did, the
    # terminal's did not); a front without any has no such column (above).
    packed = [
        frozen(1, config=TrialConfig(r=8, packing=True), values=[1.0, 0.5]),
        frozen(2, config=TrialConfig(r=8), values=[2.0, 0.25]),
    ]
    head, _, one, two = format_front(packed).splitlines()
    at = head.split().index("packing")
    assert head.split()[at - 1] == "max_seq_length" and (one.split()[at], two.split()[at]) == ("yes", "no")


def test_an_instability_below_a_thousandth_is_not_shown_as_zero():
    assert [format_instability(v) for v in (0.12345, 0.001, 6.85e-05, 0.0, None)] == [
        "0.123",
        "0.001",
        "6.85e-05",
        "0",
        "-",
    ]
    line = format_trial_line(
        0,
        {"r": 8},
        TrialResult(
            status="complete", memory=MemoryReading(peak_memory_gib=1.0), constant=ConstantPhase(instability=6.85e-05)
        ),
        1,
        1,
    )
    assert "instability 6.85e-05" in line


def test_counts_in_fixed_order_with_nan_causes():
    counts = {"zeta": 1, "oom": 2, "repeated": 1, "nan": 3, "complete": 7, "alpha": 4, "predicted_oom": 1}
    causes = {"data": [4], "precision": [5, 6]}
    assert format_counts(counts, causes) == (
        "complete 7 · nan 3 (data 1, precision 2) · oom 2 · predicted_oom 1 · repeated 1 · alpha 4 · zeta 1"
    )
    assert format_counts({"nan": 2, "complete": 1}) == "complete 1 · nan 2"
    assert format_counts({"complete": 1}, causes) == "complete 1"  # causes only follow a NaN count
    assert format_counts({}) == ""


def test_data_nan_summary_names_trials_samples_and_folder():
    trials = "studies/s/trials"
    assert format_data_nan_summary({}, {}, trials) == ""
    assert format_data_nan_summary({"precision": [3]}, {3: [1]}, trials) == ""
    assert format_data_nan_summary({"data": [4]}, {4: [7]}, trials) == (
        "the NaN trial was caused by the data, not the hyperparameters: trial #4, sample 7 "
        "(rows in studies/s/trials/4/nan_batch.jsonl)"
    )
    assert format_data_nan_summary({"data": [2, 5], "precision": [6]}, {2: [9, 3], 5: [3, 11]}, trials) == (
        "2 of 3 NaN trials were caused by the data, not the hyperparameters: trials #2, #5, samples 3, 9, 11 "
        "(rows in studies/s/trials/<trial>/nan_batch.jsonl)"
    )
    assert format_data_nan_summary({"data": [1, 2]}, {1: list(range(6)), 2: list(range(4, 10))}, trials) == (
        "all 2 NaN trials were caused by the data, not the hyperparameters: trials #1, #2, "
        "samples 0, 1, 2, 3, 4, 5, 6, 7 and 2 more (rows in studies/s/trials/<trial>/nan_batch.jsonl)"
    )
    assert format_data_nan_summary({"data": [4], "optimization": [5]}, {4: [7, 8]}, trials).startswith(
        "1 of 2 NaN trials were caused by the data, not the hyperparameters: trial #4, samples 7, 8 "
    )


NO_SUPERVISED = Finding(
    kind="no_supervised_tokens",
    max_seq_length=128,
    samples=list(range(8, 16)),
    detail="8 samples have no supervised token at 128",
    nan_risk=True,
)
INVALID_ID = Finding(
    kind="invalid_token_id", max_seq_length=512, samples=[40], detail="1 sample has id 32001", nan_risk=True
)
TOO_LONG = Finding(kind="too_long", max_seq_length=None, samples=[42, 43], detail="2 samples over 900 tokens")
DUPLICATE = Finding(kind="duplicate", max_seq_length=None, samples=[1, 2], detail="2 samples repeat another")


def audit(*findings):
    return AuditReport(
        samples=100,
        length_percentiles={"min": 12.0, "p50": 80.5, "max": 2048.0, "mean": 101.25},
        max_seq_lengths=[128, 512],
        vocab_size=32000,
        findings=list(findings),
    )


def test_a_huge_rows_tokens_are_written_whole():
    """Issue 68: a 1.3M-token row read ``p99 1.04e+06 max 1.3e+06``."""
    report = AuditReport(samples=3, length_percentiles={"p99": 1_040_000.0, "max": 1_300_000.0, "mean": 433_350.5},
                         max_seq_lengths=[512], vocab_size=None)  # fmt: skip
    assert format_audit(report).splitlines()[0].endswith("p99 1,040,000  max 1,300,000  mean 433,350")


def test_audit_table_and_nan_risk_line():
    assert format_audit(audit(NO_SUPERVISED, INVALID_ID, TOO_LONG)).splitlines() == [
        "tokens per sample (chat template included, before truncation): min 12  p50 80.5  max 2048  mean 101.25",
        "",
        "kind                  max_seq_length  samples  detail",
        "--------------------  --------------  -------  ------",
        "no_supervised_tokens  128             8        8 samples have no supervised token at 128",
        "invalid_token_id      512             1        1 sample has id 32001",
        "too_long              -               2        2 samples over 900 tokens",
        "",
        "NaN risk at max_seq_length 128, 512: no_supervised_tokens at 128 (8 samples); invalid_token_id at 512 "
        "(1 sample)",
    ]


def test_audit_without_findings_says_nothing_would_make_a_trial_nan():
    assert format_audit(audit()).splitlines()[1:] == [
        "",
        "no findings",
        "",
        "no finding would make a trial NaN at max_seq_length 128, 512",
    ]
    assert format_audit(audit(TOO_LONG)).splitlines()[-1] == (
        "no finding would make a trial NaN at max_seq_length 128, 512"
    )


def test_data_warning_names_batch_sizes_and_the_earliest_step():
    strikes = {
        (2, 1): NanStep(step=5, samples=[8, 9], kind="no_supervised_tokens"),
        (1, 1): NanStep(step=9, samples=[8], kind="no_supervised_tokens"),
        (16, 1): NanStep(step=7, samples=list(range(8, 16)), kind="no_supervised_tokens"),
        (4, 1): NanStep(step=3, samples=[8, 9, 10, 11], kind="no_supervised_tokens"),
    }
    report = audit(NO_SUPERVISED, TOO_LONG, DUPLICATE)
    lines = format_data_warnings(
        report,
        [NanRisk(finding=NO_SUPERVISED, strikes=strikes, max_steps=30)],
        several_accumulations=False,
        doctor=DOCTOR,
    )
    assert lines == [
        "WARNING data: at max_seq_length=128, 8 of 100 samples have no supervised token left (the reply is cut away); "
        "batch 1, 2, 4, 16 go NaN (batch 4: step 3, samples 8, 9, 10, 11): a data fault, not a hyperparameter result "
        "(sweep doctor space.yaml)",
        "data    also found: duplicate, too_long (sweep doctor space.yaml)",
    ]


def test_data_warning_with_one_strike_names_accumulation_and_caps_samples():
    strikes = {(2, 4): NanStep(step=1, samples=list(range(8)), kind="invalid_token_id")}
    lines = format_data_warnings(
        audit(INVALID_ID),
        [NanRisk(finding=INVALID_ID, strikes=strikes, max_steps=30)],
        several_accumulations=True,
        doctor=DOCTOR,
    )
    assert lines == [
        "WARNING data: at max_seq_length=512, 1 of 100 samples have token ids outside the model's 32000 embedding "
        "rows; batch 2 goes NaN (batch 2, gradient_accumulation_steps 4: step 1, samples 0, 1, 2, 3, 4, 5): a data "
        "fault, not a hyperparameter result (sweep doctor space.yaml)"
    ]
    one = {(1, 1): NanStep(step=2, samples=[40], kind="invalid_token_id")}
    (line,) = format_data_warnings(
        audit(INVALID_ID),
        [NanRisk(finding=INVALID_ID, strikes=one, max_steps=30)],
        several_accumulations=False,
        doctor=DOCTOR,
    )
    assert "; batch 1 goes NaN (batch 1: step 2, sample 40): " in line


def test_data_warning_without_strikes_says_a_longer_run_would_be():
    (line,) = format_data_warnings(
        audit(NO_SUPERVISED),
        [NanRisk(finding=NO_SUPERVISED, strikes={}, max_steps=30)],
        several_accumulations=False,
        doctor=DOCTOR,
    )
    assert line == (
        "WARNING data: at max_seq_length=128, 8 of 100 samples have no supervised token left (the reply is cut away); "
        "no step of the first 30 is made only of them, a longer run would be: a data fault, not a hyperparameter "
        "result (sweep doctor space.yaml)"
    )


def test_no_data_risk_is_one_line_naming_other_findings():
    assert format_data_warnings(audit(), [], several_accumulations=False, doctor=DOCTOR) == [
        "data    audited at max_seq_length 128, 512: nothing that would make a trial NaN"
    ]
    assert format_data_warnings(audit(DUPLICATE, TOO_LONG), [], several_accumulations=True, doctor=DOCTOR) == [
        "data    audited at max_seq_length 128, 512: nothing that would make a trial NaN; also found: duplicate, "
        "too_long (sweep doctor space.yaml)"
    ]


def test_a_resumed_study_written_before_the_margin_says_so_once(tmp_path):
    import types
    import warnings

    import optuna

    from sweeper.cli._sweep_console import resume_lines
    from sweeper.space import parse_space
    from sweeper.study._objectives import LEGACY_OBJECTIVES
    from sweeper.study._storage import open_study

    space = parse_space({"study": {"name": "old"}, "search": {"r": [4, 8]}}, "space.yaml")
    url = f"sqlite:///{tmp_path}/old.db"
    old = optuna.create_study(study_name="old", storage=url, directions=["minimize", "minimize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old.set_metric_names([o.name for o in LEGACY_OBJECTIVES])
    old.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0, 0.1]))
    plan = types.SimpleNamespace(
        study=open_study(space, url, "old", 4), finished_before=1, n_trials=4, space=space, new_setup=False
    )
    lines = resume_lines(plan)
    assert sum("written before the stability margin" in line for line in lines) == 1, lines
    new = open_study(space, f"sqlite:///{tmp_path}/new.db", "new", 4)
    assert not any(
        "stability margin" in line for line in resume_lines(types.SimpleNamespace(**{**vars(plan), "study": new}))
    )


def test_next_steps_address_the_failures_at_hand(tmp_path):
    """After a data NaN the audit of the data; after an OOM the memory model; after a timeout the log; never the
    data audit for a failure the data did not cause."""
    import types

    from sweeper.cli._sweep_console import _next_steps
    from sweeper.space import parse_space
    from sweeper.study._snapshot import nan_causes
    from sweeper.testing import add_trial, make_study

    space = parse_space({"study": {"name": "rep"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = make_study(tmp_path)  # complete trials, an oom and a data NaN
    steps = _next_steps(
        types.SimpleNamespace(study=study, space=space, name="rep", trials_dir=Path("studies/rep/trials")),
        nan_causes(study),
    )
    assert steps[0] == "sweep doctor space.yaml" and steps[1].startswith("sweep estimate space.yaml")
    oom_only = optuna.create_study(directions=["minimize", "minimize"])
    add_trial(oom_only, r=8, batch=4, seq=128, status="oom", peak=3.9)
    add_trial(oom_only, r=8, batch=4, seq=128, status="timeout")
    steps = _next_steps(
        types.SimpleNamespace(study=oom_only, space=space, name="rep", trials_dir=Path("studies/rep/trials")),
        nan_causes(oom_only),
    )
    assert not any("doctor" in s for s in steps) and steps[0].startswith("sweep estimate") and "worker.log" in steps[1]


def test_the_trial_lines_columns_stay_aligned_whatever_the_status():
    from sweeper.report._trial_text import format_trial_line

    results = [
        TrialResult(
            status="complete",
            reason="",
            memory=MemoryReading(peak_memory_gib=1.0),
            constant=ConstantPhase(instability=0.1),
        ),
        TrialResult(
            status="nan",
            reason="nan at step 3",
            nan=NanFindings(cause="optimization"),
            memory=MemoryReading(peak_memory_gib=1.0),
        ),
        TrialResult(status="predicted_oom", reason="predicted", memory=MemoryReading(peak_memory_gib=9.0)),
        TrialResult(status="dominated_oom", reason="dominated", memory=MemoryReading(peak_memory_gib=9.0)),
    ]
    lines = [format_trial_line(i, {"r": 8}, r, i + 1, 4) for i, r in enumerate(results)]
    assert len({line.index(" GiB") for line in lines}) == 1, lines
    assert len({line.index("margin") for line in lines}) == 1, lines


def test_sweep_trial_prints_only_what_the_trial_measured(tmp_path):
    from pathlib import Path

    from sweeper.report import trial_header, trial_result_lines
    from sweeper.testing import tiny_trial_config

    config = TrialConfig.from_dict({**tiny_trial_config(Path("m")).to_dict(), "r": 8, "max_seq_length": 64})
    folder = tmp_path / "manual" / "1"
    header = trial_header(config, "model   m", folder)
    assert header[0].startswith("sweep trial: r=8 alpha/r=") and " seq=64 " in header[0]
    assert header[1:] == ["model   m", f"files   {folder}"]
    nan = TrialResult(
        status="nan",
        reason="loss nan at step 2",
        nan=NanFindings(cause="data", samples=[3, 4]),
        constant=ConstantPhase(loss_trace=[2.0, None], grad_norm_trace=[1.0, None]),
        provenance=Provenance(wall_time_s=4.0),
    )
    lines = trial_result_lines(nan, config, folder)
    assert lines[0].splitlines()[0].split() == ["step", "loss", "grad_norm", "max_activation", "skipped"]
    assert lines[1:] == [
        "status  nan: loss nan at step 2",
        f"nan     cause data; samples at fault: 3, 4; the step's rows are in {folder / 'nan_batch.jsonl'}",
        "time    total 4.0 s",
    ]
    complete = TrialResult(
        status="complete",
        reason="ran 3 steps",
        memory=MemoryReading(peak_memory_gib=1.234, load_peak_memory_gib=0.9, memory_kind="cpu_peak_rss"),
        constant=ConstantPhase(instability=0.42, instability_components={"probe_rebound": 0.3}, train_time_s=3.0),
        stress=StressOutcome(stop="diverged", steps=6, stability_margin=36.0, lr_ceiling=0.007),
        provenance=Provenance(import_time_s=1.5),
    )
    lines = trial_result_lines(complete, config, folder)
    assert lines[:3] == [
        "status  complete: ran 3 steps",
        "memory  1.234 GiB (cpu_peak_rss, 0.900 GiB while loading)",
        "instability 0.420 (probe_rebound 0.300)",
    ]
    assert lines[3].startswith("margin  36x the learning rate (lr_ceiling 0.007; stress diverged after 6 steps)")
    assert lines[4] == "time    import 1.5 s, train 3.0 s"
    # On CUDA, a reserved peak a fifth of which was the allocator's cache says so after the memory line (issue 57);
    # under 10%, or with expandable_segments already set, it does not.
    complete.memory = MemoryReading(
        peak_memory_gib=12.8, peak_allocated_gib=10.24, load_peak_memory_gib=6.0, memory_kind="cuda_max_reserved"
    )
    lines = trial_result_lines(complete, config, folder)
    assert lines[2] == (
        "memory  2.56 of the 12.80 GiB reserved at the peak was the CUDA allocator's cache, not tensors (20%): "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True usually returns most of it (set it for the sweep and the "
        "production run alike)"
    )
    complete.provenance.cuda_alloc_conf = "expandable_segments:True"
    assert not any("allocator's cache" in line for line in trial_result_lines(complete, config, folder))
    complete.provenance.cuda_alloc_conf, complete.memory.peak_allocated_gib = "", 11.6
    assert not any("allocator's cache" in line for line in trial_result_lines(complete, config, folder))


def test_the_report_notes_other_setups_and_old_instabilities(tmp_path):
    """Trials measured under another setup are counted and their differences named; a 0.1.0 instability (its terms
    without the probe's) is named by trial; a study with neither gets no note."""
    import shutil
    from pathlib import Path

    from sweeper.report._front_text import legacy_instability_warning, other_setups_line
    from sweeper.testing import add_trial, make_study

    study = make_study(tmp_path)
    assert other_setups_line(snapshot(study)) is None and legacy_instability_warning(snapshot(study)) is None
    study.set_user_attr("setups", [{"max_steps": 3}, {"max_steps": 4}])
    study.set_user_attr("current_setup", 1)
    assert other_setups_line(snapshot(study)) is None  # every trial's config matches the current setup
    add_trial(study, r=16, batch=1, seq=64, status="complete", peak=0.5, instability=0.1, extra={"setup": 0})
    add_trial(study, r=16, batch=1, seq=128, status="oom", peak=3.0, extra={"setup": 0})
    assert other_setups_line(snapshot(study)) == (
        "note    2 measured trials of this study were measured under other settings (2 with max_steps 3 (now 4)): "
        "kept apart, the front, the picks and the exports compare the 5 of the current settings"
    )
    # sweeper 0.1.0's study (tests/fixtures/study_v010.db): its trials' instabilities are the training loss's
    shutil.copyfile(Path(__file__).parents[1] / "fixtures" / "study_v010.db", tmp_path / "v010.db")
    old = optuna.load_study(study_name="v010", storage=f"sqlite:///{tmp_path}/v010.db")
    assert legacy_instability_warning(snapshot(old)).startswith(
        "WARNING instability: 3 trials of this study (0, 1, 6) measured it with sweeper 0.1.0's definition"
    )


def test_sweep_report_lines(tmp_path):
    from sweeper.report import report_lines
    from sweeper.study import Confirmation
    from sweeper.testing import make_study

    study = make_study(tmp_path)
    lines = report_lines(snapshot(study), "'sqlite:///x.db'")
    assert lines[0] == "study 'rep': Pareto front (peak memory vs stability margin), 2 trials:"
    assert lines[1].splitlines()[0].split()[:2] == ["trial", "r"] and lines[2] == ""
    assert lines[3:] == [
        "trials: complete 3 · nan 1 (data 1) · oom 1 · repeated 1",
        "picks   (sweep export 'sqlite:///x.db' writes safe; --pick NAME another)",
        "  safe #1, among the 3 complete trials; no trial is safely below its edge: took the most headroom, above its "
        "predicted edge (headroom 0.6x (0.3-0.8x)): predicted to fail at its own learning rate; P(diverges within 400 "
        "steps) 97% (91-99%); safe at learning_rate 2e-05",
        "  knee #1, among the front's 2 trials; above its predicted edge (headroom 0.6x (0.3-0.8x)): predicted to fail "
        "at its own learning rate; P(diverges within 400 steps) 97% (91-99%); safe at learning_rate 2e-05",
        "  min-memory #0, among the front's 2 trials; above its predicted edge (headroom 0.3x (0.1-0.4x)): predicted "
        "to fail at its own learning rate; P(diverges within 400 steps) >99.9% (99.9->99.9%); safe at learning_rate "
        "4.42e-06",
        "  most-stable #1, among the front's 2 trials; above its predicted edge (headroom 0.6x (0.3-0.8x)): predicted "
        "to fail at its own learning rate; P(diverges within 400 steps) 97% (91-99%); safe at learning_rate 2e-05",
        "largest max_seq_length that fit: batch 1: 128, batch 2: 128, batch 4: none (OOM at 128)",
    ]
    for n in (0, 1):
        study.set_user_attr(f"confirmation:{n}", Confirmation(steps=30, status="nan", fail_step=3).to_dict())
    lines = report_lines(snapshot(study), "rep")
    # the front's picks cannot be made; the safe pick, made among every complete trial, takes trial 2
    assert lines[5].startswith("  safe #2, among the 3 complete trials; no trial is safely below its edge")
    assert lines[6].startswith("  knee: none: trial 0 failed its confirmation")
    for n in (2,):
        study.set_user_attr(f"confirmation:{n}", Confirmation(steps=30, status="nan", fail_step=3).to_dict())
    assert report_lines(snapshot(study), "rep")[4].startswith("picks   none: trial 0 failed its confirmation")


def test_front_progress_is_the_hypervolume_the_latest_trials_added():
    from sweeper.study._objectives import DEFAULT_OBJECTIVES
    from sweeper.study._pareto import front_progress

    # (number, (peak GiB, edge proximity)); both minimized
    early = [(0, (1.0, 0.5)), (1, (2.0, 0.1)), (2, (1.5, 0.3))]
    assert front_progress(early, DEFAULT_OBJECTIVES) is None  # under 6: no figure
    nothing_new = early + [(3, (2.0, 0.5)), (4, (1.6, 0.4)), (5, (2.0, 0.2))]  # each dominated by an earlier one
    progress = front_progress(nothing_new, DEFAULT_OBJECTIVES)
    assert (progress.complete, progress.last, progress.first_number, progress.moved) == (6, 3, 3, 0.0)
    # the last trial dominates the whole front: reference (2.1, 0.54); before it the front covers
    # 0.5 x 0.04 + 0.5 x 0.24 + 0.1 x 0.44 = 0.184 of the box, after it 1.1 x 0.44 = 0.484
    better = nothing_new[:5] + [(5, (1.0, 0.1))]
    moved = front_progress(better, DEFAULT_OBJECTIVES).moved
    assert moved == pytest.approx((0.484 - 0.184) / 0.484)


def test_a_resumed_study_says_how_far_its_last_trials_moved_the_front(tmp_path):
    import types
    import warnings

    from sweeper.cli._sweep_console import front_progress_line, resume_lines
    from sweeper.space import parse_space
    from sweeper.study import snapshot
    from sweeper.study._objectives import DEFAULT_OBJECTIVES

    space = parse_space({"study": {"name": "night"}, "search": {"r": [4, 8]}}, "space.yaml")
    url = f"sqlite:///{tmp_path}/night.db"
    study = optuna.create_study(study_name="night", storage=url, directions=["minimize", "minimize"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study.set_metric_names([o.name for o in DEFAULT_OBJECTIVES])
    for values in [(1.0, 0.5), (2.0, 0.1), (1.5, 0.3), (2.0, 0.5), (1.6, 0.4)]:
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=list(values)))
    assert front_progress_line(snapshot(study)) is None  # 5 complete trials: too few to say
    study.add_trial(create_trial(state=TrialState.PRUNED))  # a pruned trial counts for nothing
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[2.0, 0.2]))
    line = front_progress_line(snapshot(study))
    assert line == (
        "front   the last 3 of 6 complete trials (#3 on) moved the front's hypervolume by 0%: they found nothing "
        "beyond the front of the trials before them"
    )
    plan = types.SimpleNamespace(study=study, finished_before=7, n_trials=20, space=space, new_setup=False)
    assert line in resume_lines(plan)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0, 0.1]))
    # 7 complete: the last 3 (#4, #6, #7) hold one that dominates the front (0.184 -> 0.484 of the box)
    assert front_progress_line(snapshot(study)).endswith("(#4 on) moved the front's hypervolume by 62%")


def test_the_front_table_names_each_rows_picks_and_shows_a_pick_off_the_front():
    light = frozen(3, config=TrialConfig(r=8), values=[0.9, 1 / 10], stability_margin=10.0, learning_progress=0.3)
    heavy = frozen(7, config=TrialConfig(r=16), values=[1.2, 1 / 60], stability_margin=60.0, learning_progress=0.3)
    off = frozen(5, config=TrialConfig(r=16), values=[1.0, 1 / 20], stability_margin=20.0, learning_progress=0.4)
    lines = format_front([light, heavy], picks={"safe": off, "min-memory": light, "knee": heavy}).splitlines()
    assert lines[0].split()[-1] == "pick"
    # the off-front pick is a row of its own, in order of peak memory, and says where it stands
    assert [line.split()[0] for line in lines[2:]] == ["3", "5", "7"]
    assert lines[2].endswith("min-memory") and lines[4].endswith("knee")
    assert lines[3].endswith("safe (off the front)")
    assert "pick" not in format_front([light, heavy]).splitlines()[0]  # no picks given: no column


def test_the_lengths_that_train_the_same_rows_are_said_of_the_padded_trials_when_packing_is_searched():
    # issue 55, confusion 3: with packing searched, no line said which lengths train the same rows for the padded
    # trials (which the sweep settles as repeats); with every trial packed, none do.
    from sweeper.report import format_same_rows

    plain = format_same_rows([1024, 2048, 4096], 1320, False)
    assert plain is not None and plain.startswith("max_seq_length 2048 and 4096 train the same rows on this data")
    mixed = format_same_rows([1024, 2048, 4096], 1320, [False, True])
    assert mixed is not None and mixed.startswith("the padded trials' max_seq_length 2048 and 4096 train the same")
    assert format_same_rows([1024, 2048, 4096], 1320, [True]) is None
    assert format_same_rows([1024, 2048, 4096], 1320, True) is None
    assert format_same_rows([1024, 2048], 1320, False) is None  # one value at or above the longest
