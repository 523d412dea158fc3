"""Warm trial processes (:class:`sweeper.trial.TrialProcess`): a trial run in a process that already ran another one
gives the same result as in a fresh process (forked by the zygote, :mod:`sweeper.trial._zygote`, or started with
``python -m``), and the process is replaced after what could leave it changed.

Real trials on the tiny Llama; the comparisons are bitwise on the CPU (same kernels, same seed), and were on an H200
(``benchmarks/gpu/results/gpu-2026-12-04``)."""

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from sweeper.devices import cuda_visible
from sweeper.space import TrialConfig
from sweeper.testing import OUTLASTS_ANY_TIMEOUT, tiny_trial_config
from sweeper.trial import TrialProcess, TrialResult, run_trial

pytestmark = pytest.mark.slow


def _config(model, **kw) -> TrialConfig:
    return tiny_trial_config(model, **{**dict(max_steps=4, learning_rate=1e-3), **kw})


def _run_killing(process: TrialProcess, pid: int, config: TrialConfig, folder, path: str) -> TrialResult:
    """Run ``config`` in ``process`` while ``pid`` is killed with SIGKILL 1.5 s in."""

    def kill_soon():
        time.sleep(1.5)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    try:
        return process.run(config, folder, model_path=path)
    finally:
        killer.join()


def _same_training(a: TrialResult, b: TrialResult) -> None:
    assert a.status == b.status == "complete", (a.reason, b.reason)
    assert a.constant.loss_trace == b.constant.loss_trace
    assert a.constant.grad_norm_trace == b.constant.grad_norm_trace
    assert a.constant.probe_loss_trace == b.constant.probe_loss_trace
    assert a.constant.instability == b.constant.instability
    # The stress phase (after the constant one) too: its margin and probe are the same in a warm process.
    assert a.stress.probe_loss_trace == b.stress.probe_loss_trace
    assert a.stress.stability_margin == b.stress.stability_margin
    peaks = (a.memory.peak_memory_gib, b.memory.peak_memory_gib)
    assert peaks[0] is not None and peaks[1] is not None and abs(peaks[0] - peaks[1]) <= 0.05, peaks


@pytest.fixture(scope="module")
def tiny_model_bf16(tiny_model, tmp_path_factory):
    """The tiny Llama stored in bfloat16, as most checkpoints are: bf16 and fp32 compute load the same weights."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    target = tmp_path_factory.mktemp("tiny-bf16")
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(target)
    for f in tiny_model.iterdir():
        if "token" in f.name or f.name.endswith(".jinja"):
            shutil.copy(f, target / f.name)
    return target


def test_a_warm_trial_trains_as_a_cold_one(tiny_model_bf16, tmp_path):
    """Cold, then in one warm process: a trial with other model-level and LoRA settings, the same trial (its model
    loaded afresh), and trials that reuse that model, one with another compute dtype (the checkpoint is stored in
    bf16, so bf16 and fp32 compute load the same weights)."""
    tiny_model = tiny_model_bf16
    path = str(tiny_model)
    want = _config(tiny_model, bnb_4bit_compute_dtype="bfloat16")
    other = _config(
        tiny_model,
        bnb_4bit_compute_dtype="float32",
        bnb_4bit_quant_type="fp4",
        bnb_4bit_use_double_quant=False,
        r=16,
        per_device_train_batch_size=4,
        gradient_checkpointing=False,
    )
    cold = run_trial(want, tmp_path / "cold", model_path=path)
    cold_other = run_trial(other, tmp_path / "cold-other", model_path=path)
    assert (
        cold.provenance.warm is False
        and cold.provenance.model_reused is False
        and cold.provenance.setup_time_s > cold.provenance.import_time_s > 0
    )
    process = TrialProcess()
    try:
        first = process.run(other, tmp_path / "w1", model_path=path)
        pid = process.pid
        again = process.run(want, tmp_path / "w2", model_path=path)
        fp32 = process.run(
            dataclasses.replace(want, bnb_4bit_compute_dtype="float32"), tmp_path / "w3", model_path=path
        )
        reused = process.run(want, tmp_path / "w4", model_path=path)
        assert process.pid == pid
    finally:
        process.close()
    assert first.provenance.warm is False and again.provenance.warm is True and again.provenance.model_reused is False
    assert fp32.provenance.model_reused is True and reused.provenance.model_reused is True
    assert again.provenance.import_time_s < 0.5
    # A process's first trial: forked by a zygote that has imported already on the CPU; where CUDA is visible there
    # are no zygotes (a forked CUDA context is unusable), so it imports itself (14-15 s on an H200, 2026-12-04).
    if cuda_visible():
        assert first.provenance.import_time_s > again.provenance.import_time_s
    else:
        assert first.provenance.import_time_s < 0.5
    _same_training(cold_other, first)
    _same_training(cold, again)
    _same_training(cold, reused)
    cold_fp32 = run_trial(
        dataclasses.replace(want, bnb_4bit_compute_dtype="float32"), tmp_path / "cold-fp32", model_path=path
    )
    _same_training(cold_fp32, fp32)


def test_after_an_oom_a_kill_or_a_timeout_the_next_trial_gets_a_fresh_process(tiny_model, tmp_path):
    path = str(tiny_model)
    process = TrialProcess()
    try:
        ok = process.run(_config(tiny_model), tmp_path / "1", model_path=path)
        warm_pid = process.pid
        assert ok.status == "complete" and warm_pid is not None
        # A real allocation failure under the cap, in the warm process: it is replaced. Four times what fits: the
        # first forward cannot allocate, whatever the allocator noise. The resident set at the failure is near the
        # cap; it may pass it by the shared-library pages that RLIMIT_DATA does not count.
        big = _config(tiny_model, per_device_train_batch_size=64, max_seq_length=1024, memory_limit_gib=0.75)
        oom = process.run(big, tmp_path / "2", model_path=path)
        assert oom.status == "oom" and oom.provenance.warm is True, oom.reason
        assert oom.fail_phase in ("forward", "backward", "optimizer") and oom.fail_step == 1
        # The step as it ran: the data holds 32 rows (tiny_trial_config), so its one micro-batch is 32 rows.
        assert "32 x 1024 tokens" in oom.reason and "max_seq_length=1024" in oom.reason
        if cuda_visible():  # the allocation that failed is never reserved: the peak stays under the cap
            assert 0 < oom.memory.peak_memory_gib <= 0.75 + 0.01, oom.memory.peak_memory_gib
        else:
            assert 0.75 <= oom.memory.peak_memory_gib < 0.95, oom.memory.peak_memory_gib  # never below its cap
        assert process.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(warm_pid, 0)
        after_oom = process.run(_config(tiny_model), tmp_path / "3", model_path=path)
        assert after_oom.status == "complete" and after_oom.provenance.warm is False
        assert after_oom.constant.loss_trace == ok.constant.loss_trace

        # Killed mid-trial while warm: a crash, and the next trial runs in a fresh process.
        warm_pid = process.pid

        crashed = _run_killing(process, warm_pid, _config(tiny_model, max_steps=400), tmp_path / "4", path)
        assert crashed.status == "crash" and "SIGKILL" in crashed.reason and crashed.provenance.warm is True
        again = process.run(_config(tiny_model), tmp_path / "5", model_path=path)
        assert again.status == "complete" and again.provenance.warm is False and process.pid != warm_pid

        # A timeout kills the warm process's whole group.
        warm_pid = process.pid
        slow_config = _config(tiny_model, max_steps=OUTLASTS_ANY_TIMEOUT, trial_timeout_s=3.0)  # by construction
        slow = process.run(slow_config, tmp_path / "6", model_path=path)
        assert slow.status == "timeout" and process.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(warm_pid, 0)

        # An OOM while loading in a warm process is run again in a fresh one (a warm heap can fail a load that fits
        # a fresh process): its result is the fresh process's, the warm try's log kept beside it.
        assert process.run(_config(tiny_model), tmp_path / "7", model_path=path).status == "complete"
        reload = _config(tiny_model, memory_limit_gib=0.3, bnb_4bit_quant_type="fp4")  # not the kept model: a load
        tight = process.run(reload, tmp_path / "8", model_path=path)
        assert tight.status == "oom" and tight.fail_phase == "load" and tight.provenance.warm is False, tight.reason
        assert (tmp_path / "8" / "worker.warm-load-oom.log").is_file() and (tmp_path / "8" / "worker.log").is_file()
    finally:
        process.close()


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _zygotes() -> set[int]:
    """This process's zygotes (:mod:`sweeper.trial._zygote`), from /proc."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            ppid = _ppid(int(entry))
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and b"sweeper.trial._child.zygote" in cmdline:
            found.add(int(entry))
    return found


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(cuda_visible(), reason="no zygotes where CUDA is visible (a forked CUDA context is unusable)")
def test_a_killed_zygote_takes_its_trial_process_along_and_the_next_trial_gets_a_new_one(tiny_model, tmp_path):
    """The zygote's child dies with it (PR_SET_PDEATHSIG), the sweep sees a crash naming SIGKILL, and the next
    fresh process comes from a new zygote; a variable no library reads at import (SWEEPER_CACHE) does not call for
    another zygote, any other variable does."""
    path = str(tiny_model)
    process = TrialProcess()
    try:
        first = process.run(_config(tiny_model), tmp_path / "1", model_path=path)
        assert first.status == "complete" and first.provenance.import_time_s < 0.5, first.reason
        worker = process.pid
        assert worker is not None and os.getpgid(worker) == worker  # leads its own group: a killpg reaches it all
        zygote = _ppid(worker)
        assert zygote in _zygotes()

        crashed = _run_killing(process, zygote, _config(tiny_model, max_steps=400), tmp_path / "2", path)
        assert crashed.status == "crash" and "SIGKILL" in crashed.reason, crashed.reason
        assert _gone(worker)
        again = process.run(_config(tiny_model), tmp_path / "3", model_path=path)
        assert again.status == "complete" and again.constant.loss_trace == first.constant.loss_trace
        assert process.pid is not None and _ppid(process.pid) not in (zygote, os.getpid())
    finally:
        process.close()
    assert zygote not in _zygotes()
    before = _zygotes()
    same = run_trial(_config(tiny_model), tmp_path / "4", model_path=path, env={**os.environ, "SWEEPER_CACHE": "x"})
    assert same.status == "complete" and _zygotes() == before
    other = {**os.environ, "SWEEPER_ZYGOTE_TEST": str(tmp_path)}
    assert run_trial(_config(tiny_model), tmp_path / "5", model_path=path, env=other).status == "complete"
    assert len(_zygotes() - before) == 1


def test_a_warm_process_aborted_by_a_failed_allocation_is_run_again_fresh(tmp_path):
    # CI at 1171e44: a warm process holding 0.50 GiB of data segment, given a trial capped at 0.3 GiB, aborted in a
    # Rust library (tokenizers, safetensors) on its first allocation instead of raising an OOM while loading; that
    # is an out-of-memory the library could not report, and like a load OOM in a warm process it is run again fresh
    from sweeper.trial import TrialResult
    from sweeper.trial._ended import allocation_abort

    log = tmp_path / "worker.log"
    log.write_text("sweeper: trial 2 of this process\nmemory allocation of 81920 bytes failed\nstack backtrace:\n")
    aborted = TrialResult(status="crash", reason="worker killed by SIGABRT without a result: skipping backtrace")
    assert allocation_abort(aborted, log)
    killed = TrialResult(status="crash", reason="worker killed by SIGKILL without a result")
    assert not allocation_abort(killed, log)  # a kill is not an allocation that failed
    log.write_text("sweeper: trial 2 of this process\nSomething else aborted\n")
    assert not allocation_abort(aborted, log)
    assert not allocation_abort(TrialResult(status="oom", reason="out of memory at load"), log)


def test_a_process_aborted_by_a_failed_allocation_before_its_first_step_is_an_oom_while_loading(tmp_path):
    # CI at 2b5f176: a fresh trial process (the retry of a warm one's load OOM) held a 0.45 GiB data segment before
    # its trial, capped at 0.3 GiB; its first allocation to fail was the tokenizer's (Rust), which aborts. Before the
    # first step that is the configuration not loading under its cap: an oom at load, not a crash. After a step has
    # begun, an abort stays a crash (what failed there is not known).
    import subprocess
    import sys

    from sweeper.trial._job import TrialProgress

    config = _config(Path("unused"), memory_limit_gib=0.3)
    log = tmp_path / "worker.log"
    log.write_text("sweeper: trial 1 of this process\nmemory allocation of 49152 bytes failed\nstack backtrace:\n")
    process = TrialProcess()
    for progress, status in (
        (None, "oom"),
        (TrialProgress(phase="load"), "oom"),
        (TrialProgress(phase="train"), "crash"),
    ):
        aborts = subprocess.Popen([sys.executable, "-c", "import os; os.abort()"])  # a real SIGABRT
        process._last_progress = progress
        result = process._died(config, aborts, log, 1.0, warm=False)
        assert aborts.returncode == -signal.SIGABRT
        assert result.status == status, (progress, result.reason)
        if status == "oom":
            assert result.fail_phase == "load" and result.fail_step == 0 and result.memory.peak_memory_gib == 0.3
            assert result.reason.startswith("out of memory while loading, under the cap: worker killed by SIGABRT")
    log.write_text("sweeper: trial 1 of this process\nSomething else aborted\n")
    aborts = subprocess.Popen([sys.executable, "-c", "import os; os.abort()"])
    process._last_progress = None
    assert process._died(config, aborts, log, 1.0, warm=False).status == "crash"  # an abort of another cause
