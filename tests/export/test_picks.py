"""The picks a user acts on: headroom in the user's units, the ``safe`` pick (``sweep export``'s default), and each
pick's line saying what it chose among. Real optuna storages, trials stored as the sweep stores them."""

from __future__ import annotations

import json

import pytest

from sweeper.notation import format_headroom
from sweeper.space import parse_space
from sweeper.stability import DEFAULT_LR_CALIBRATION, LrCalibration, headroom_of, margin_of
from sweeper.stability._chance import divergence_chance
from sweeper.study import Confirmation, snapshot
from sweeper.study._storage import open_study
from sweeper.study.picks import choose
from sweeper.testing import add_trial, run_cli

LR = 2e-4  # sweeper.testing's trials run at the TrialConfig default


#: The fixtures' horizon (``study.confirm_steps``): 120 steps, at which a margin of 3.2x likely fails (its edge below
#: its own rate), 10.5x is undecided and 18.9x is safe.
HORIZON = 120


def _stress(margin_steps: int | None, *, calibration: LrCalibration = DEFAULT_LR_CALIBRATION) -> dict:
    """The stored stress fields of a stress phase that diverged after ``margin_steps`` steps (None: capped)."""
    m = margin_of(LR, "cap" if margin_steps is None else "diverged", margin_steps, calibration=calibration)
    return {
        "lr_ceiling": m.lr_ceiling,
        "stability_margin": m.stability_margin,
        "margin_capped": m.margin_capped,
        "predicted_max_lr": m.predicted_max_lr,
        "stability_margin_low": m.stability_margin_low,
        "stability_margin_high": m.stability_margin_high,
        "predicted_max_lr_low": m.predicted_max_lr_low,
        "predicted_max_lr_high": m.predicted_max_lr_high,
        "predicted_max_lr_source": m.predicted_max_lr_source,
        "stress_stop": "cap" if margin_steps is None else "diverged",
    }


def test_headroom_is_the_predicted_rate_over_the_trials_and_near_edge_follows_its_interval():
    class Stress:
        predicted_max_lr, predicted_max_lr_low, predicted_max_lr_high = 3e-4, 3e-4 / 2.24, 3e-4 * 2.24
        margin_capped, predicted_max_lr_source = False, DEFAULT_LR_CALIBRATION.source

    h = headroom_of(1e-4, Stress)
    assert h is not None and h.value == pytest.approx(3.0) and h.low == pytest.approx(3 / 2.24)
    assert not h.near_edge and h.safety_factor == pytest.approx(2.24)
    assert format_headroom(h) == "3.0x (1.3-6.7x)"
    Stress.predicted_max_lr, Stress.predicted_max_lr_low = 2e-4, 2e-4 / 2.24
    near = headroom_of(1e-4, Stress)
    assert near is not None and near.near_edge and format_headroom(near).endswith(", near edge)")
    # A study's own calibration with a narrow spread: its interval alone sets the safety factor (here 1.5)...
    Stress.predicted_max_lr, Stress.predicted_max_lr_low = 1.8e-4, 1.8e-4 / 1.5
    Stress.predicted_max_lr_source = "calibrated on this study's model (4 edges, spread x1.5)"
    Stress.predicted_max_lr_calibrated = True  # stored as data, not read from the source's words
    calibrated = headroom_of(1e-4, Stress)
    assert calibrated is not None and calibrated.calibrated and not calibrated.near_edge
    # ...while an uncalibrated prediction needs at least 2x, whatever its interval says
    Stress.predicted_max_lr_source = "calibrated on this study's model (its words alone)"
    Stress.predicted_max_lr_calibrated = False
    assert not headroom_of(1e-4, Stress).calibrated
    Stress.predicted_max_lr_source = DEFAULT_LR_CALIBRATION.source
    uncalibrated = headroom_of(1e-4, Stress)
    assert uncalibrated is not None and uncalibrated.safety_factor == 2.0 and uncalibrated.near_edge
    # capped: a lower bound, no high end; unknown rate or prediction: no headroom
    Stress.margin_capped, Stress.predicted_max_lr_high = True, None
    capped = headroom_of(1e-4, Stress)
    assert capped is not None and capped.high is None and format_headroom(capped).startswith(">=")
    assert headroom_of(None, Stress) is None and headroom_of(0.0, Stress) is None


@pytest.fixture
def picks_study(tmp_path, monkeypatch):
    """Five complete trials, four on the front: #0 the least memory but near its edge (margin 3.2x: headroom 0.5x),
    #1 safe but slow (10% against the fastest safe trial's 45%), #2 safe and learning, #3 within the memory noise of
    #2 and learning faster, #4 the most stable and the most memory (dominated by #3)."""
    monkeypatch.chdir(tmp_path)
    space = parse_space({"study": {"name": "p"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/p.db", "p", 8)
    study.set_user_attr("confirm_steps", HORIZON)  # the horizon the chance is given at (sweep run records it)
    rows = [  # (peak GiB, stress steps to the edge or None for capped, learning progress)
        (1.00, 2, 0.40),
        (1.05, 5, 0.10),
        (1.08, 8, 0.35),
        (1.10, None, 0.45),
        (1.50, None, 0.36),
    ]
    for i, (peak, steps, progress) in enumerate(rows):
        stress = _stress(steps)
        add_trial(
            study,
            r=(4, 8, 16, 4, 8)[i],
            batch=(1, 1, 1, 2, 2)[i],
            seq=64,
            status="complete",
            peak=peak,
            instability=1 / stress["stability_margin"],
            extra={**stress, "learning_progress": progress},
        )
    return study


def test_the_safe_pick_is_the_least_memory_safely_below_its_edge_that_learns(picks_study):
    snap = snapshot(picks_study)
    assert [t.number for t in snap.front] == [0, 1, 2, 3]
    assert [t.headroom.near_edge for t in snap.front] == [True, False, False, False]
    safe = choose(snapshot(picks_study), "safe")
    # #0 is near its edge, #1 learns under half as fast as #3; #2 has the least memory of the rest, and #3, within
    # the memory noise of it (1.10 against 1.08 GiB), learns more
    assert safe.trial.number == 3 and safe.line == "safe #3, among the 5 complete trials"
    assert choose(snapshot(picks_study), "min-memory").line.startswith(
        "min-memory #0, among the front's 4 trials; above its predicted edge (headroom 0.9x (0.6-1.0x)): predicted to "
        "fail at its own learning rate; P(diverges within 120 steps) 74% (44-91%); safe at learning_rate 5.97e-05"
    )  # past it by the prediction, not only near it, with the rate that would be safe
    fastest = max(t.result.constant.learning_progress for t in snap.front if not t.headroom.near_edge)
    assert safe.trial.result.constant.learning_progress >= 0.5 * fastest


def test_the_safe_pick_when_no_safe_trial_learns(tmp_path, monkeypatch):
    """Every safe trial's probe loss rose (negative learning progress, as fp16 runs at a high rate do): no share of
    the fastest is a bar, so the least memory among them is taken (a crash before: 'min() arg is an empty
    sequence')."""
    monkeypatch.chdir(tmp_path)
    space = parse_space({"study": {"name": "q"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/q.db", "q", 8)
    for i, (peak, progress) in enumerate([(1.00, -0.2), (1.20, -0.5)]):
        stress = _stress(None)
        extra = {**stress, "learning_progress": progress}
        add_trial(study, r=(4, 8)[i], batch=1, seq=64, status="complete", peak=peak, instability=0.01, extra=extra)
    assert choose(snapshot(study), "safe").trial.number == 0


def test_a_pick_made_among_confirmed_trials_says_so_and_names_the_better_unconfirmed_one(picks_study):
    done = Confirmation(steps=300, status="complete", steps_done=300)
    picks_study.set_user_attr("confirmation:2", json.loads(json.dumps(done.to_dict())))
    chosen = choose(snapshot(picks_study), "min-memory")
    assert chosen.trial.number == 2
    assert chosen.line == (
        "min-memory #2, among the 1 confirmed trial of the front's 4 trials; #0 uses 0.080 GiB less and is unconfirmed"
    )
    assert choose(snapshot(picks_study), "safe").line.startswith(
        "safe #2, among the 1 confirmed trial of the 5 complete trials; "
    )
    assert (
        "#3 would be the safe pick and is unconfirmed (sweep confirm p --trials 3)"
        in choose(snapshot(picks_study)).line
    )
    # what sweep confirm --pick runs next: the pick among every trial, confirmed or not
    assert choose(snapshot(picks_study), "min-memory", prefer_confirmed=False).trial.number == 0


def test_export_writes_the_safe_pick_by_default_and_says_what_it_chose_among(picks_study, tmp_path):
    out = run_cli("export", str(tmp_path / "p.db"), "--format", "json", "-o", "cfg", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("export  safe #3, among the 5 complete trials (peak 1.100 GiB, margin >=643x")
    provenance = json.loads((tmp_path / "cfg.json").read_text())["provenance"]
    assert provenance["trial"] == 3 and provenance["near_edge"] is False and provenance["headroom_high"] is None
    edge = divergence_chance(LR, 643.0, True, HORIZON).predicted_max_lr  # the edge at the study's horizon
    assert provenance["headroom"] == pytest.approx(edge / LR, rel=0.01) and provenance["stability_call"] == "safe"
    assert provenance["horizon_steps"] == HORIZON and provenance["p_diverge"] < 0.001
    report = run_cli("report", str(tmp_path / "p.db"), "--json", cwd=tmp_path)
    data = json.loads(report.stdout)
    assert data["picks"]["safe"] == 3 and data["pick_lines"]["safe"] == "safe #3, among the 5 complete trials"
    assert [f["near_edge"] for f in data["front"]] == [True, False, False, False]


def test_the_safe_pick_looks_beyond_the_front(tmp_path, monkeypatch):
    # Trial 0 is lighter and its margin (10.5x) is within the seed noise of trial 1's (18.9x): trial 1 is off the
    # front. But trial 0 is near its edge (headroom 1.5x) and trial 1 is not (2.7x): the safe pick is trial 1.
    monkeypatch.chdir(tmp_path)
    space = parse_space({"study": {"name": "b"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/b.db", "b", 8)
    study.set_user_attr("confirm_steps", HORIZON)
    for r, peak, steps in ((4, 1.00, 4), (8, 1.10, 5)):
        stress = _stress(steps)
        add_trial(study, r=r, batch=1, seq=64, status="complete", peak=peak, instability=1 / stress["stability_margin"],
                  extra={**stress, "learning_progress": 0.3})  # fmt: skip
    snap = snapshot(study)
    assert [t.number for t in snap.front] == [0] and [t.headroom.near_edge for t in snap.trials] == [True, False]
    assert choose(snapshot(study), "safe").line == "safe #1, among the 2 complete trials"
    assert choose(snapshot(study), "knee").line.startswith(
        "knee #0, among the front's 1 trial; undecided at its own rate (headroom 1.6x (1.3-3.2x)); P(diverges within "
        "120 steps) 2.4% (1.0-5.4%); safe at learning_rate 0.000194"
    )
    # the report shows the safe pick beside the front, and the front row's tied_with names it as the table does
    data = json.loads(run_cli("report", str(tmp_path / "b.db"), "--json", cwd=tmp_path).stdout)
    assert [(f["number"], f["tied_with"]) for f in data["front"]] == [(0, [1])] and data["picks"]["safe"] == 1


def test_a_confirmed_trial_worse_beyond_the_noise_is_not_the_pick(picks_study):
    """A new user confirmed the front's least stable trial (3.2x, headroom 0.5x) and `--pick most-stable` exported
    it, over a 110x trial, because picks preferred confirmed trials: a confirmation is worth a tie, not a worse
    trial."""
    done = Confirmation(steps=300, status="complete", steps_done=300)
    picks_study.set_user_attr("confirmation:0", json.loads(json.dumps(done.to_dict())))  # the near-edge one
    stable = choose(snapshot(picks_study), "most-stable")
    assert stable.trial.number != 0, stable.line
    assert "unconfirmed (sweep confirm p --trials" in stable.line and "the confirmed #0 is not within the noise" in (
        stable.line
    )
    # min-memory: #0 is the lightest anyway
    assert choose(snapshot(picks_study), "min-memory").trial.number == 0


def test_the_exports_confirmation_note_says_whether_it_ran_as_exported(picks_study, tmp_path):
    # Trial 3 trained at batch 1; the export keeps target_effective_batch_size 16 through gradient accumulation.
    cases = ((1, False, "at effective batch 1, not as exported (16;"), (16, True, "as exported"))
    for batch, as_exported, said in cases:
        done = Confirmation(steps=300, status="complete", steps_done=300, effective_batch_size=batch,
                            as_exported=as_exported)  # fmt: skip
        picks_study.set_user_attr("confirmation:3", json.loads(json.dumps(done.to_dict())))
        out = run_cli("export", str(tmp_path / "p.db"), "--trial", "3", "--format", "json", "-o", "c", "--force",
                      cwd=tmp_path)  # fmt: skip
        assert out.returncode == 0, out.stderr
        notes = [n for n in json.loads((tmp_path / "c.json").read_text())["notes"] if n.startswith("confirmed:")]
        assert len(notes) == 1 and f"completed {said}" in notes[0], notes


def test_the_horizon_of_the_users_run_gives_the_chance_call_and_pick_for_that_run(tmp_path, monkeypatch):
    """``--horizon STEPS`` (report, export) and the ``max_steps`` of the file ``--onto`` writes: the chance of
    diverging, its call and the safe pick for the user's run length, not the study's 120 steps."""
    monkeypatch.chdir(tmp_path)
    space = parse_space({"study": {"name": "h"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/h.db", "h", 8)
    study.set_user_attr("confirm_steps", HORIZON)
    stress = _stress(6)  # 34x: safe for 120 steps, not for 2000
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=1 / stress["stability_margin"],
              extra={**stress, "learning_progress": 0.3})  # fmt: skip
    short = snapshot(study).trials[0].stability
    long = snapshot(study, horizon_steps=2000).trials[0].stability
    assert (short.horizon_steps, short.stability_call) == (HORIZON, "safe")
    assert (long.horizon_steps, long.stability_call) != (2000, "safe") and long.p_diverge > short.p_diverge
    assert long.safe_learning_rate < LR < short.safe_learning_rate
    data = json.loads(run_cli("report", str(tmp_path / "h.db"), "--json", "--horizon", "2000", cwd=tmp_path).stdout)
    assert data["front"][0]["horizon_steps"] == 2000 and data["front"][0]["p_diverge"] == pytest.approx(long.p_diverge)
    bad = run_cli("report", str(tmp_path / "h.db"), "--horizon", "0", cwd=tmp_path)
    assert bad.returncode == 2 and "--horizon: expected a whole number of steps, at least 1, got '0'" in bad.stderr
    user = tmp_path / "run.json"
    user.write_text(json.dumps({"learning_rate": LR, "max_steps": 2000, "per_device_train_batch_size": 1}))
    out = run_cli("export", str(tmp_path / "h.db"), "--onto", str(user), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "the chance of diverging is for its max_steps, 2000 steps" in out.stdout
    # the rate written onto the file is the one safe for its 2000 steps, under the trial's own
    assert json.loads(user.read_text())["learning_rate"] == pytest.approx(long.safe_learning_rate, rel=0.01)
