"""``sweep doctor`` as a user runs it, and the data audit ``sweep run`` makes before its first trial: findings with
the right indices, ``--json``, ``--strict``, one-line errors, and a sweep whose only NaNs come from the data saying so.
"""

import json
from pathlib import Path

import optuna
import pytest

from sweeper.testing import clean_rows, data_nan_space, run_cli, sweep, write_jsonl, write_space

REPO = Path(__file__).resolve().parents[2]


def faulty_rows() -> list[dict]:
    rows = clean_rows()
    rows[1] = {"prompt": "Say it again.", "completion": "and again " * 40}
    rows[4] = dict(rows[2])
    rows[6] = {"prompt": "Explain every detail of the import system. " * 8, "completion": "It is long."}
    return rows


def test_doctor_json_names_each_fault(tiny_model, workdir):
    data = write_jsonl(workdir / "faulty.jsonl", faulty_rows())
    out = run_cli(
        "doctor",
        str(data),
        "--model",
        str(tiny_model),
        "--max-seq-length",
        "48",
        "--max-seq-length",
        "512",
        "--json",
        cwd=workdir,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["samples"] == 10 and report["length_percentiles"]["max"] > 48
    found = {(f["kind"], f["max_seq_length"]): f["samples"] for f in report["findings"]}
    assert found[("no_supervised_tokens", 48)] == [6] and ("no_supervised_tokens", 512) not in found
    assert found[("repeated_span", None)] == [1] and found[("duplicate", None)] == [2, 4]
    assert all(set(f) >= {"kind", "max_seq_length", "samples", "detail"} for f in report["findings"])
    strict = run_cli("doctor", str(data), "--model", str(tiny_model), "--max-seq-length", "48", "--strict", cwd=workdir)
    assert strict.returncode == 1 and "NaN risk at max_seq_length 48" in strict.stdout
    loose = run_cli("doctor", str(data), "--model", str(tiny_model), "--max-seq-length", "512", "--strict", cwd=workdir)
    assert loose.returncode == 0 and "no finding would make a trial NaN" in loose.stdout


@pytest.mark.slow  # a sweep process importing transformers: seconds
def test_doctor_on_a_clean_dataset(tiny_model, workdir):
    """As a process of its own (the console script in a fresh interpreter); the other doctor tests run in-process."""
    data = write_jsonl(workdir / "clean.jsonl", clean_rows())
    out = sweep("doctor", str(data), "--model", str(tiny_model), "--max-seq-length", "256", "--strict", cwd=workdir)
    assert out.returncode == 0 and "no findings" in out.stdout and "tokens per sample" in out.stdout
    # Every sample is shorter than 256 and 512 tokens: both lengths train the same rows.
    both = run_cli("doctor", str(data), "--model", str(tiny_model), "--max-seq-length", "16", "256", "512", cwd=workdir)
    assert both.returncode == 0, both.stderr
    assert "max_seq_length 256 and 512 train the same rows on this data (longest " in both.stdout


def test_doctor_on_the_demo_space_reads_its_data_and_lengths(tiny_model, workdir):
    # The demo space's built-in data and max_seq_length values, with the tiny model's tokenizer (no GGUF conversion).
    out = run_cli("doctor", str(REPO / "search_spaces" / "demo.yaml"), "--model", str(tiny_model), cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "builtin:pydoc-topics" in out.stdout and "truncated" in out.stdout
    assert "no finding would make a trial NaN at max_seq_length 64, 128, 256" in out.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["missing.jsonl"], "missing.jsonl: dataset.path: no such file"),
        (["missing.yaml"], "missing.yaml"),
        (["builtin:pydoc-topics", "--max-seq-length", "1"], "--max-seq-length: 1 is out of range"),
        (["builtin:pydoc-topics", "--max-seq-length", "10000000000"], "--max-seq-length: 10000000000 is out of range"),
        (["builtin:pydoc-topics", "--model", ""], "--model: empty"),
        (["builtin:pydoc-topics", "--set", "r=4"], "--set: only a space file takes overrides"),
        (["builtin:pydoc-topics", "--model", "./no/such/model"], "model.name_or_path: no such directory"),
    ],
)
def test_doctor_bad_input_is_one_line(tiny_model, workdir, argv, needle):
    # The tiny model's tokenizer where no --model is given: the built-in model's first conversion takes 25 s.
    model = [] if "--model" in argv or argv[0].endswith(".yaml") else ["--model", str(tiny_model)]
    out = run_cli("doctor", *argv, *model, cwd=workdir)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


@pytest.mark.slow
def test_sweep_whose_only_nans_come_from_the_data_says_so(tiny_model, workdir):
    out = sweep("run", str(write_space(workdir, data_nan_space(tiny_model))), cwd=workdir)
    assert out.returncode == 0, out.stderr
    warning = [ln for ln in out.stdout.splitlines() if ln.startswith("WARNING data: at max_seq_length=16")]
    # the sampled rows' audit (where the trials strike it), then the rest of the file, which the exports train
    assert len(warning) == 2 and "no supervised token" in warning[0] and "step 1" in warning[0]
    assert "rows outside the trials' 32 sampled rows (dataset.max_samples) keep no supervised token" in warning[1]
    assert "nan/data" in out.stdout
    assert "nan 1 (data 1)" in out.stdout
    assert "the NaN trial was caused by the data, not the hyperparameters" in out.stdout
    study = optuna.load_study(study_name="t", storage="sqlite:///studies/t.db")
    (nan,) = [t for t in study.trials if t.user_attrs.get("status") == "nan" and "duplicate_of" not in t.user_attrs]
    assert nan.user_attrs["nan_cause"] == "data" and nan.user_attrs["min_supervised_tokens"] == 0
    assert (
        nan.user_attrs["nan_samples"]
        and (workdir / "studies" / "t" / "trials" / str(nan.number) / "nan_batch.jsonl").is_file()
    )


def test_doctor_reads_sharegpt_and_counts_every_row_it_does_not_use(tiny_model, workdir):
    # The file: 30 chat rows and 30 rows with ShareGPT's roles (all 60 read now), plus rows no trial can use.
    good = [
        {"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"A{i}"}]}
        for i in range(30)
    ]
    human = [
        {"messages": [{"role": "human", "content": f"Q{i}"}, {"role": "gpt", "content": f"B{i}"}]} for i in range(30)
    ]
    bad = [
        {"messages": [{"role": "system", "content": "only a system turn"}]},
        {"messages": [{"from": "human", "value": "Q"}, {"from": "function_call", "value": "f()"}]},
        {"messages": [{"role": "system", "content": "again"}]},
    ]
    data = write_jsonl(workdir / "mixed.jsonl", good + human + bad)
    out = run_cli("doctor", str(data), "--model", str(tiny_model), "--max-seq-length", "64", "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["samples"] == 60
    dropped = [f for f in report["findings"] if f["kind"] == "dropped_row"]
    assert [(f["samples"], f["nan_risk"]) for f in dropped] == [([60, 62], False), ([61], False)]
    assert "no assistant turn" in dropped[0]["detail"] and "unknown role 'function_call'" in dropped[1]["detail"]


def test_doctor_checks_the_pad_tokens_embedding_row(workdir, tmp_path_factory):
    from sweeper.testing import PAD_ID, build_pad_token_model

    model = build_pad_token_model(tmp_path_factory.mktemp("pad-nan"))
    data = write_jsonl(workdir / "clean.jsonl", clean_rows())
    out = run_cli("doctor", str(data), "--model", str(model), "--max-seq-length", "256", "--strict", cwd=workdir)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "bad_embedding_row" in out.stdout and f"'<pad>' (id {PAD_ID})" in out.stdout
    assert "holds NaN" in out.stdout and "NaN risk: bad_embedding_row (10 samples)" in out.stdout


def late_row_file(folder: Path) -> Path:
    """Issue 68's file: 300 chat rows, row 280 a prompt of thousands of tokens and the reply "ok": at
    max_seq_length 512 it keeps no supervised token, and the space's 24 sampled rows do not hold it."""

    def chat(prompt: str, reply: str) -> dict:
        return {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]}

    rows = [chat(f"What is {i} plus one?", f"{i + 1}.") for i in range(300)]
    rows[280] = chat("Summarize this log. " + "worker started, worker stopped; " * 400, "ok")
    return write_jsonl(folder / "late.jsonl", rows)


def test_a_late_row_that_makes_a_nan_step_is_named_before_the_first_trial(tiny_model, workdir):
    """The sampled rows' audit said "nothing that would make a trial NaN" while the exports train the whole file:
    `sweep doctor SPACE` names the whole file's row, and so does the line `sweep run` prints before its first trial."""
    from sweeper.cli._common import _prepare, _profile
    from sweeper.cli._run import _data_warnings
    from sweeper.space import load_space

    late_row_file(workdir)
    space = tiny_space_with(tiny_model, "late.jsonl", max_samples=24, max_seq_length=512)
    path = write_space(workdir, space)
    out = run_cli("doctor", str(path), cwd=workdir)
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("WARNING data: at max_seq_length=512")]
    assert "1 of the file's 300 rows outside the trials' 24 sampled rows (dataset.max_samples) keeps no" in line
    assert "(row 280: the reply starts past the cut" in line and "no trial trains it" in line
    assert "drop it from the file, or raise max_seq_length" in line
    # what sweep run prints before its first trial, from the same profile
    loaded = load_space(path)
    model_path, samples = _prepare(loaded.dataset, loaded.model)
    warnings = _data_warnings(loaded, _profile(loaded, model_path, samples, audit=True))
    assert any(w.startswith("WARNING data: at max_seq_length=512") and "row 280" in w for w in warnings), warnings
    # at a length that reaches the reply, the row trains: nothing is said
    longer = run_cli("doctor", str(path), "--max-seq-length", "8192", cwd=workdir)
    assert longer.returncode == 0 and "keeps no supervised token" not in longer.stdout


def test_a_late_repeated_reply_is_named_by_row(tiny_model, workdir):
    """Issue 68: a reply of one token repeated 5,000 times at row 280 was named only by `sweep doctor FILE`; the
    sweep's data line said "its longest sample 5,044 tokens", not which row or what it is."""
    from sweeper.cli._common import _prepare, _profile
    from sweeper.cli._run import _data_warnings
    from sweeper.space import load_space

    rows = [{"prompt": f"What is {i} plus one?", "completion": f"{i + 1}."} for i in range(300)]
    rows[280] = {"prompt": "Say it again.", "completion": "again " * 5000}
    write_jsonl(workdir / "repeat.jsonl", rows)
    path = write_space(workdir, tiny_space_with(tiny_model, "repeat.jsonl", max_samples=24, max_seq_length=512))
    out = run_cli("doctor", str(path), cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "its longest sample" in out.stdout and "(row 280: one unit repeated over" in out.stdout
    loaded = load_space(path)
    model_path, samples = _prepare(loaded.dataset, loaded.model)
    lines = _data_warnings(loaded, _profile(loaded, model_path, samples, audit=True))
    assert any("(row 280: one unit repeated over" in line for line in lines), lines


def tiny_space_with(model: Path, data: str, *, max_samples: int, max_seq_length: int) -> dict:
    from sweeper.testing import tiny_space

    space = tiny_space(model, name="late", n_trials=1, max_samples=max_samples)
    space["dataset"]["path"] = data
    space["training"]["max_seq_length"] = max_seq_length
    return space


@pytest.mark.slow  # one trial of the tiny model: seconds
def test_the_worst_case_step_says_it_trained_zero_supervised_tokens(tiny_model, workdir):
    """Issue 68: the trial's worst-case step trained the late row (its longest) at max_seq_length 512 and said
    nothing of its zero tokens; now the result names its rows and their supervised tokens, and the text warns."""
    late_row_file(workdir)
    path = write_space(workdir, tiny_space_with(tiny_model, "late.jsonl", max_samples=24, max_seq_length=512))
    out = run_cli("trial", str(path), "--json", cwd=workdir)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "complete" and result["worst_case_shape"] == [1, 512]
    assert result["worst_case_rows"] == [280] and result["worst_case_supervised_tokens"] == 0
    text = run_cli("trial", str(path), cwd=workdir).stdout
    assert "WARNING data: the worst-case step (the data's longest rows: 280) keeps no supervised token" in text
    # a length that reaches the reply trains it: the step's tokens are counted, and nothing is said
    longer = tiny_space_with(tiny_model, "late.jsonl", max_samples=24, max_seq_length=8192)
    longer["training"]["max_steps"] = 1
    again = json.loads(run_cli("trial", str(write_space(workdir, longer)), "--json", cwd=workdir).stdout)
    assert again["worst_case_rows"] == [280] and again["worst_case_supervised_tokens"] > 0
