"""The report's data functions, figures and HTML on a study built here: a real Optuna storage holding hand-made
trials with the attributes sweeper stores (no training: these functions read the study only), and ``--pick`` on a
hand-made front."""

import json

import optuna
import pytest

from sweeper.errors import StudyError
from sweeper.export import pick_trial
from sweeper.report import _data as report
from sweeper.report import _importance as importance_module
from sweeper.report import _picks_data as picks_data
from sweeper.report._analysis_records import MemoryEffects, NotShown, ParamImportance
from sweeper.space import parse_space
from sweeper.study import snapshot
from sweeper.study._objectives import DEFAULT_OBJECTIVES
from sweeper.study._storage import open_study
from sweeper.study.picks import knee
from sweeper.testing import add_trial, make_study


def test_front_data_marks_front_failures_and_skips_repeats(tmp_path):
    data = report.front_data(snapshot(make_study(tmp_path)))
    points = {p.number: p for p in data.points}
    assert sorted(points) == [0, 1, 2, 3, 4]
    assert [n for n, p in points.items() if p.on_front] == [0, 1]
    assert points[3].instability is None and points[3].peak_memory_gib == 3.9 and points[3].label == "oom"
    assert points[4].label == "nan/data" and points[4].nan_samples == (7,)
    assert points[1].params["lora_alpha"] == 16 and points[1].params["max_seq_length"] == 64
    assert data.memory_kind == "cpu_peak_rss" and data.knee == 1 and data.ranks_by_margin


def test_fit_map_and_largest_length_per_batch(tmp_path):
    fit = report.fit_map_data(snapshot(make_study(tmp_path)))
    assert fit.batch_sizes == (1, 2, 4) and fit.max_seq_lengths == (64, 128)
    assert fit.cell(4, 128).state == "oom" and fit.cell(1, 128).state == "fits"  # a NaN ran within the cap
    assert fit.cell(4, 128).ooms == 1 and fit.cell(4, 128).max_peak_memory_gib is None  # an OOM's peak is no fit
    assert fit.cell(1, 64).trials == (0,)  # the repeat is not counted twice
    assert fit.cell(4, 64) is None
    assert report.largest_fitting_seq(fit) == {1: 128, 2: 128, 4: None}


def test_curves_importance_and_json(tmp_path, tiny_model):
    study = make_study(tmp_path, model=str(tiny_model))
    curves = report.curves_data(snapshot(study))
    assert [(c.number, c.kind) for c in curves] == [(0, "front"), (1, "front"), (4, "nan")]
    assert curves[2].loss == (2.0, None) and curves[2].label == "#4 nan/data"
    importance = importance_module.importance_data(snapshot(study))
    assert set(importance) == {"peak_memory_gib", "edge_proximity"}
    # Peak memory is explained by the memory model at the study's configurations: batch and length move it, r
    # barely; the stability ranking needs 20 complete trials, and this study has 3.
    memory, stability = importance["peak_memory_gib"], importance["edge_proximity"]
    assert isinstance(memory, MemoryEffects) and isinstance(stability, NotShown)
    effects = memory.effects_gib
    assert effects["per_device_train_batch_size"] > effects["r"] >= 0 and effects["max_seq_length"] > 0
    assert memory.configurations == 5
    assert stability.reason.startswith("3 complete trials; a ranking needs 20")
    summary = json.loads(json.dumps(report.report_data(snapshot(study)).to_dict()))
    assert summary["study"] == "rep" and summary["directions"] == ["minimize", "minimize"]
    assert [f["number"] for f in summary["front"]] == [0, 1] and summary["front"][0]["peak_memory_gib"] == 1.0
    assert summary["status_counts"] == {"complete": 3, "oom": 1, "nan": 1, "repeated": 1}
    assert summary["nan_causes"] == {"data": [4]}
    assert summary["largest_max_seq_length_by_batch"] == {"1": 128, "2": 128, "4": None}
    # The JSON's keys and their order are a user contract (docs/contract.md)
    assert list(summary) == [
        "study",
        "directions",
        "objectives",
        "front",
        "trials",
        "status_counts",
        "stale",
        "nan_causes",
        "largest_max_seq_length_by_batch",
        "importance",
        "picks",
        "pick_lines",
        "memory_prediction",
        "other_setups",
        "cards",
    ]
    assert summary["cards"] == {}  # a CPU study: no card recorded
    assert list(summary["front"][0]) == [
        "confirmation",
        "number",
        "params",
        "peak_memory_gib",
        "edge_proximity",
        "stability_margin",
        "margin_capped",
        "lr_ceiling",
        "predicted_max_lr",
        "stability_margin_low",
        "stability_margin_high",
        "predicted_max_lr_low",
        "predicted_max_lr_high",
        "predicted_max_lr_source",
        "headroom",
        "headroom_low",
        "headroom_high",
        "near_edge",
        "horizon_steps",
        "p_diverge",
        "p_diverge_low",
        "p_diverge_high",
        "stability_call",
        "safe_learning_rate",
        "learning_progress",
        "instability",
        "tied_with",
    ]
    assert list(summary["trials"][0])[:4] == ["number", "state", "status", "label"]
    assert list(summary["trials"][0])[-4:] == ["on_front", "confirmation", "phase_peak_memory_gib", "worst_case_shape"]
    assert list(summary["memory_prediction"]) == [
        "trials",
        "median_error",
        "median_corrected_error",
        "corrected_trials",
        "calibration",
    ]
    assert summary["importance"]["edge_proximity"] == {"not_shown": stability.reason}
    assert list(summary["importance"]["peak_memory_gib"]) == ["effects_gib", "configurations"]


def test_importance_does_not_invent(tmp_path, tiny_model):
    """On an 8-trial study optuna's importance ranked lora_alpha/r second for peak memory: the memory model says it
    moves no tensor's size (exactly 0), and the stability ranking is shown from 20 complete trials, with its
    bootstrap interval."""
    import random

    from optuna.distributions import CategoricalDistribution

    space = parse_space({"study": {"name": "many"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/many.db", "many", 30)
    distributions = {
        "lora_alpha_ratio": CategoricalDistribution([0.5, 2.0, 8.0]),
        "per_device_train_batch_size": CategoricalDistribution([1, 2, 4]),
    }
    rng = random.Random(1)
    for _ in range(24):
        ratio, batch = rng.choice([0.5, 2.0, 8.0]), rng.choice([1, 2, 4])
        config = {**_tiny_config(tiny_model), "lora_alpha_ratio": ratio, "per_device_train_batch_size": batch}
        params = {"lora_alpha_ratio": ratio, "per_device_train_batch_size": batch}
        proximity = 0.01 * ratio * (1 + 0.05 * rng.random())  # stability follows lora_alpha/r, memory the batch
        extra = {"config": config, "params": params, "distributions": distributions}
        add_trial(
            study, r=8, batch=batch, seq=64, status="complete", peak=1 + 0.1 * batch, instability=proximity, extra=extra
        )
    importance = importance_module.importance_data(snapshot(study))
    memory, stability = importance["peak_memory_gib"], importance["edge_proximity"]
    assert isinstance(memory, MemoryEffects) and isinstance(stability, ParamImportance)
    effects = memory.effects_gib
    assert effects["lora_alpha_ratio"] == 0 and effects["per_device_train_batch_size"] > 0
    assert stability.trials == 24 and max(stability.importance, key=stability.importance.__getitem__) == (
        "lora_alpha_ratio"
    )
    for key, (low, high) in stability.interval.items():
        assert low <= stability.importance[key] <= high
    # most important first, exact ties by name: the order never depends on the process's hash seed
    order = list(stability.importance)
    assert order == sorted(order, key=lambda k: (-stability.importance[k], k))
    # --json gives each interval as [p5, p95]
    assert stability.to_dict()["interval"] == {k: [low, high] for k, (low, high) in stability.interval.items()}


def _tiny_config(model):
    from sweeper.testing import tiny_trial_config

    return tiny_trial_config(model).to_dict()


def test_figures_and_offline_html(tmp_path):
    from sweeper.report._figures import front_figure
    from sweeper.report._html import render_html
    from sweeper.study._artifacts import loss_curve_svg

    study = make_study(tmp_path)
    fig = front_figure(report.front_data(snapshot(study)))
    names = [t.name for t in fig.data]
    assert "Pareto front" in names and "oom (no margin)" in names and "nan/data (no margin)" in names
    assert "not safe (P(diverge) undecided or likely fails)" in names  # its trials' edges lie below their rates
    # The margin on a log axis, higher is safer; the failures in a band below a margin of 1 (they failed at their rate).
    assert fig.layout.yaxis.type == "log" and "stability margin" in fig.layout.title.text
    front_trace = next(t for t in fig.data if t.name == "Pareto front")
    assert all(y > 1 for y in front_trace.y)
    assert all(y < 1 for t in fig.data if "(no margin)" in t.name for y in t.y)
    page = render_html(snapshot(study))
    assert "<script src=" not in page and 'src="http' not in page  # plotly.js is inline, nothing fetched
    assert page.count("Plotly.newPlot") == 4 and len(page) > 3_000_000
    assert "nan/data" in page and 'id="fit-map"' in page
    svg = loss_curve_svg([2.0, None, 1.0], [1.0, 2.0, None], "trial 3")
    assert svg.startswith("<svg") and svg.count("M") >= 3


def test_pick_on_a_hand_made_front(tmp_path):
    space = parse_space({"study": {"name": "pick"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/pick.db", "pick", 3)
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=10.0)
    add_trial(study, r=8, batch=1, seq=64, status="complete", peak=2.0, instability=2.0)  # nearest the ideal point
    add_trial(study, r=16, batch=1, seq=64, status="complete", peak=10.0, instability=1.0)
    add_trial(study, r=16, batch=4, seq=128, status="oom", peak=3.9)
    assert pick_trial(snapshot(study), pick="knee").number == 1
    assert pick_trial(snapshot(study), pick="min-memory").number == 0
    # Trial 2's margin (1/1.0) and trial 1's (1/2.0) are within the seed noise of each other (a ladder step each
    # side): tied, so the most stable pick is the one of them with less memory.
    assert pick_trial(snapshot(study), pick="most-stable").number == 1
    assert pick_trial(snapshot(study), number=2).number == 2
    with pytest.raises(StudyError, match="trial 3 did not complete \\(oom: oom reason\\)"):
        pick_trial(snapshot(study), number=3)
    with pytest.raises(StudyError, match="no trial 9"):
        pick_trial(snapshot(study), number=9)
    two = sorted(study.best_trials, key=lambda t: t.number)[::2]
    assert knee(two, DEFAULT_OBJECTIVES).number == 2  # a tie between the two ends goes to the lower instability


def test_pick_refuses_a_study_without_complete_trials(tmp_path):
    space = parse_space({"study": {"name": "none"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/none.db", "none", 2)
    add_trial(study, r=4, batch=4, seq=128, status="oom", peak=3.9)
    with pytest.raises(StudyError, match="no complete trial"):
        pick_trial(snapshot(study))
    assert isinstance(optuna.load_study(study_name="none", storage=f"sqlite:///{tmp_path}/none.db"), optuna.Study)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://user:secret@db:5432/s", "postgresql://user:***@db:5432/s"),
        ("postgresql://:secret@127.0.0.1:1/db", "postgresql://:***@127.0.0.1:1/db"),
        ("postgresql://user:sec@ret@host/db", "postgresql://user:***@host/db"),
        ("postgresql://host/db?password=secret&x=1", "postgresql://host/db?password=***&x=1"),
        ("sqlite:///studies/a.db", "sqlite:///studies/a.db"),
    ],
)
def test_redact_url(url, shown):
    from sweeper.storage import redact_url

    assert redact_url(url) == shown


def test_study_dir_stays_inside_studies():
    from sweeper.storage import study_dir
    from sweeper.storage._identity import STUDIES_DIR

    assert study_dir("demo") == STUDIES_DIR / "demo"
    for name in ("../../escaped", "/tmp/abs", "a b"):
        assert study_dir(name).parent == STUDIES_DIR and ".." not in study_dir(name).parts


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"\x00\x01 random bytes " * 50, "not an SQLite database"), (b"", "holds no Optuna study")],
)
def test_load_existing_study_refuses_what_is_not_a_study(tmp_path, content, needle):
    from sweeper.study import load_existing_study

    bad = tmp_path / "bad.db"
    bad.write_bytes(content)
    with pytest.raises(StudyError) as info:
        load_existing_study(str(bad))
    [line] = info.value.problems
    assert needle in line and bad.read_bytes() == content  # read, never written
    single = optuna.create_study(study_name="plain", storage=f"sqlite:///{tmp_path}/plain.db")
    single.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with pytest.raises(StudyError, match="not a sweeper study"):
        load_existing_study(str(tmp_path / "plain.db"))
    with pytest.raises(StudyError, match="no such study file"):
        load_existing_study(f"sqlite:///{tmp_path}/missing.db")
    assert not (tmp_path / "missing.db").exists()


def test_no_pick_recommends_a_trial_because_it_barely_learns(tmp_path):
    """A capped margin at a learning rate that moves nothing is the widest margin there is: the front keeps the
    trial, but knee and most-stable skip it (and confirm runs it last); min-memory is about memory and keeps it."""
    from sweeper.report._front_text import format_front
    from sweeper.sweep._confirm import candidates

    space = parse_space({"study": {"name": "learn"}, "search": {"r": [4, 8, 16]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/learn.db", "learn", 8)
    study.set_user_attr("confirm_steps", 200)  # the horizon: margins of 30x and 50x are safe at 200 steps
    # peak, edge_proximity: trial 0 is the least memory and the widest margin, so it alone is the front...
    add_trial(
        study,
        r=4,
        batch=1,
        seq=64,
        status="complete",
        peak=1.0,
        instability=1 / 643,
        extra={"learning_progress": 0.001},
    )
    add_trial(
        study, r=8, batch=1, seq=64, status="complete", peak=1.2, instability=1 / 50, extra={"learning_progress": 0.3}
    )
    add_trial(
        study, r=16, batch=1, seq=64, status="complete", peak=1.1, instability=1 / 20, extra={"learning_progress": 0.25}
    )
    # ...so every pick of the front is trial 0 unless learning counts: then knee and most-stable fall back to the whole
    # front. The safe pick, made among every complete trial, is trial 1 (safe, and within 10% of trial 2's memory it
    # learns more): confirm runs it first.
    assert [t.number for t in candidates(study)] == [1, 0]
    assert pick_trial(snapshot(study)).number == 1
    assert (
        pick_trial(snapshot(study), pick="most-stable").number == 0
        and pick_trial(snapshot(study), pick="knee").number == 0
    )
    # With a learning trial on the front beside it, that one is recommended.
    add_trial(
        study, r=16, batch=2, seq=64, status="complete", peak=0.9, instability=1 / 30, extra={"learning_progress": 0.3}
    )
    assert pick_trial(snapshot(study), pick="min-memory").number == 3
    assert (
        pick_trial(snapshot(study), pick="most-stable").number == 3
        and pick_trial(snapshot(study), pick="knee").number == 3
    )
    assert [t.number for t in candidates(study)] == [3, 0]
    assert "(barely)" in format_front(candidates(study)).splitlines()[3]  # trial 0, shown as barely learning


def test_a_front_whose_every_trial_failed_its_confirmation_has_no_picks_and_says_why(tmp_path, capsys):
    """'sweep confirm --trials 0' ended in an error about --pick when the front's only trials had failed: the report
    and the dashboard's notes asked for a pick that export refuses."""
    from sweeper.study import Confirmation

    study = make_study(tmp_path)
    assert picks_data.no_picks_reason(snapshot(study)) is None and picks_data.picks(snapshot(study))
    for n in (0, 1, 2):
        failed = Confirmation(steps=30, status="nan", reason="loss nan", fail_step=12)
        study.set_user_attr(f"confirmation:{n}", failed.to_dict())
    assert picks_data.picks(snapshot(study)) == {}
    assert "failed its confirmation" in picks_data.no_picks_reason(snapshot(study))
    assert report.report_data(snapshot(study)).picks == {}


def test_the_json_lists_a_stale_running_trial_among_the_trials(tmp_path, tiny_model):
    """A trial left RUNNING by a sweep killed with ``kill -9`` (its pid gone on this host) is listed in ``trials``,
    not only in ``stale``."""
    import socket
    import subprocess

    study = make_study(tmp_path, model=str(tiny_model))
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no process holds now
    running = study.ask()
    study._storage.set_trial_user_attr(running._trial_id, "sweep_host", socket.gethostname())
    study._storage.set_trial_user_attr(running._trial_id, "sweep_pid", dead.pid)
    summary = report.report_data(snapshot(study)).to_dict()
    assert len(summary["stale"]) == 1
    assert running.number in [t["number"] for t in summary["trials"]], summary["trials"]


def test_the_html_figures_stay_readable_at_one_cell_and_one_trial(tmp_path):
    """A study of one trial: the fit map's one row was a 2-px line (its figure no taller than plotly's margins), the
    front's one point between two log ticks had no readable value, an importance panel with nothing to rank drew
    empty axes under its reason, and the front table ran past a 900-px page."""
    from sweeper.report._figures import fit_map_figure, front_figure, importance_figure
    from sweeper.report._html import render_html

    space = parse_space({"study": {"name": "one"}, "search": {"r": [4, 8]}}, "space.yaml")
    study = open_study(space, f"sqlite:///{tmp_path}/one.db", "one", 1)
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.0, instability=1 / 61)  # a 61x margin
    fit = report.fit_map_data(snapshot(study))
    assert (len(fit.batch_sizes), len(fit.max_seq_lengths)) == (1, 1)
    layout = fit_map_figure(fit).layout
    margin = layout.margin
    assert layout.height - (margin.t or 100) - (margin.b or 80) >= 200  # px of cells, plotly's defaults 100/80
    figure = front_figure(report.front_data(snapshot(study)))
    front = next(t for t in figure.data if t.name == "Pareto front")
    assert list(front.text) == ["#0 61x"]
    assert [a.text for a in figure.layout.annotations if "safe" in a.text] == ["knee · safe"]  # export's default
    assert "headroom" in front.hovertext[0]
    summary = report.report_data(snapshot(study))
    figure = importance_figure(summary.importance)
    shown = [a.text for a in figure.layout.annotations if a.text.startswith("not shown")]
    assert shown and all(ax.visible is False for ax in (figure.layout.xaxis2, figure.layout.yaxis2))
    page = render_html(snapshot(study))
    assert '<div class="wide"><table>' in page and ".wide{overflow-x:auto" in page


def test_the_card_a_gpu_sweep_read_is_named_beside_the_cap(tmp_path):
    """What ``sweep run`` on CUDA records (``plan_sweep(card=...)``: the card by name) reaches the terminal report,
    ``--json`` and the HTML figure's cap line; a CPU study records none (the test above)."""
    from sweeper.report import report_lines
    from sweeper.report._figures import front_figure

    study = make_study(tmp_path)
    study.set_user_attr("cards", {"NVIDIA GeForce RTX 4090": {"device": "cuda", "total_memory_gib": 23.649}})
    cap = report.front_data(snapshot(study)).memory_limit_gib
    line = f"memory  cap {cap:g} GiB of the card's 23.65 GiB (NVIDIA GeForce RTX 4090)"
    assert line in report_lines(snapshot(study), "s")
    cards = report.report_data(snapshot(study)).to_dict()["cards"]
    assert cards == {"NVIDIA GeForce RTX 4090": {"device": "cuda", "total_memory_gib": 23.649}}
    figure = front_figure(report.front_data(snapshot(study)))
    assert any("of the card's 23.65 GiB (NVIDIA GeForce RTX 4090)" in (a.text or "") for a in figure.layout.annotations)
