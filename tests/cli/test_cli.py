"""The ``sweep`` command as a user runs it: exit codes, one-line errors that leave studies untouched, ``sweep trial``,
and a study that optuna-dashboard serves with every trial's status, reason, memory and traces."""

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest

from sweeper.testing import OUTLASTS_ANY_TIMEOUT, run_cli, sweep, tiny_space, write_space


def test_bad_space_is_exit_2_with_one_line_and_no_study(workdir):
    path = workdir / "bad.yaml"
    path.write_text("search:\n  lerning_rate: [1e-4]\n")
    out = run_cli("run", str(path), cwd=workdir)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"{path}: search.lerning_rate: unknown key; did you mean 'learning_rate'?"
    ]
    assert not (workdir / "studies").exists()


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"search": {}}, "search: nothing to search"),
        ({"model": {"name_or_path": "./no/such/model"}}, "model.name_or_path: no such directory"),
        ({"dataset": {"path": "missing.jsonl"}}, "dataset.path: no such file"),
    ],
)
def test_bad_input_before_any_trial(tiny_model, workdir, change, needle):
    space = {**tiny_space(tiny_model), **change}
    out = run_cli("run", str(write_space(workdir, space)), cwd=workdir)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert not (workdir / "studies").exists()


def test_fewer_rows_than_the_batch_is_refused_before_anything_runs(tiny_model, workdir):
    # One row at per_device_train_batch_size 4 was measured and shown as "batch 4" while every step held one row
    # (issue 48); now the run and the trial refuse it, and nothing is written.
    from sweeper.testing import write_jsonl

    write_jsonl(workdir / "one.jsonl", [{"text": "a single sample of text to train on, long enough to tokenize"}])
    space = tiny_space(tiny_model, search={"per_device_train_batch_size": [1, 4]})
    space["dataset"] = {"path": "one.jsonl"}
    path = write_space(workdir, space)
    needle = "dataset: 1 row to train on, fewer than per_device_train_batch_size 4: each step would hold 1 row"
    for command in ("run", "trial"):
        out = run_cli(command, str(path), *(["--set", "per_device_train_batch_size=4"] if command == "trial" else []),
                      cwd=workdir)  # fmt: skip
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], (command, out.stdout, out.stderr)
        assert not (workdir / "studies").exists(), command
    ok = run_cli("trial", str(path), "--set", "per_device_train_batch_size=1", "--set", "max_steps=1", cwd=workdir)
    assert ok.returncode == 0, ok.stderr  # batch 1 fits the one row: it runs


def test_fewer_packed_rows_than_the_batch_is_refused_before_anything_runs(tiny_model, workdir):
    # 6 samples pack into fewer rows than they are: packing counted samples, so batch 4 ran steps of the packed rows
    # and was recorded as batch 4 (issue 55). Refused at the length that packs into too few rows; a length at which
    # every sample is a row of its own is not.
    from sweeper.testing import write_jsonl

    write_jsonl(workdir / "six.jsonl", [{"text": f"sample {i}: a few words of text to train on"} for i in range(6)])
    space = tiny_space(tiny_model, search={"per_device_train_batch_size": [1, 4]})
    space["dataset"] = {"path": "six.jsonl"}
    space["training"]["packing"] = True
    path = write_space(workdir, space)
    for command in ("run", "trial"):
        extra = ["--set", "per_device_train_batch_size=4"] if command == "trial" else []
        out = run_cli(command, str(path), "--set", "max_seq_length=64", *extra, cwd=workdir)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (command, out.stdout, out.stderr)
        assert "dataset: with packing, its 6 samples" in lines[0] and "of max_seq_length 64, fewer than " in lines[0]
        assert "per_device_train_batch_size 4" in lines[0], lines[0]
        assert not (workdir / "studies").exists(), command
    ok = run_cli(
        "trial", str(path), "--set", "max_seq_length=16", "--set", "per_device_train_batch_size=4",
        "--set", "max_steps=1", cwd=workdir,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr  # at 16 tokens each sample is a row: 6 rows hold a batch of 4


def test_bad_flags_are_reported_with_the_file_problems(tiny_model, workdir):
    space = tiny_space(tiny_model)
    space["training"]["max_stepz"] = 3
    path = write_space(workdir, space)
    out = run_cli("run", str(path), "--timeout", "soon", "--n-trials", "0", "--study", "a/b", cwd=workdir)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 4, lines
    assert any("--timeout: 'soon'" in ln for ln in lines) and any("training.max_stepz" in ln for ln in lines)
    assert any(ln.startswith("--n-trials: 0") for ln in lines) and any(ln.startswith("--study: 'a/b'") for ln in lines)
    out = run_cli("run", str(path), "--set", "rr=4", cwd=workdir)
    assert out.returncode == 2 and "did you mean 'r'" in out.stderr
    assert not (workdir / "studies").exists()


@pytest.mark.parametrize("argv", [["run"], ["run", "x.yaml", "--bogus"], [], ["run", "x.yaml", "--n-trials", "abc"]])
def test_usage_errors_are_one_line(workdir, argv):
    # In-process: argparse refuses these before any command runs (the console script is run by the tests above).
    out = run_cli(*argv)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "--help" in out.stderr


def test_model_and_data_problems_reported_together(tiny_model, workdir):
    space = {**tiny_space(tiny_model), "model": {"name_or_path": str(workdir)}, "dataset": {"path": str(workdir)}}
    out = run_cli("run", str(write_space(workdir, space)), cwd=workdir)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 2, lines
    assert "dataset.path: is a directory" in lines[0] and "model.name_or_path: no config.json" in lines[1]


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("notaurl", "cannot open this storage"),
        ("postgresql://me:s3cret@127.0.0.1:1/x", "cannot open this storage"),
        ("mysql://me:s3cret@127.0.0.1:1/x", "pip install mysqlclient"),
    ],
)
def test_bad_storage_is_one_line_without_password(tiny_model, workdir, url, needle):
    # The PostgreSQL URL as a process of its own (the console script's exit code and streams); the others in-process.
    run = sweep if url.startswith("postgresql") else run_cli
    out = run("run", str(write_space(workdir, tiny_space(tiny_model))), "--storage", url, cwd=workdir)
    assert out.returncode == 2 and out.stdout == "", out.stdout
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr and "s3cret" not in out.stderr


@pytest.mark.slow
def test_trial_json_with_set(tiny_model, workdir):
    from sweeper.data import load_samples
    from sweeper.space import DatasetSpec
    from sweeper.testing import write_jsonl

    # issue 55, break 1: the worst step was judged on the max_samples the trials sample, while the exports train the
    # whole file (the built-in data: the longest of 16 sampled rows 609 tokens, the file's 1,320). Here the file's
    # one long row is not among the 4 sampled: the trial runs it as its worst-case step, and says so.
    rows = [{"text": f"sample {i}: a few words of text to train on"} for i in range(12)]
    rows.append({"text": "a long row " + "with many more words " * 30})  # row 12: over 64 tokens
    write_jsonl(workdir / "data.jsonl", rows)
    assert 12 not in {s.index for s in load_samples(DatasetSpec(path=str(workdir / "data.jsonl"), max_samples=4))}
    space = tiny_space(tiny_model, search={"r": [4, 8], "bnb_4bit_quant_type": ["nf4", "fp4"]})
    space["dataset"] = {"path": "data.jsonl", "max_samples": 4}
    path = write_space(workdir, space)
    # Two trials at once in one project (a script's loop): each must print its own result (they once shared a folder
    # named by the second they started in, and each printed the other's).
    with ThreadPoolExecutor(2) as pool:
        other = pool.submit(sweep, "trial", str(path), cwd=workdir)
        sets = ["--set", "r=8", "--set", "bnb_4bit_use_double_quant=false", "--set", "per_device_train_batch_size=2"]
        out = sweep("trial", str(path), *sets, "--json", cwd=workdir)
        text = other.result()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["status"] == "complete" and result["config"]["r"] == 8
    assert result["config"]["bnb_4bit_quant_type"] == "nf4" and result["config"]["bnb_4bit_use_double_quant"] is False
    assert len(result["loss_trace"]) == 3 and result["lora_alpha"] == 16  # the trial process's own: r 8, not 4
    # The stress phase's margin, as the held-back checks of benchmarks/stability/validity.py read it.
    assert result["stability_margin"] > 1 and result["stress_stop"] in ("diverged", "nan", "overflow", "cap")
    assert result["predicted_max_lr"] > 0 and ("lr_ceiling" in result) and result["stress_steps"] >= 1
    # the chance of diverging within the run (issue 66): at 400 steps where the space names no horizon
    assert result["horizon_steps"] == 400 and 0 <= result["p_diverge_low"] <= result["p_diverge"] <= 1
    assert result["stability_call"] in ("safe", "undecided", "likely fails") and result["safe_learning_rate"] > 0
    assert "P(diverges within 400 steps)" in text.stdout
    assert text.returncode == 0 and "grad_norm" in text.stdout and "status  complete" in text.stdout
    assert "margin  " in text.stdout and "predicted_max_lr" in text.stdout
    assert len(list((workdir / "studies").glob("*/manual/*"))) == 2
    assert result["worst_case_shape"] == [2, 64], result["worst_case_shape"]  # the long row cut to 64, not ~15 tokens
    assert result["cuda_alloc_conf"] == "not applicable (cpu)"  # recorded in every trial (issue 57)
    assert "the worst step is the whole file's, which the exports train: its longest sample" in out.stderr
    assert "the trials' 4 sampled rows' (dataset.max_samples) longest" in out.stderr


def test_trials_started_in_the_same_second_get_folders_of_their_own(tmp_path, monkeypatch):
    from sweeper.cli._trial import manual_trial_folder

    monkeypatch.setattr("time.strftime", lambda fmt: "20261204-095712")  # a fixed clock: the same second, named so
    folders = [manual_trial_folder(tmp_path / "manual") for _ in range(3)]
    assert [f.name for f in folders] == ["20261204-095712", "20261204-095712-2", "20261204-095712-3"]
    assert all(f.is_dir() for f in folders)


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_run_prints_front_and_dashboard_serves_the_study(tiny_model, workdir):
    path = write_space(
        workdir,
        tiny_space(
            tiny_model, name="cli", n_trials=2, search={"r": [4, 8], "bnb_4bit_compute_dtype": ["bfloat16", "float32"]}
        ),
    )
    out = sweep("run", str(path), cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert "[1/2] #0" in out.stdout and "[2/2] #1" in out.stdout
    assert "Pareto front" in out.stdout and "peak_GiB" in out.stdout and "complete 2" in out.stdout
    assert "note    max_steps=3" in out.stdout  # too short for the trend terms, and the console says so
    again = sweep("run", str(path), cwd=workdir)
    assert again.returncode == 0 and "nothing to run; raise --n-trials" in again.stdout

    from optuna_dashboard import wsgi

    storage = optuna.storages.RDBStorage("sqlite:///studies/cli.db")
    server = make_server("127.0.0.1", 0, wsgi(storage), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"
        studies = json.load(urllib.request.urlopen(f"{base}/api/studies"))["study_summaries"]
        [study] = [s for s in studies if s["study_name"] == "cli"]
        detail = json.load(urllib.request.urlopen(f"{base}/api/studies/{study['study_id']}"))
    finally:
        server.shutdown()
    assert len(detail["trials"]) == 2 and detail["objective_names"] == ["peak_memory_gib", "edge_proximity"]
    assert len(detail["best_trials"]) >= 1
    for trial in detail["trials"]:
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        assert {"status", "reason", "peak_memory_gib", "loss_trace", "grad_norm_trace"} <= set(attrs)


@pytest.mark.slow
def test_a_run_whose_every_trial_failed_exits_1(tiny_model, workdir):
    training = {"trial_timeout": 1, "max_retries": 0, "max_steps": OUTLASTS_ANY_TIMEOUT}  # a timeout by construction
    space = tiny_space(tiny_model, name="allfail", n_trials=1, training=training)
    out = sweep("run", str(write_space(workdir, space)), cwd=workdir)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "every trial this run started failed (timeout)" in lines[0], lines
    done = [line for line in out.stdout.splitlines() if line.startswith("done in")]
    assert done and "nothing to export" in done[0] and "sweep export" not in done[0], done  # no export hint


@pytest.mark.parametrize(("stop", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_and_sighup_are_handled_as_ctrl_c(stop, code):
    """The handler ``sweep`` installs turns both signals into :class:`sweeper.errors.Interrupted` (a
    KeyboardInterrupt: the running trials are killed and queued again) that names the signal, which interrupted
    trials record, and carries its number (exit code 128 + signal). A real sweep stopped by SIGTERM:
    test_faults.py::test_sigterm_stops_a_sweep_as_ctrl_c_does."""
    import os
    import signal
    import time

    from sweeper.cli import _stop_on_signals
    from sweeper.errors import STOP_CAUSE, Interrupted

    signum = signal.Signals[stop]

    def unhandled(signum, frame):
        raise AssertionError(f"{signal.Signals(signum).name} reached a handler sweep did not install")

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in saved:
            signal.signal(s, unhandled)
        _stop_on_signals()
        with pytest.raises(Interrupted) as raised:
            os.kill(os.getpid(), signum)
            time.sleep(10)  # the handler raises in the main thread at once
        assert isinstance(raised.value, KeyboardInterrupt)
        assert raised.value.signal_name == stop and 128 + raised.value.signal_number == code
        assert STOP_CAUSE["by"] == stop
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        STOP_CAUSE["by"] = "Ctrl-C"


@pytest.mark.slow
def test_sigterm_stops_the_dashboard_while_it_answers_requests(tmp_path):
    """A SIGTERM that came while the dashboard answered a request was swallowed by wsgiref's error handling and the
    server went on (a test's 30 s kill fallback ended it): requests are now served in a thread of their own."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from sweeper.testing import make_study

    make_study(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "sweeper.cli", "dashboard", "rep.db", "--host", "127.0.0.1", "--port", str(port)]
    log = (tmp_path / "dashboard.log").open("w")  # a pipe nobody reads would fill with the request log and block it
    server = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    url = f"http://127.0.0.1:{port}/api/studies"
    stop = threading.Event()

    def ask() -> bool:
        try:
            with opener.open(url, timeout=5) as response:
                return response.status == 200
        except OSError:
            return False

    def hammer() -> None:
        while not stop.is_set():
            ask()

    try:
        deadline = time.monotonic() + 60
        while not ask():
            assert server.poll() is None, (tmp_path / "dashboard.log").read_text()
            assert time.monotonic() < deadline, "the dashboard never answered"
            time.sleep(0.25)
        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)  # requests in flight all the time: the signal lands in one
        os.killpg(server.pid, signal.SIGTERM)
        start = time.monotonic()
        server.wait(timeout=20)
        assert time.monotonic() - start < 10, "the dashboard went on serving after SIGTERM"
    finally:
        stop.set()
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("SWEEPER_TRIAL_START", "bogus", "SWEEPER_TRIAL_START: 'bogus' is not a value it takes; unset it"),
        ("SWEEPER_WARM", "maybe", "SWEEPER_WARM: 'maybe' is not a value it takes; unset it or give 1"),
    ],
)
def test_a_mistyped_switch_of_the_trial_processes_is_one_line(
    tiny_model, workdir, monkeypatch, variable, value, needle
):
    # both were silently ignored (issue 48): a typo in SWEEPER_WARM=0 ran every trial warm
    monkeypatch.setenv(variable, value)
    path = write_space(workdir, tiny_space(tiny_model))
    for command in ("run", "trial"):
        out = run_cli(command, str(path), cwd=workdir)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(needle), (command, out.stderr)
        assert not (workdir / "studies").exists()
    monkeypatch.setenv(variable, {"SWEEPER_TRIAL_START": "exec", "SWEEPER_WARM": "0"}[variable])
    from sweeper.cli._common import _check_trial_environment

    _check_trial_environment()  # the value it takes passes


def test_a_dashboard_on_every_interface_says_who_can_reach_it():
    from sweeper.cli._dashboard import _loopback

    assert _loopback("127.0.0.1") and _loopback("localhost") and _loopback("::1") and _loopback("127.0.1.1")
    assert not _loopback("0.0.0.0") and not _loopback("10.1.2.3") and not _loopback("myhost")


@pytest.mark.slow
def test_a_sweep_stopped_by_its_timeout_says_so_and_how_to_go_on(tiny_model, workdir):
    # On a slow machine the demo ran 1 of its 10 configurations and ended "done in 2428 s" without saying that
    # study.timeout stopped it (issue 48).
    path = write_space(workdir, tiny_space(tiny_model, n_trials=3))
    out = run_cli("run", str(path), "--timeout", "1s", cwd=workdir)
    assert out.returncode == 0, out.stderr
    [line] = [ln for ln in out.stdout.splitlines() if ln.startswith("stopped at ")]
    # the limit named is the one the user set: --timeout here, study.timeout from the space file (issue 55)
    assert line.startswith("stopped at 1 of 3 trials: the --timeout (1 s) passed; a trial took a median"), line
    assert line.endswith("run the same command to go on (the trials so far are kept), or raise --timeout"), line


def test_a_dataset_whose_every_reply_is_empty_is_refused(tiny_model, workdir):
    # it gave a confident result (margin 357x, learns 50%, a safe pick) with only "also found: empty_response"
    # (issue 48), while a dataset whose every reply is cut away is refused
    from sweeper.testing import write_jsonl

    rows = [
        {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": " " * (i % 2)}]}
        for i in range(8)
    ]
    write_jsonl(workdir / "empty.jsonl", rows)
    space = tiny_space(tiny_model)
    space["dataset"] = {"path": "empty.jsonl"}
    out = run_cli("run", str(write_space(workdir, space)), cwd=workdir)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "dataset: every reply of its 8 rows is empty: the trials would teach the model to answer nothing" in lines[0]
    assert not (workdir / "studies").exists()


def test_a_cpu_cap_above_the_machine_is_said_and_a_given_card_is_not_called_this_machine(tiny_model, workdir):
    # issue 55, confusion 4: a CPU cap above the machine's memory was accepted silently (a trial past RAM is the
    # kernel's OOM kill, not a measured oom), and `estimate --device cpu --card-gib 80` printed "this machine's".
    path = write_space(workdir, tiny_space(tiny_model))
    out = run_cli("estimate", str(path), "--device", "cpu", "--card-gib", "4", "--set", "memory_limit_gib=8",
                  cwd=workdir)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "WARNING memory: the cap (8 GiB) is more than the machine's 4.00 GiB: it cannot bind" in out.stdout
    assert "cap 8 GiB of the 4.00 GiB given by --card-gib" in out.stdout and "this machine's" not in out.stdout
    here = run_cli("estimate", str(path), "--device", "cpu", "--set", "memory_limit_gib=60000", cwd=workdir)
    assert "is more than this machine's" in here.stdout and "cannot bind" in here.stdout, here.stdout
