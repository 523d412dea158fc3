"""Objectives are declared once (sweeper.study._objectives): a third one registered in a test gets a front, picks,
report rows and ``--json`` without any other change; dominance and the knee follow each objective's direction."""

import json

import pytest

from sweeper.errors import StudyError
from sweeper.export import pick_trial
from sweeper.report import report_data
from sweeper.space import parse_space
from sweeper.study import Objective, snapshot
from sweeper.study._front import non_dominated
from sweeper.study._objectives import (
    DEFAULT_OBJECTIVES,
    dominates,
    knee_distance,
    register_objective,
    study_objectives,
    unregister_objective,
)
from sweeper.study._snapshot import pareto_front, stored_trials
from sweeper.study._storage import open_study
from sweeper.testing import add_trial, run_cli

THIRD = "learning_speed"


@pytest.fixture
def third_objective():
    """A throwaway third objective, maximized: the trial's learning progress."""
    objective = register_objective(
        Objective(
            name=THIRD,
            direction="maximize",
            unit="",
            description="the probe loss's relative drop over the constant phase (a test's objective)",
            value_of=lambda r: float(r.constant.learning_progress or 0.0),
            shown=lambda _r, v: f"{100 * v:.0f}%",
        )
    )
    yield objective
    unregister_objective(THIRD)


def _space():
    return parse_space({"study": {"name": "three"}, "search": {"r": [4, 8, 16]}}, "space.yaml")


def test_a_registered_third_objective_gets_a_front_picks_report_rows_and_json(tmp_path, third_objective, monkeypatch):
    monkeypatch.chdir(tmp_path)
    study = open_study(
        _space(), "sqlite:///studies/three.db", "three", 4, objectives=["peak_memory_gib", "edge_proximity", THIRD]
    )
    assert [o.name for o in study_objectives(study)] == ["peak_memory_gib", "edge_proximity", THIRD]
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE", "MAXIMIZE"]
    study.set_user_attr("searched", ["r"])
    # (peak GiB, edge_proximity, learning progress): trial 2 is beaten by trial 0 on memory and stability but learns
    # four times as fast, so it is on the three-objective front; trial 3 is beaten by trial 2 on all three. Trial 1's
    # margin (10x) is beyond the seed noise of trial 0's (2x); 2x and 1.7x are tied.
    for r, peak, proximity, progress in (
        (4, 1.0, 0.5, 0.1),
        (8, 1.5, 0.1, 0.1),
        (16, 2.0, 0.5, 0.4),
        (16, 2.5, 0.6, 0.3),
    ):
        add_trial(
            study,
            r=r,
            batch=1,
            seq=64,
            status="complete",
            peak=peak,
            instability=proximity,
            extra={"learning_progress": progress},
        )
    add_trial(study, r=16, batch=4, seq=128, status="oom", peak=3.9)

    assert [t.values for t in stored_trials(study)[:4]] == [
        (1.0, 0.5, 0.1),
        (1.5, 0.1, 0.1),
        (2.0, 0.5, 0.4),
        (2.5, 0.6, 0.3),
    ]
    assert [t.number for t in pareto_front(study)] == [0, 1, 2]
    assert [t.number for t in non_dominated(stored_trials(study), DEFAULT_OBJECTIVES)] == [0, 1]  # blind to learning
    assert pick_trial(snapshot(study), pick="min-memory").number == 0
    assert pick_trial(snapshot(study), pick="most-stable").number == 1
    assert pick_trial(snapshot(study), pick="knee").number in (0, 1, 2)

    data = report_data(snapshot(study)).to_dict()
    assert data["objectives"] == ["peak_memory_gib", "edge_proximity", THIRD]
    assert data["directions"] == ["minimize", "minimize", "maximize"]
    assert [p[THIRD] for p in data["front"]] == [0.1, 0.1, 0.4]
    rows = {row["number"]: row for row in data["trials"]}
    assert rows[2][THIRD] == 0.4 and rows[4][THIRD] is None  # the oom trial has no objective values
    assert THIRD in data["importance"]

    shown = run_cli("report", "three")
    assert shown.returncode == 0, shown.stderr
    header = next(line for line in shown.stdout.splitlines() if line.lstrip().startswith("trial"))
    assert header.split()[-3:] == [THIRD, "tied", "pick"]  # trials 0 and 2 are tied on stability (both 2x)
    assert "40%" in shown.stdout
    as_json = run_cli("report", "three", "--json")
    assert json.loads(as_json.stdout)["front"][2][THIRD] == 0.4


def test_a_study_keeps_its_objectives_and_refuses_unknown_ones(tmp_path, third_objective):
    url = f"sqlite:///{tmp_path}/keep.db"
    open_study(_space(), url, "keep", 4)
    with pytest.raises(StudyError, match="study.objectives: study 'keep' ranks by peak_memory_gib, edge_proximity"):
        open_study(_space(), url, "keep", 4, objectives=["peak_memory_gib", "edge_proximity", THIRD])
    with pytest.raises(StudyError, match="study.objectives: no objective 'speed'; choose among"):
        open_study(_space(), f"sqlite:///{tmp_path}/other.db", "other", 4, objectives=["peak_memory_gib", "speed"])
    with pytest.raises(StudyError, match="the first objective must be peak_memory_gib"):
        open_study(_space(), f"sqlite:///{tmp_path}/other.db", "other", 4, objectives=[THIRD, "edge_proximity"])


def test_dominance_and_the_knee_follow_each_direction(third_objective):
    objectives = (*DEFAULT_OBJECTIVES, third_objective)
    assert dominates((1.0, 0.5, 0.4), (1.0, 0.5, 0.1), objectives)  # learns more, the rest equal
    assert not dominates((1.0, 0.5, 0.1), (1.0, 0.5, 0.4), objectives)
    assert not dominates((1.0, 0.5, 0.1), (1.0, 0.5, 0.1), objectives)  # equal points do not dominate
    # the best corner is the least memory, least proximity and most learning
    distances = knee_distance([(1.0, 0.2, 0.4), (2.0, 0.5, 0.1)], objectives)
    assert distances[0] == 0.0 and distances[1] == pytest.approx(3**0.5)


def test_learning_progress_is_a_third_objective_a_space_asks_for_with_its_noise(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    objectives = ["peak_memory_gib", "edge_proximity", "learning_progress"]
    space = parse_space({"study": {"name": "learn", "objectives": objectives}, "search": {"r": [4, 8, 16]}}, "s.yaml")
    assert space.study.objectives == tuple(objectives)
    study = open_study(space, "sqlite:///studies/learn.db")
    assert [o.name for o in study_objectives(study)] == objectives
    assert [d.name for d in study.directions] == ["MINIMIZE", "MINIMIZE", "MAXIMIZE"]
    study.set_user_attr("searched", ["r"])
    # trial 1 costs more memory and is no more stable than trial 0, but learns beyond the seed noise (0.40 against
    # 0.10): on the front. Trial 2 learns within the noise of trial 0 (0.13): dominated by it as before.
    for r, peak, progress in ((4, 1.0, 0.10), (8, 1.5, 0.40), (16, 2.0, 0.13)):
        add_trial(study, r=r, batch=1, seq=64, status="complete", peak=peak, instability=0.5,
                  extra={"learning_progress": progress})  # fmt: skip
    assert [t.number for t in pareto_front(study)] == [0, 1]
    shown = run_cli("report", "learn")
    assert shown.returncode == 0, shown.stderr
    assert "Pareto front (peak memory vs stability margin vs learning progress)" in shown.stdout
    data = json.loads(run_cli("report", "learn", "--json").stdout)
    assert [p["learning_progress"] for p in data["front"]] == [0.1, 0.4]
    # a name no objective has: one line naming the file and the key
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: {name: bad, objectives: [peak_memory_gib, speed]}\nsearch: {r: [4, 8]}\n")
    out = run_cli("run", str(bad), "--n-trials", "1")
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0, out.stderr
    assert "study.objectives: no objective 'speed'; choose among" in out.stderr and "bad.yaml" in out.stderr


def test_the_front_computed_for_all_pairs_at_once_is_the_pairwise_rule():
    """dominated_beyond_noise (NumPy, all pairs at once) against dominates_beyond_noise pair by pair, on intervals
    built to tie, touch at an end, repeat exactly and differ in the last bits, for 1 to 3 objectives, in blocks
    smaller than the points."""
    import random

    from sweeper.study._objectives import dominated_beyond_noise, dominates_beyond_noise

    rng = random.Random(0)
    for case in range(60):
        k = 1 + case % 3
        grid = [0.0, 1.0, 1.0 + 1e-12, 2.0, 3.5, -1.0]
        points = []
        for _ in range(rng.randint(1, 40)):
            row = []
            for _ in range(k):
                a, b = sorted((rng.choice(grid), rng.choice(grid)))
                row.append((a, b))
            points.append(row)
        points += points[: rng.randint(0, 3)]  # exact repeats never dominate each other
        pairwise = [any(dominates_beyond_noise(a, b) for a in points if a is not b) for b in points]
        assert dominated_beyond_noise(points, block=7) == pairwise, case


def test_ties_computed_for_all_pairs_at_once_are_the_pairwise_rule():
    """tied_matrix (NumPy, all pairs) against tied pair by pair, on intervals built to overlap, touch at an end,
    repeat exactly and differ in the last bits: the front's stability ties in a report of thousands of trials."""
    import random

    from sweeper.study._objectives import tied, tied_matrix

    rng = random.Random(1)
    grid = [0.0, 1.0, 1.0 + 1e-12, 2.0, 3.5, -1.0]
    for case in range(40):
        a = [tuple(sorted((rng.choice(grid), rng.choice(grid)))) for _ in range(rng.randint(1, 30))]
        b = [*a[: rng.randint(0, 5)], *(tuple(sorted((rng.choice(grid), rng.choice(grid)))) for _ in range(9))]
        pairwise = [[tied(x, y) for y in b] for x in a]
        assert tied_matrix(a, b).tolist() == pairwise, case
