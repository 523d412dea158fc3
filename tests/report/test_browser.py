"""The study as a person sees it, in headless Chromium (Debian's ``chromium``, installed by ``.ci/run``): the HTML
report renders its plotly figures offline, and ``sweep dashboard`` serves the study with the front figure, the
failure notes and each trial's artifacts. The study comes from a real sweep on the tiny model."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import optuna
import pytest

from sweeper.testing import data_nan_space, sweep, write_space

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)"),
]


def dump_dom(url: str, timeout: float = 120) -> str:
    """The page's DOM after its scripts ran (``--virtual-time-budget`` lets the single-page app fetch and render)."""
    out = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return out.stdout


@pytest.fixture(scope="module")
def swept(tiny_model, tmp_path_factory):
    """A finished sweep: one complete trial and one NaN trial caused by the data (max_seq_length 16)."""
    folder = tmp_path_factory.mktemp("browser")
    out = sweep("run", str(write_space(folder, data_nan_space(tiny_model))), cwd=folder)
    assert out.returncode == 0, out.stderr
    return folder


def test_trials_carry_artifacts_figure_and_notes(swept):
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{swept}/studies/t.db")
    nan = next(t for t in study.trials if t.user_attrs.get("status") == "nan")
    names = sorted(m.filename for m in optuna.artifacts.get_all_artifact_meta(nan, storage=study._storage))
    assert names == ["loss_curve.svg", "nan_batch.jsonl", "trace.json"]
    attrs = study._storage.get_study_system_attrs(study._study_id)
    assert any("pareto-front" in k for k in attrs)
    # the NaN trial's own note, with its cause and its samples: not any note
    from sweeper.storage import _optuna_private as private

    note = private.dashboard_note(attrs, private.trial_id(nan))
    assert note.startswith(f"### Trial {nan.number}: nan (data)"), note
    assert f"Samples: {', '.join(map(str, nan.user_attrs['nan_samples']))}" in note, note


def test_html_report_renders_offline(swept):
    out = sweep("report", "t", cwd=swept)
    assert out.returncode == 0, out.stderr
    assert "Pareto front" in out.stdout and "nan 1 (data 1)" in out.stdout
    dom = dump_dom((swept / "studies" / "t" / "report.html").as_uri())
    assert dom.count('class="main-svg"') >= 4  # plotly.js ran and drew every figure, with no network
    assert "Pareto front" in dom and "nan/data" in dom and "What fits the memory cap" in dom


def test_dashboard_shows_the_study_and_its_artifacts(swept):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "sweeper.cli", "dashboard", "t", "--port", str(port)],
        cwd=swept,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        else:
            pytest.fail("the dashboard did not start listening on 127.0.0.1")
        study_page = dump_dom(f"http://127.0.0.1:{port}/dashboard/studies/1")
        assert "Pareto Front" in study_page and "peak_memory_gib" in study_page
        trial_page = dump_dom(f"http://127.0.0.1:{port}/dashboard/studies/1/trials?numbers=0,1")
        for needle in ("loss_curve.svg", "trace.json", "nan_batch.jsonl", "nan (data)", "no supervised token"):
            assert needle in trial_page, needle
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
