"""The live display: what a running trial is doing, the sweep's counts and ETA; a redrawn display on a terminal, a
plain line now and then in a log."""

from __future__ import annotations

import dataclasses
import io

import pytest

from sweeper.report import LiveProgress
from sweeper.report._progress import format_duration
from sweeper.trial import TrialProgress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


REPORT = TrialProgress(phase="train", step=7, of=12, loss=2.3125, peak_memory_gib=0.8512)


def test_without_a_terminal_a_progress_line_now_and_then():
    log = io.StringIO()
    live = LiveProgress(10, done=3, timeout_s=3600, slots=2, stream=log, interval_s=0)
    live.line("[4/10] #3 ...")
    live.begin(1, 4)
    live.report(1, REPORT)
    live.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "[4/10] #3 ..."
    progress = [line for line in lines if line.startswith("progress ")]
    assert progress, lines
    assert "3/10 trials · 1 running" in progress[-1] and "timeout in 60 min" in progress[-1]
    assert "running #4 train 7/12 loss 2.312 peak 0.85 GiB 0 s" in progress[-1]
    assert "\r" not in log.getvalue()  # nothing redrawn in a log


def test_a_log_is_not_flooded():
    log = io.StringIO()
    live = LiveProgress(10, stream=log, interval_s=3600)
    live.begin(0, 0)
    for step in range(50):
        live.report(0, dataclasses.replace(REPORT, step=step))
    live.close()
    assert "progress" not in log.getvalue()


def test_on_a_terminal_a_bar_and_a_line_per_slot():
    screen = _Terminal()
    live = LiveProgress(3, slots=2, stream=screen)
    live.begin(0, 5)
    live.report(0, REPORT)
    live.line("[1/3] #4 done")
    live.end(0)
    live.close()
    out = screen.getvalue()
    assert "trials 0/3" in out and "trials 1/3" in out
    assert "slot 0: #5 train 7/12 loss 2.312 peak 0.85 GiB" in out and "slot 1: idle" in out
    assert "[1/3] #4 done" in out


def test_the_eta_comes_from_the_finished_trials_and_stops_at_the_timeout():
    live = LiveProgress(10, done=0, timeout_s=100, stream=io.StringIO(), interval_s=3600)
    live.start -= 40  # 4 trials in 40 s: 10 s a trial
    live.done, live.last_finish = 4, live.start + 40
    assert live.summary(now=live.last_finish) == "4/10 trials · 10 s per trial · ETA 60 s"
    live.timeout_s = 70  # 30 s left of the budget
    assert live.summary(now=live.last_finish).endswith("ETA 30 s (the timeout)")
    live.close()


@pytest.mark.parametrize(("seconds", "shown"), [(12, "12 s"), (300, "5 min"), (3 * 3600 + 300, "3 h 05 min")])
def test_durations_read_as_a_person_reads_them(seconds, shown):
    assert format_duration(seconds) == shown


def test_at_60_columns_every_line_fits_and_the_eta_shows(monkeypatch):
    """tqdm's ``dynamic_ncols`` reads the width at each redraw (here ``COLUMNS``: a StringIO has no terminal size) and
    trims each line to it, so a narrowed terminal never wraps a line that the next redraw would leave behind."""
    import re

    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.setenv("LINES", "40")
    screen = _Terminal()
    live = LiveProgress(10, slots=2, stream=screen)
    live.begin(0, 0)
    live.end(0)
    live.begin(0, 1)
    live.report(0, dataclasses.replace(REPORT, phase="stress", step=3, of=7))
    live.close()
    shown = [re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", part) for part in re.split(r"[\r\n]", screen.getvalue())]
    assert max(len(part) for part in shown) <= 60, max(shown, key=len)
    assert any("ETA" in part for part in shown), shown
