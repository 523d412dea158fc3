"""``sweep calibrate``: the study's own factor from ``lr_ceiling`` to ``predicted_max_lr``.

The bisection's arithmetic on stored runs (fast), and a real calibration on the tests' tiny Llama in float16 compute,
whose ramp and long runs end in NaN (an fp16 overflow) at rates far above any user's: the factor is stored, every
view of the study then uses it and says so, a second call runs nothing more, and a held-out trial's edge, bisected
apart and never used for the factor, lands inside the interval the factor gave it.
"""

import json
import math
import shutil

import optuna
import pytest

from sweeper.stability import DEFAULT_LR_CALIBRATION, LrCalibration, lr_calibration_of
from sweeper.sweep._lr_calibration import Edge, EdgeRun, bracket, calibration_from, next_multiple
from sweeper.testing import run_cli, tiny_space, write_space


def _edge(trial: int, held: float, ceiling: float) -> Edge:
    return Edge(trial=trial, learning_rate=1e-3, held=held, failed=held * 1.5, lr_ceiling=ceiling)


def test_the_factor_is_the_geometric_mean_of_the_edges_with_their_spread():
    edges = [_edge(0, 10.0, 0.1), _edge(1, 20.0, 0.1), _edge(2, 40.0, 0.1)]
    found = calibration_from(edges, 1.5)
    assert found.factor == pytest.approx(math.sqrt(1.5) * 20.0 * 1e-3 / 0.1)
    assert found.gsd == pytest.approx(2.0)  # factors 2x apart each: log-SD ln 2
    assert found.edges == 3 and found.source == "calibrated on this study's model (3 edges, spread x3.9)"
    one = calibration_from(edges[:1], 1.5)  # one edge says nothing of the spread: the built-in factor's at least
    assert one.gsd == DEFAULT_LR_CALIBRATION.gsd and "1 edge," in one.source
    same = calibration_from([_edge(0, 10.0, 0.1), _edge(1, 10.0, 0.1), _edge(2, 10.0, 0.1)], 1.5)
    assert same.gsd == pytest.approx(math.sqrt(1.5))  # never tighter than the bracket itself
    with pytest.raises(ValueError):
        calibration_from([], 1.5)


def test_the_bisection_starts_at_the_prediction_brackets_by_4x_then_halves_in_log_space():
    class T:  # a stored trial's two fields the bisection reads
        number = 0

        class config:
            learning_rate = 1e-3

        class result:
            class stress:
                lr_ceiling = 1e-3 * 100

    def run(m: float, failed: bool) -> EdgeRun:
        return EdgeRun(trial=0, multiple=m, steps=16, status="nan" if failed else "complete", fail_step=None)

    start = next_multiple(T, {}, 1.5)  # type: ignore[arg-type]
    assert start == pytest.approx(100 * DEFAULT_LR_CALIBRATION.factor, rel=1e-3)
    runs = {start: run(start, False)}
    assert next_multiple(T, runs, 1.5) == pytest.approx(4 * start, rel=1e-3)  # held: 4x up
    runs[4 * start] = run(4 * start, True)
    assert bracket(runs) == (start, 4 * start)
    middle = next_multiple(T, runs, 1.5)  # type: ignore[arg-type]
    assert middle == pytest.approx(2 * start, rel=1e-3)
    runs[middle] = run(middle, True)
    runs[next_multiple(T, runs, 1.5)] = run(math.sqrt(2) * start, False)  # type: ignore[index, arg-type]
    assert next_multiple(T, runs, 1.5) is None  # sqrt(2) apart: within 1.5
    assert next_multiple(T, {1.0: run(1.0, True), 0.5: EdgeRun(trial=0, multiple=0.5, steps=16, status="oom",
                                                               fail_step=1)}, 1.5) == 0.25  # type: ignore[arg-type]  # fmt: skip


def test_a_stored_calibration_is_read_back_and_a_bad_one_is_ignored():
    good = {"factor": 0.05, "gsd": 1.3, "edges": 3, "source": "calibrated on this study's model (3 edges, spread x1.7)"}
    assert lr_calibration_of(good) == LrCalibration(
        factor=0.05, gsd=1.3, edges=3, source=good["source"], calibrated=True
    )
    assert lr_calibration_of({**good, "gsd": 0.5}) is None and lr_calibration_of({"factor": "x"}) is None
    assert lr_calibration_of(None) is None


@pytest.fixture(scope="module")
def fp16_study(tiny_model, tmp_path_factory):
    """Three configurations of the tiny Llama in float16 compute at learning rate 0.05 (8 steps), whose stress
    phases end in an fp16 overflow: ceilings to calibrate."""
    folder = tmp_path_factory.mktemp("calibrate")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWEEPER_CACHE", str(folder / "cache"))
        space = tiny_space(
            tiny_model,
            name="cal",
            search={"lora_alpha_ratio": [1.0, 4.0, 16.0]},
            training={"max_steps": 8, "learning_rate": 0.05, "bnb_4bit_compute_dtype": "float16"},
            n_trials=3,
        )
        out = run_cli("run", str(write_space(folder, space)), cwd=folder)
        assert out.returncode == 0, out.stderr
    return folder


def _ceilings(folder) -> dict[int, dict]:
    data = json.loads(run_cli("report", "cal", "--json", cwd=folder).stdout)
    return {t["number"]: t for t in data["trials"] if t["lr_ceiling"] is not None}


@pytest.mark.slow
def test_calibrate_stores_the_factor_every_view_uses_it_and_a_held_out_edge_lands_inside(fp16_study, workdir):
    shutil.copytree(fp16_study, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("cache"))
    before = _ceilings(workdir)
    assert len(before) >= 3, before  # every configuration's ramp found a ceiling
    assert all(t["predicted_max_lr_source"].startswith("fitted on SmolLM2-135M") for t in before.values())
    used, held_out = sorted(before)[:2], sorted(before)[2]
    args = ("--steps", "12", "--resolution", "2", "--runs", "12")
    out = run_cli("calibrate", "cal", "--trials", ",".join(map(str, used)), *args, cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "factor  " in out.stdout and "calibrated on this study's model (2 edges" in out.stdout, out.stdout
    study = optuna.load_study(study_name="cal", storage="sqlite:///studies/cal.db")
    stored = study.user_attrs["lr_calibration"]
    assert stored["edges"] == 2 and [e["trial"] for e in stored["measured"]] == used
    runs = [k for k in study.user_attrs if k.startswith("lr_calibration_run:")]
    after = _ceilings(workdir)
    for number, t in after.items():  # every trial's predicted_max_lr now comes from the study's factor
        assert t["predicted_max_lr_source"].startswith("calibrated on this study's model (2 edges")
        assert t["predicted_max_lr"] == pytest.approx(t["lr_ceiling"] * stored["factor"])
    report = run_cli("report", "cal", cwd=workdir)
    assert report.returncode == 0
    again = run_cli("calibrate", "cal", "--trials", ",".join(map(str, used)), *args, cwd=workdir)
    assert again.returncode == 0 and "calibrate #" not in again.stdout  # every edge bracketed: nothing ran
    assert len([k for k in optuna.load_study(study_name="cal", storage="sqlite:///studies/cal.db").user_attrs
                if k.startswith("lr_calibration_run:")]) == len(runs)  # fmt: skip

    # The held-out trial's edge, bisected in a copy so that it never enters the factor, within its interval.
    apart = workdir / "apart"
    shutil.copytree(workdir / "studies", apart / "studies")
    shutil.copy(workdir / "space.yaml", apart / "space.yaml")
    check = run_cli("calibrate", "cal", "--trials", str(held_out), *args, cwd=apart)
    assert check.returncode == 0, check.stderr
    [edge] = [e for e in json.loads(json.dumps(optuna.load_study(
        study_name="cal", storage=f"sqlite:///{apart}/studies/cal.db").user_attrs["lr_calibration"]["measured"]))
        if e["trial"] == held_out]  # fmt: skip
    predicted = after[held_out]
    assert predicted["predicted_max_lr_low"] <= edge["edge_lr"] <= predicted["predicted_max_lr_high"], (edge, predicted)


@pytest.mark.slow
def test_calibrate_bad_input_is_one_line_and_writes_nothing(fp16_study, workdir):
    shutil.copytree(fp16_study, workdir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("cache"))
    for argv, needle in (
        (["--trials", "x"], "--trials: 'x' is not a list"),
        (["--trials", "99"], "no trial 99"),
        (["--steps", "0"], "--steps: 0 is not a number of steps"),
        (["--runs", "0"], "--runs: 0 is not a number of runs"),
        (["--hours", "0"], "--hours: 0.0 is not a duration"),
        (["--resolution", "1"], "--resolution: 1.0 must be above 1"),
        # an empty list (an unset variable in a script) is refused, not read as the default choice
        (["--trials", ""], "--trials: '' is not a list of trial numbers"),
        # a run no longer than the trials it calibrates would store a factor from 1-step runs (issue 48: 5.48)
        (["--steps", "1"], "a 1-step calibration run is not longer than trial"),
        (["--steps", "8"], "a 8-step calibration run is not longer than trial"),
    ):
        out = run_cli("calibrate", "cal", *argv, cwd=workdir)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], (argv, out.stderr)
    study = optuna.load_study(study_name="cal", storage="sqlite:///studies/cal.db")
    assert not [k for k in study.user_attrs if k.startswith("lr_calibration")]


def test_a_studys_calibration_remakes_every_predicted_max_lr_and_says_so(tmp_path):
    from sweeper.space import parse_space
    from sweeper.stability import DEFAULT_HORIZON_STEPS
    from sweeper.stability._chance import DIVERGENCE_MODEL, divergence_chance
    from sweeper.study import snapshot
    from sweeper.study._storage import open_study
    from sweeper.testing import add_trial

    space = parse_space({"study": {"name": "cal"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/cal.db", "cal", 2)
    ceiling = 2e-4 * 5.832  # a trial at the default learning rate whose stress phase diverged at step 3
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=1 / 5.832,
              extra={"lr_ceiling": ceiling, "predicted_max_lr": ceiling * 0.144})  # fmt: skip
    [before] = snapshot(study).trials
    # a trial stored with the pre-issue-66 factor is read on the chance model's scale: the edge at the horizon
    edge = divergence_chance(2e-4, 5.832, False, DEFAULT_HORIZON_STEPS)
    assert before.result.stress.predicted_max_lr == pytest.approx(edge.predicted_max_lr)
    assert before.result.stress.predicted_max_lr_source == DIVERGENCE_MODEL.source
    assert before.result.stress.predicted_max_lr_low == pytest.approx(edge.predicted_max_lr_low)
    study.set_user_attr(
        "lr_calibration", {"factor": 0.05, "gsd": 1.2, "edges": 3, "source": "calibrated on this study's model (3)"}
    )
    [after] = snapshot(study).trials
    stress = after.result.stress
    assert stress.predicted_max_lr == pytest.approx(ceiling * 0.05)
    assert (stress.predicted_max_lr_low, stress.predicted_max_lr_high) == pytest.approx(
        (ceiling * 0.05 / 1.2**1.96, ceiling * 0.05 * 1.2**1.96)
    )
    assert stress.predicted_max_lr_source == "calibrated on this study's model (3)"
    assert after.result.stress.stability_margin == before.result.stress.stability_margin  # the margin stays
    assert after.result.stress.p_diverge == pytest.approx(before.result.stress.p_diverge)  # no mu stored: built-in
    # a calibration that refitted the chance's intercept (issue 66): every trial's chance from the study's own model
    study.set_user_attr(
        "lr_calibration",
        {"factor": 0.05, "gsd": 1.2, "edges": 3, "source": "calibrated on this study's model (3)", "mu": 4.0,
         "mu_se": 0.2},
    )  # fmt: skip
    [refit] = snapshot(study).trials
    assert refit.result.stress.p_diverge < before.result.stress.p_diverge  # runs fail later on this model
