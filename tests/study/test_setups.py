"""A study knows what its measurements mean: the settings that change what a trial measures are kept in the study, a
resume under other settings is refused unless ``--new-setup`` records them, and readers compare like with like."""

from __future__ import annotations

import json
import shutil

import optuna
import pytest

from sweeper.errors import StudyError
from sweeper.space import load_space
from sweeper.storage import StudyAttr
from sweeper.study._setups import choose_setup, differences, space_settings
from sweeper.study._storage import open_study
from sweeper.testing import run_cli, tiny_space, write_space


def _data(path, n=40, reply="yes"):
    rows = [{"prompt": f"Question {i}: what is {i} plus one?", "completion": f"{i + 1}, {reply}."} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _finished(status, **attrs):
    from optuna.trial import TrialState, create_trial

    state = TrialState.COMPLETE if status == "complete" else TrialState.FAIL
    values = [1.0, 0.1] if status == "complete" else None
    return create_trial(state=state, values=values, user_attrs={"status": status, "setup": 0, **attrs})


def _space(tiny_model, workdir, data, **training):
    space = tiny_space(tiny_model, n_trials=1, training=training)
    space["dataset"]["path"] = str(data)
    return load_space(write_space(workdir, space))


def test_the_first_run_records_the_settings_and_a_resume_with_the_same_ones_is_that_setup(tiny_model, workdir):
    data = _data(workdir / "a.jsonl")
    space = _space(tiny_model, workdir, data)
    url = "sqlite:///studies/s.db"
    study = open_study(space, url, "s")
    assert choose_setup(study, space, url) == 0
    [settings] = study.user_attrs[StudyAttr.SETUPS]
    assert settings["max_steps"] == 3 and settings["dataset.path"] == str(data) and "r" not in settings  # searched
    assert len(settings["dataset.sha256"]) == 64 and "trial_timeout_s" not in settings  # run policy is not setup
    assert choose_setup(open_study(space, url, "s"), space, url) == 0
    # the same bytes under another path (a copied project folder): the same data, the same setup
    copy = shutil.copy(data, workdir / "copy.jsonl")
    assert choose_setup(open_study(space, url, "s"), _space(tiny_model, workdir, copy), url) == 0


def test_a_resume_with_other_settings_is_refused_with_each_difference(tiny_model, workdir):
    data = _data(workdir / "a.jsonl")
    url = "sqlite:///studies/s.db"
    space = _space(tiny_model, workdir, data)
    study = open_study(space, url, "s")
    choose_setup(study, space, url)
    other = _data(workdir / "b.jsonl", reply="no")
    changed = _space(tiny_model, workdir, other, max_steps=4)
    # Nothing measured yet (only an interrupted trial): nothing to mix, the settings are replaced.
    study.add_trial(_finished("fail", interrupted=True))
    assert choose_setup(open_study(changed, url, "s"), changed, url) == 0
    assert choose_setup(open_study(space, url, "s"), space, url) == 0  # and back
    study.add_trial(_finished("complete"))
    with pytest.raises(StudyError) as raised:
        choose_setup(open_study(changed, url, "s"), changed, url)
    line = str(raised.value)
    assert "\n" not in line and line.startswith(f"{changed.path}: study 's' in {url} was measured with other settings")
    assert f"dataset.path {other} (was {data})" in line and "max_steps 4 (was 3)" in line
    assert "--study NAME" in line and "--new-setup" in line
    study = optuna.load_study(study_name="s", storage=url)
    assert len(study.user_attrs[StudyAttr.SETUPS]) == 1  # nothing recorded by the refusal
    # the file changed in place: the content, named
    _data(data, reply="changed")
    again = _space(tiny_model, workdir, data)
    with pytest.raises(StudyError, match=f"the content of {data}"):
        choose_setup(open_study(again, url, "s"), again, url)
    # --new-setup records it; the cap alone starts a setup without the flag
    assert choose_setup(open_study(again, url, "s"), again, url, new_setup=True) == 1
    cap = _space(tiny_model, workdir, data, memory_limit_gib=3)
    study = open_study(cap, url, "s")
    assert choose_setup(study, cap, url) == 2 and study.user_attrs[StudyAttr.CURRENT_SETUP] == 2
    # going back to an earlier setup resumes it
    assert choose_setup(open_study(again, url, "s"), again, url) == 1


def test_differences_ignore_keys_one_side_does_not_know():
    was = {"max_steps": 3, "dataset.path": "/a", "old_key": 1}
    assert differences(was, {"max_steps": 3.0, "dataset.path": "/a", "new_key": 2}) == []
    assert differences(was, {"max_steps": 5, "dataset.path": "/a"}, word="now") == ["max_steps 5 (now 3)"]
    # the same checkpoint in another folder (a copied project) is the same model; another checkpoint is not
    model = {"model.name_or_path": "/old/ckpt", "model.fingerprint": "f1"}
    assert differences(model, {"model.name_or_path": "/new/ckpt", "model.fingerprint": "f1"}) == []
    assert differences(model, {"model.name_or_path": "/new/ckpt", "model.fingerprint": "f2"}) == [
        "model.name_or_path /new/ckpt (was /old/ckpt)"
    ]


@pytest.mark.slow
def test_a_new_setup_is_kept_apart_in_report_and_export(tiny_model, workdir, monkeypatch):
    """Runs two 3-step trials of the tiny model (about a minute with the stress phase): one per setup."""
    data = _data(workdir / "a.jsonl")
    space = tiny_space(tiny_model, n_trials=1)
    space["dataset"]["path"] = "a.jsonl"  # relative: resolved against the space file's folder
    path = write_space(workdir, space)
    first = run_cli("run", str(path), cwd=workdir)
    assert first.returncode == 0, first.stderr
    refused = run_cli("run", str(path), "--n-trials", "2", "--set", "max_steps=4", cwd=workdir)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "max_steps 4 (was 3)" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    study = optuna.load_study(study_name="t", storage="sqlite:///studies/t.db")
    assert len(study.trials) == 1  # the refusal asked for no trial
    monkeypatch.setenv("SWEEPER_PROGRESS_INTERVAL_S", "1")  # a log's progress line every second, not minute
    second = run_cli("run", str(path), "--n-trials", "2", "--set", "max_steps=4", "--new-setup", cwd=workdir)
    assert second.returncode == 0, second.stderr
    assert "setup   new settings for this study (--new-setup)" in second.stdout
    assert "progress 1/2 trials · 1 running" in second.stdout and "running #1 " in second.stdout
    study = optuna.load_study(study_name="t", storage="sqlite:///studies/t.db")
    assert [t.user_attrs["setup"] for t in study.trials] == [0, 1]
    assert space_settings(load_space(path))["dataset.path"] == str(data)
    report = json.loads(run_cli("report", "t", "--json", cwd=workdir).stdout)
    assert [f["number"] for f in report["front"]] == [1]  # the same r at another horizon is not compared
    assert report["other_setups"].startswith("note    1 measured trial of this study was measured under other")
    assert "max_steps 3 (now 4)" in report["other_setups"]
    assert len(report["trials"]) == 2  # both stay in the tables
    text = run_cli("report", "t", cwd=workdir).stdout
    assert "kept apart" in text
    export = run_cli("export", "t", "--format", "json", cwd=workdir)
    assert export.returncode == 0, export.stderr
    assert "safe #1, among the 1 complete trial" in export.stdout  # trial 0 is of the other setup
    # A run with nothing to run changes nothing of what report and export compare, and says what it did not apply.
    for argv, unapplied in (
        (["--set", "max_steps=4", "--set", "memory_limit_gib=2.4"], "memory_limit_gib 2.4 (measured "),
        ([], "max_steps 3 (measured 4)"),  # going back to the first settings
    ):
        idle = run_cli("run", str(path), "--n-trials", "2", *argv, cwd=workdir)
        assert idle.returncode == 0 and "nothing to run" in idle.stdout, idle.stderr
        assert f"these settings were not applied: {unapplied}" in idle.stdout, idle.stdout
        assert "Pareto front (peak memory vs stability margin), 1 of 1 trial (1 complete trial of other" in idle.stdout
        assert "no complete trial" not in idle.stdout and "nothing to export" not in idle.stdout
        study = optuna.load_study(study_name="t", storage="sqlite:///studies/t.db")
        assert study.user_attrs[StudyAttr.CURRENT_SETUP] == 1 and len(study.user_attrs[StudyAttr.SETUPS]) == 2
