"""The protocol between the sweep and a trial process (:mod:`sweeper.trial._job`), both ways: the progress and done
lines a trial process writes on its control pipe, as the sweep reads them. No torch, no trial process, milliseconds."""

import os
import time

import pytest

from sweeper.stability import STRESS_GROWTH, STRESS_STEPS, margin_of
from sweeper.stability._margin import STRESS_CAP
from sweeper.trial import TrialProcess, TrialProgress
from sweeper.trial._child.progress import ProgressSender
from sweeper.trial._job import Measures, ProbeSettings, StressSettings, TrialDone, TrialJob


@pytest.mark.parametrize(
    "progress",
    [
        TrialProgress(phase="train", step=7, of=12, loss=2.3125, peak_memory_gib=0.8512),
        TrialProgress(phase="load", peak_memory_gib=0.25),
        TrialProgress(phase="stress", step=0, of=11, loss=0.0),
        TrialProgress(phase="load"),
    ],
)
def test_a_progress_line_reads_back_as_it_was_written(progress):
    line = progress.to_line()
    assert isinstance(line, bytes) and line.endswith(b"\n") and line.count(b"\n") == 1
    assert TrialProgress.from_line(line) == progress
    assert TrialProgress.from_line(line.rstrip(b"\n")) == progress  # as the reader splits lines


def test_a_progress_line_leaves_out_what_is_unknown():
    assert TrialProgress(phase="load", peak_memory_gib=0.5).to_line() == b'{"progress": {"phase": "load", ' + (
        b'"peak_memory_gib": 0.5}}\n'
    )


@pytest.mark.parametrize(
    "line",
    [
        TrialDone(reusable=True).to_line(),
        b'{"reusable": false}',
        b"",
        b"not json",
        b"[1, 2]",
        b'"progress"',
        b'{"config_path": "a"}',
    ],
)
def test_a_line_that_is_not_a_progress_line_is_none(line):
    assert TrialProgress.from_line(line) is None


@pytest.mark.parametrize(
    "fields",
    [
        '{"phase": "sleep"}',
        '{"step": 3}',
        '{"phase": "train", "step": "3"}',
        '{"phase": "train", "step": 2.5}',
        '{"phase": "train", "of": true}',
        '{"phase": "train", "loss": NaN}',
        '{"phase": "train", "peak_memory_gib": "1 GiB"}',
        "[]",
    ],
)
def test_a_garbled_progress_line_is_an_error(fields):
    with pytest.raises(ValueError):
        TrialProgress.from_line(b'{"progress": ' + fields.encode() + b"}")


def test_the_done_line_says_whether_the_process_is_reusable():
    assert TrialDone.from_line(TrialDone(reusable=True).to_line()) == TrialDone(reusable=True)
    assert TrialDone.from_line(TrialDone(reusable=False).to_line()) == TrialDone(reusable=False)
    for garbled in (b"", b"{", b'{"reusable": "yes"}', b"[true]"):
        assert TrialDone.from_line(garbled) == TrialDone(reusable=False)


@pytest.mark.parametrize(
    ("stress", "probe"),
    [
        (StressSettings(), ProbeSettings()),
        (StressSettings(steps=3, growth=2.5), ProbeSettings(interval_steps=1)),
        (None, ProbeSettings(interval_steps=5)),
        (None, None),
    ],
)
def test_the_job_line_reads_back_with_its_settings(stress, probe):
    job = TrialJob(
        config_path="c.json",
        result_path="r.json",
        log_path="w.log",
        trial_dir="t",
        measures=Measures(stress=stress, probe=probe, worst_case=probe is not None),
    )
    line = job.to_line()
    assert line.endswith("\n") and line.count("\n") == 1
    assert TrialJob.from_line(line) == job


def test_a_job_runs_todays_stress_phase_and_probe_unless_it_says_otherwise():
    job = TrialJob(config_path="c.json", result_path="r.json", log_path="w.log", trial_dir="t")
    assert job.measures.stress == StressSettings(steps=STRESS_STEPS, growth=STRESS_GROWTH)
    assert job.measures.stress.cap == STRESS_CAP
    assert job.measures.probe == ProbeSettings(interval_steps=None)
    assert job.measures.worst_case
    with pytest.raises(TypeError):  # the two sides are one version: an unknown key is an error
        TrialJob.from_line(job.to_line().replace('"trial_dir"', '"trial_folder"'))


@pytest.mark.parametrize(
    "make",
    [
        lambda: StressSettings(steps=0),
        lambda: StressSettings(steps=2.5),
        lambda: StressSettings(steps=True),
        lambda: StressSettings(growth=1.0),
        lambda: StressSettings(growth=float("inf")),
        lambda: ProbeSettings(interval_steps=0),
        lambda: ProbeSettings(interval_steps=1.5),
    ],
)
def test_settings_out_of_range_are_an_error(make):
    with pytest.raises(ValueError):
        make()


def test_a_margin_is_read_against_its_own_stress_settings():
    capped = margin_of(1e-3, "cap", None, growth=2.0, steps=4)
    assert capped.stability_margin == 16.0 and capped.margin_capped is True
    at_edge = margin_of(1e-3, "diverged", 3, growth=2.0, steps=4)
    assert at_edge.lr_ceiling == pytest.approx(8e-3) and at_edge.stability_margin == pytest.approx(8.0)
    assert margin_of(1e-3, "cap", None).stability_margin == STRESS_CAP  # the defaults


def test_the_sweep_reads_what_the_trial_process_sends():
    """The child's sender writes on a real pipe; the parent's reader hands each progress line to on_progress as a
    TrialProgress, skips a garbled one, and stops at the done line (what follows is the next trial's)."""
    read_fd, write_fd = os.pipe()
    sender = ProgressSender(write_fd, min_interval_s=0.0)
    sender.report("load")
    sender.report("train", step=1, of=4, loss=2.5)
    sender.report("train", step=2, of=4, loss=float("nan"))  # sent without its loss
    os.write(write_fd, b'{"progress": {"phase": "warp"}}\n')
    sender.report("stress", step=1, of=11, loss=3.0)
    os.write(write_fd, TrialDone(reusable=True).to_line())
    sender.report("load")  # the next trial's
    os.write(write_fd, b"garbage\n")
    os.close(write_fd)

    process = TrialProcess()
    process._control = read_fd  # the reading side only: no trial process is started
    seen: list[TrialProgress] = []
    process._on_progress = seen.append
    try:
        assert process._read_done(time.monotonic() + 5) == TrialDone(reusable=True)
        assert [(p.phase, p.step, p.of, p.loss) for p in seen] == [
            ("load", None, None, None),
            ("train", 1, 4, 2.5),
            ("train", 2, 4, None),
            ("stress", 1, 11, 3.0),
        ]
        assert all(p.peak_memory_gib is not None and p.peak_memory_gib > 0 for p in seen)
        assert process._read_done(time.monotonic() + 5) == TrialDone(reusable=False)  # a garbled done line
        assert [p.phase for p in seen[4:]] == ["load"]
        assert process._read_done(time.monotonic() + 5) is None  # EOF: the process died
    finally:
        process.close()


def test_the_sender_sends_nothing_without_a_pipe_and_throttles_within_a_phase():
    ProgressSender(None).report("load")  # the worker run on its own: no pipe, no error
    read_fd, write_fd = os.pipe()
    sender = ProgressSender(write_fd, min_interval_s=3600)
    for step in range(1, 5):
        sender.report("train", step=step, of=4)
    sender.report("stress", step=1, of=11)  # a phase change is always sent
    os.close(write_fd)
    lines = os.read(read_fd, 65536).splitlines()
    os.close(read_fd)
    read = [TrialProgress.from_line(x) for x in lines]
    assert [(p.phase, p.step, p.of) for p in read] == [("train", 1, 4), ("stress", 1, 11)]


def test_the_zygote_messages_read_back_and_a_bad_one_is_refused():
    from sweeper.trial._zygote_protocol import (
        ForkRequest,
        PollRequest,
        ZygoteReply,
        read_request,
        request_bytes,
    )

    fork = ForkRequest(cwd="/tmp", env={"PATH": "/bin"})
    assert read_request(request_bytes(fork)) == fork
    assert read_request(request_bytes(PollRequest(pid=42))) == PollRequest(pid=42)
    for reply in (ZygoteReply(pid=7), ZygoteReply(returncode=-9), ZygoteReply(error="ValueError: x")):
        assert ZygoteReply.from_bytes(reply.to_bytes()) == reply
    for bad in (b'{"op": "exec"}', b'{"op": "poll", "pid": "1"}', b'{"op": "fork", "cwd": 1, "env": {}}', b"{"):
        with pytest.raises(ValueError):
            read_request(bad)
    with pytest.raises(TypeError):
        read_request(b'{"op": "poll"}')
