"""Confirmation runs and the probe's zero.

``sweep confirm`` reruns a front trial at a long horizon through the same trial process and records the outcome on
the study; the report shows it; ``sweep export`` prefers confirmed trials, refuses one that failed its confirmation and
notes one never confirmed; a second ``sweep confirm`` skips what is done. A run that cannot diverge (learning rate
1e-9) scores 0 at two batch sizes; one whose probe loss doubles and stays ends ``diverged``.
"""

import json
import shutil

import optuna
import pytest

from sweeper.space import DatasetSpec, ModelSpec, TrialConfig
from sweeper.testing import run_cli, tiny_space, tiny_trial_config, write_space
from sweeper.trial import run_trial


@pytest.fixture(scope="module")
def confirmed_template(tiny_model, tmp_path_factory):
    """A 2-trial study on the tiny model whose knee was confirmed at 8 steps: built once a module (two real trials
    and a confirmation), in a project folder of its own."""
    folder = tmp_path_factory.mktemp("confirmed")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWEEPER_CACHE", str(folder / "cache"))
        space = tiny_space(tiny_model, name="c", search={"r": [4, 8]}, training={"max_steps": 2})
        path = write_space(folder, space)
        out = run_cli("run", str(path), cwd=folder)
        assert out.returncode == 0, out.stderr
        confirm = run_cli("confirm", "c", "--steps", "8", cwd=folder)
        assert confirm.returncode == 0, confirm.stderr
    return folder, confirm


@pytest.fixture
def confirmed_study(confirmed_template, workdir):
    """:func:`confirmed_template`'s project folder copied into the test's own (a copied project folder is the same
    study: ``test_study.py::test_a_copied_project_folder_is_the_same_study``), so that a test may change it."""
    folder, confirm = confirmed_template
    shutil.copytree(folder, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("cache"))
    return workdir, workdir / "space.yaml", confirm


@pytest.mark.slow
def test_confirm_records_the_long_run_and_the_report_shows_it(confirmed_study):
    workdir, path, confirm = confirmed_study
    assert "8 steps (the trial ran 2)" in confirm.stdout and "confirmed: 8 steps complete" in confirm.stdout
    study = optuna.load_study(study_name="c", storage="sqlite:///studies/c.db")
    # issue 55, confusion 6: its expected time, from the trial's own seconds per step (a 31-minute wait looked the
    # same as a 1-minute one)
    knee = next(t for t in study.trials if f"confirm #{t.number}" in confirm.stdout)
    per_step = knee.user_attrs["train_time_s"] / knee.user_attrs["steps_done"]
    assert "plus loading" in confirm.stdout and f"at the trial's {per_step:.2g} s a step" in confirm.stdout
    records = {k: v for k, v in study.user_attrs.items() if k.startswith("confirmation:")}
    assert len(records) == 1
    ((key, record),) = records.items()
    number = int(key.split(":")[1])
    assert record["steps"] == 8 and record["status"] == "complete" and record["probe_loss_start"] > 0
    assert (workdir / "studies" / "c" / "trials" / str(number) / "confirm-8" / "result.json").is_file()
    assert (
        json.loads((workdir / "studies" / "c" / "trials" / str(number) / "confirm-8" / "result.json").read_text())[
            "steps_done"
        ]
        == 8
    )
    report = run_cli("report", "c", cwd=workdir)
    assert report.returncode == 0 and "confirmed" in report.stdout
    # the safe pick (what confirm runs by default) may lie off the front: its confirmation shows in the front table
    # only when it is on it, and always in the JSON's trials
    on_front = number in {t.number for t in study.best_trials}
    assert "8 ok" in report.stdout or not on_front, report.stdout
    data = json.loads(run_cli("report", "c", "--json", cwd=workdir).stdout)
    assert [t["confirmation"]["steps"] for t in data["trials"] if t.get("confirmation")] == [8]
    html = (workdir / "studies" / "c" / "report.html").read_text()
    assert "confirmed: the long run completed" in html
    again = run_cli("confirm", "c", "--steps", "8", cwd=workdir)
    assert again.returncode == 0 and "already confirmed at 8 steps: 8 ok" in again.stdout  # nothing ran twice
    exported = run_cli("export", "c", "--format", "json", cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    settings = json.loads(next((workdir / "studies" / "c" / "exports").glob("*.json")).read_text())
    assert settings["provenance"]["confirmation"]["steps"] == 8


@pytest.mark.slow
def test_export_refuses_a_failed_confirmation_and_picks_a_confirmed_trial(confirmed_study):
    workdir, _, _ = confirmed_study
    study = optuna.load_study(study_name="c", storage="sqlite:///studies/c.db")
    front = [t.number for t in study.best_trials]
    confirmed = [int(k.split(":")[1]) for k in study.user_attrs if k.startswith("confirmation:")]
    # The stored record of a long run that diverged, as 'sweep confirm' writes it (the contract's format).
    failed = {
        "steps": 20,
        "status": "diverged",
        "reason": "diverged at step 12: the probe loss went up",
        "fail_step": 12,
        "steps_done": 12,
    }
    study.set_user_attr(f"confirmation:{confirmed[0]}", failed)
    out = run_cli("export", "c", "--trial", str(confirmed[0]), cwd=workdir)
    assert out.returncode == 2 and "failed its confirmation (diverged at step 12 of 20 steps" in out.stderr
    others = [n for n in front if n != confirmed[0]]
    if others:  # the pick avoids the failed trial
        picked = run_cli("export", "c", "--format", "json", cwd=workdir)
        assert picked.returncode == 0 and f"#{others[0]}" in picked.stdout, picked.stdout
        notes = json.loads(next((workdir / "studies" / "c" / "exports").glob("*.json")).read_text())["notes"]
        assert any("not confirmed at a long horizon" in n for n in notes)


@pytest.mark.slow
def test_confirm_bad_input_is_one_line(confirmed_study):
    workdir, _, _ = confirmed_study
    for argv, needle in (
        (["--trials", "x"], "--trials: 'x' is not a list"),
        (["--trials", "99"], "no trial 99"),
        (["--steps", "0"], "--steps: 0 is not a number of steps"),
        (["--steps", "2"], "a 2-step confirmation is not longer than trial"),  # the trials ran 2 steps
        (["--trials", ""], "--trials: '' is not a list"),  # not the default pick (an unset variable in a script)
    ):
        out = run_cli("confirm", "c", *argv, cwd=workdir)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def _config(model, **kw) -> TrialConfig:
    return tiny_trial_config(model, **{**dict(max_steps=8, trial_timeout_s=300.0, per_device_train_batch_size=1), **kw})


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_a_run_that_cannot_diverge_scores_zero(tiny_model, tmp_path, batch):
    result = run_trial(
        _config(tiny_model, learning_rate=1e-9, per_device_train_batch_size=batch, lora_dropout=0.1),
        tmp_path,
        model_path=str(tiny_model),
    )
    assert result.status == "complete", result.reason
    assert result.constant.instability is not None and result.constant.instability <= 0.05, (
        result.constant.instability_components
    )
    assert len(set(result.constant.probe_loss_trace)) == 1  # the same samples, the same weights: the same loss
    assert result.constant.instability_components["loss_spike"] > 0  # the training loss still moves with the batches


@pytest.mark.slow
def test_a_run_whose_probe_loss_rises_and_stays_is_diverged(tmp_path):
    # The built-in model (a real pretrained Llama) at learning rate 2e-2 with lora_alpha/r 8: the training loss goes
    # from about 5 to 9-27 within a few steps and stays there, without a NaN. The tests' tiny random model cannot
    # show this: its loss starts at ln(vocabulary), as bad as uniform guessing.
    from sweeper.model import resolve_model

    spec = ModelSpec()
    config = TrialConfig(
        r=8,
        lora_alpha_ratio=8.0,
        learning_rate=2e-2,
        bnb_4bit_compute_dtype="float32",  # bfloat16 steps are ~7x slower on a CPU without AVX512-BF16
        max_seq_length=64,
        max_steps=24,
        memory_limit_gib=4.0,
        trial_timeout_s=900.0,
        model=spec,
        dataset=DatasetSpec(max_samples=64),
    )
    result = run_trial(config, tmp_path, model_path=resolve_model(spec))
    assert result.status == "diverged", result.reason
    assert result.fail_step is not None and result.fail_step < 24
    assert f"diverged at step {result.fail_step}" in result.reason and "probe loss" in result.reason
    assert all(x is not None for x in result.constant.loss_trace)  # no NaN: the probe caught it
    assert result.constant.instability is not None and result.constant.instability > 0.5


@pytest.mark.slow
def test_the_probe_does_not_change_training(tiny_model, tmp_path):
    # The same trial with the probe turned off (a diagnostic setting of the job) and with it at every step: the
    # training trace must be the same bit for bit (a probe in eval mode made bitsandbytes repack its CPU weights and
    # changed it).
    from sweeper.trial import Measures
    from sweeper.trial._job import ProbeSettings

    config = _config(tiny_model, learning_rate=2e-3, bnb_4bit_compute_dtype="bfloat16", max_steps=6)
    off = run_trial(config, tmp_path / "off", model_path=str(tiny_model), measures=Measures(probe=None))
    every = Measures(probe=ProbeSettings(interval_steps=1))
    on = run_trial(config, tmp_path / "on", model_path=str(tiny_model), measures=every)
    assert off.status == on.status == "complete", (off.reason, on.reason)
    assert off.constant.probe_steps == [] and off.constant.instability is None
    assert on.constant.probe_steps == [0, 1, 2, 3, 4, 5, 6]
    assert (
        on.constant.loss_trace == off.constant.loss_trace
        and on.constant.grad_norm_trace == off.constant.grad_norm_trace
    )


@pytest.mark.slow
def test_a_setup_error_is_never_a_configurations_confirmation(tiny_model, workdir):
    """The data file moved away after the sweep: 'sweep confirm' says so in one line before anything runs (exit 2),
    the earlier confirmation stands and the export still takes the trial; once the file is back the same command
    runs. A run failure stored by an older sweeper ('error@0') is no outcome either: it blocks neither."""
    from sweeper.study._snapshot import confirmations
    from sweeper.testing import clean_rows, write_jsonl

    data = write_jsonl(workdir / "train.jsonl", clean_rows() * 4)
    space = tiny_space(tiny_model, name="s", search={"r": [4, 8]}, training={"max_steps": 2})
    space["dataset"] = {"path": str(data), "max_samples": 32}
    path = write_space(workdir, space)
    assert run_cli("run", str(path), cwd=workdir).returncode == 0
    first = run_cli("confirm", "s", "--steps", "4", cwd=workdir)
    assert first.returncode == 0, first.stderr
    study = optuna.load_study(study_name="s", storage="sqlite:///studies/s.db")
    [(number, kept)] = confirmations(study).items()
    assert kept.passed and kept.steps == 4

    data.rename(workdir / "elsewhere.jsonl")
    out = run_cli("confirm", "s", "--trials", str(number), "--steps", "6", cwd=workdir)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "train.jsonl" in lines[0], out.stdout + out.stderr
    assert confirmations(optuna.load_study(study_name="s", storage="sqlite:///studies/s.db"))[number] == kept
    assert run_cli("export", "s", "--trial", str(number), cwd=workdir).returncode == 0

    (workdir / "elsewhere.jsonl").rename(data)
    again = run_cli("confirm", "s", "--trials", str(number), "--steps", "6", cwd=workdir)
    assert again.returncode == 0 and "confirmed: 6 steps complete" in again.stdout, again.stdout + again.stderr

    # What an older sweeper stored for such an attempt: not an outcome, so neither refused nor skipped.
    study = optuna.load_study(study_name="s", storage="sqlite:///studies/s.db")
    study.set_user_attr(
        f"confirmation:{number}", {"steps": 8, "status": "error", "reason": "error at step 0", "fail_step": 0}
    )
    assert number not in confirmations(study)
    assert run_cli("export", "s", "--trial", str(number), cwd=workdir).returncode == 0
    rerun = run_cli("confirm", "s", "--trials", str(number), "--steps", "8", cwd=workdir)
    assert rerun.returncode == 0 and "already confirmed" not in rerun.stdout, rerun.stdout


@pytest.mark.slow
def test_confirm_in_an_unwritable_studies_folder_is_one_line(confirmed_study):
    import os

    workdir, _, _ = confirmed_study
    folder = workdir / "studies" / "c"
    os.chmod(folder, 0o500)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
        out = run_cli("confirm", "c", "--steps", "9", cwd=workdir)
    finally:
        os.chmod(folder, 0o755)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "not writable" in lines[0] and "Traceback" not in out.stderr


@pytest.mark.slow
def test_confirm_as_exported_runs_the_exports_effective_batch_and_the_export_says_so(confirmed_study):
    workdir, _, confirm = confirmed_study
    # the fixture's confirmation ran the trial's own effective batch and said what the export trains at
    assert "the trial's; the export trains at 16: --as-exported runs that" in confirm.stdout
    study = optuna.load_study(study_name="c", storage="sqlite:///studies/c.db")
    (number,) = [int(k.split(":")[1]) for k in study.user_attrs if k.startswith("confirmation:")]
    first = run_cli("export", "c", "--trial", str(number), "-o", "before", cwd=workdir)
    assert first.returncode == 0, first.stderr
    before = " ".join((workdir / "before.py").read_text().replace("#", "").split())
    assert "its confirmation ran at 1, not as exported ('sweep confirm --as-exported' runs it)" in before
    out = run_cli("confirm", "c", "--trials", str(number), "--steps", "8", "--as-exported", cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "effective batch 16, as exported (the trial ran 1)" in out.stdout and "confirmed: 8 steps" in out.stdout
    study = optuna.load_study(study_name="c", storage="sqlite:///studies/c.db")
    record = study.user_attrs[f"confirmation:{number}"]
    assert record["as_exported"] is True and record["effective_batch_size"] == 16 and record["steps_done"] == 8
    result = workdir / "studies" / "c" / "trials" / str(number) / "confirm-8-as-exported" / "result.json"
    assert json.loads(result.read_text())["steps_done"] == 8
    again = run_cli("export", "c", "--trial", str(number), "-o", "after", cwd=workdir)
    assert again.returncode == 0, again.stderr
    after = json.loads((workdir / "after.json").read_text())
    assert after["training_args"]["gradient_accumulation_steps"] == 16
    assert after["provenance"]["confirmation"]["as_exported"] is True
    assert "its confirmation ran as exported" in " ".join((workdir / "after.py").read_text().replace("#", "").split())


def test_what_confirm_runs_by_default_given_numbers_and_the_front(workdir):
    """``sweep confirm``'s choice (:func:`sweeper.sweep.trials_to_confirm`): the numbers given as they are; ``--front``
    every front trial in the candidates' order; the safe pick is the first candidate; a study with no complete trial
    is refused in one line naming ``--pick`` and what to do."""
    from sweeper.errors import SpaceError
    from sweeper.study import snapshot
    from sweeper.sweep import candidates, trials_to_confirm
    from sweeper.testing import add_trial, make_study

    read = snapshot(make_study(workdir))
    ranked = [t.number for t in candidates(read)]
    assert ranked and set(ranked) <= {0, 1}  # the front's trials, not the one behind it, the failures or the repeat
    assert trials_to_confirm(read, numbers=[4, 2], front=False, pick="safe") == [4, 2]
    assert trials_to_confirm(read, numbers=None, front=True, pick="safe") == ranked
    assert trials_to_confirm(read, numbers=None, front=False, pick="safe") == ranked[:1]
    empty = optuna.create_study(study_name="none", directions=["minimize", "maximize"])
    add_trial(empty, r=8, batch=2, seq=64, status="oom", peak=3.0)
    with pytest.raises(SpaceError, match=r"^none: --pick: the study has no complete trial to confirm; run more"):
        trials_to_confirm(snapshot(empty), numbers=None, front=False, pick="safe")
