"""Real trials on the tiny Llama, each in its own worker process: complete, OOM while loading under a real cap,
timeout, crash, and the 4-bit check. No mocks: the OOM is a real allocation failure. The NaN of fp16 overflow is
test_diagnosis.py's (here: the same run completes in fp32); an OOM in the first forward, with its phase, step and
peak, is test_warm.py's (in a warm process) and test_study.py's (in a sweep)."""

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from sweeper.space import TrialConfig
from sweeper.testing import OUTLASTS_ANY_TIMEOUT, tiny_trial_config
from sweeper.trial import Measures, run_trial

pytestmark = pytest.mark.slow


def _config(model, **kw) -> TrialConfig:
    return tiny_trial_config(model, **{**kw})


def test_trial_completes_with_finite_values(tiny_model, tmp_path):
    result = run_trial(_config(tiny_model, bnb_4bit_compute_dtype="bfloat16"), tmp_path, model_path=str(tiny_model))
    assert result.status == "complete", result.reason
    assert (
        result.constant.steps_done == 3 and len(result.constant.loss_trace) == len(result.constant.grad_norm_trace) == 3
    )
    assert all(x is not None and x > 0 for x in result.constant.loss_trace + result.constant.grad_norm_trace)
    assert 0.2 < result.memory.peak_memory_gib < 4.0 and result.memory.memory_kind == "cpu_peak_rss"
    assert result.provenance.quantized_linear_count == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert result.constant.instability is not None and set(result.constant.instability_components) == {
        "probe_rebound",
        "activation_growth",
        "skipped_step_fraction",
        "loss_spike",
        "grad_norm_growth",
    }
    assert (
        result.constant.probe_steps[0] == 0
        and result.constant.probe_steps[-1] == 3
        and None not in result.constant.probe_loss_trace
    )
    assert result.constant.max_activation_trace and all(a > 0 for a in result.constant.max_activation_trace)
    assert (
        result.provenance.lora_alpha == 8
        and result.provenance.effective_batch_size == 2
        and result.provenance.versions["bitsandbytes"]
    )
    assert (tmp_path / "result.json").is_file() and (tmp_path / "worker.log").is_file()


def test_the_run_that_overflows_fp16_completes_in_fp32(tiny_model, tmp_path):
    # An adapter scale of 1000 and a learning rate of 1 push the 4-bit layers' inputs past fp16's 65504 by step 3:
    # that run in float16 goes NaN (tests/trial/test_diagnosis.py::test_fp16_overflow_is_a_precision_nan, the same
    # configuration); in float32 it does not overflow.
    hot = dict(lora_alpha_ratio=1000.0, learning_rate=1.0, max_steps=8)
    fp32 = run_trial(_config(tiny_model, bnb_4bit_compute_dtype="float32", **hot), tmp_path, model_path=str(tiny_model))
    assert fp32.status == "complete", fp32.reason


def test_oom_while_loading(tiny_model, tmp_path):
    result = run_trial(_config(tiny_model, memory_limit_gib=0.3), tmp_path, model_path=str(tiny_model))
    assert result.status == "oom" and result.fail_phase == "load" and result.fail_step == 0
    assert result.memory.peak_memory_gib >= 0.3  # never below the cap it ran out under


def test_oom_inside_transformers_weight_conversion_is_an_oom(tmp_path):
    """The built-in checkpoint is float16: loading it for bfloat16 compute converts every weight, and transformers
    turns an allocation that fails there into a warning report and a bare RuntimeError ("issues during automatic
    conversion of the weights"), which was recorded as ``error``: at caps of 0.95 to 1.1 GiB on this CPU (at 0.8 the
    allocation fails before the conversion, at 1.15 the trial completes). transformers converts on a thread pool, so
    where the edge falls moves with the machine's load (a loaded machine once completed the load at 0.95 GiB): the
    trial runs at five caps around it; none may end in ``error``, and one must run out of memory while loading (a
    fresh-clone run once loaded at 0.9 GiB and ran out of memory in the backward, so the caps reach down to 0.8)."""
    from sweeper.model import resolve_model
    from sweeper.space import ModelSpec

    path = resolve_model(ModelSpec())
    outcomes = []
    for cap_gib in (0.8, 0.85, 0.9, 0.95, 1.0):
        # One step of one 32-token row and no stress phase: what is tested is the load; a trial that loads would
        # otherwise go on to 3 steps of 2 x 64 tokens and 11 bfloat16 stress steps, minutes on a CPU without
        # AVX512-BF16. What the load allocates does not depend on the training's shape.
        config = _config(
            Path(path),
            memory_limit_gib=cap_gib,
            bnb_4bit_compute_dtype="bfloat16",
            max_steps=1,
            per_device_train_batch_size=1,
            max_seq_length=32,
        )
        result = run_trial(config, tmp_path / str(cap_gib), model_path=path, measures=Measures(stress=None))
        outcomes.append((cap_gib, result.status, result.fail_phase, result.reason))
    assert not any(status == "error" for _, status, _, _ in outcomes), outcomes
    assert any(status == "oom" and phase == "load" for _, status, phase, _ in outcomes), outcomes


def test_timeout_kills_the_worker(tiny_model, tmp_path):
    start = time.monotonic()
    config = _config(tiny_model, trial_timeout_s=1.5, max_steps=OUTLASTS_ANY_TIMEOUT)
    result = run_trial(config, tmp_path, model_path=str(tiny_model))
    assert result.status == "timeout" and "trial_timeout=1.5" in result.reason
    # killed at its timeout, not run out: the trial process's start (a zygote's, seconds on a loaded machine) and the
    # 1.5 s, where running its steps would take a quarter of an hour at the least
    assert time.monotonic() - start < 120
    pid = int((tmp_path / "worker.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_worker_ended_by_a_signal_is_a_crash_naming_it(tiny_model, tmp_path):
    """SIGSEGV: what a fault inside a CUDA kernel or a C extension sends. The reason names the signal, never a library
    warning that happened to be the log's last line. SIGKILL: tests/trial/test_warm.py (a warm process) and
    tests/study/test_study.py (in a sweep, which retries it)."""

    def kill_when_started():
        pid_file = tmp_path / "worker.pid"
        while not pid_file.exists():
            time.sleep(0.05)
        time.sleep(1.0)
        os.kill(int(pid_file.read_text()), signal.SIGSEGV)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    result = run_trial(_config(tiny_model), tmp_path, model_path=str(tiny_model))
    killer.join()
    assert result.status == "crash" and "SIGSEGV" in result.reason, result.reason
    assert "warn" not in result.reason.lower() and "OOM killer" not in result.reason
    # Where its Python code was, from the traceback faulthandler wrote to the log: a frame of this package's worker
    # at the least (the signal came while it imported, loaded or trained).
    assert re.search(r"in \w+ \(\S+\.py:\d+\)", result.reason), result.reason
    assert "Fatal Python error" in (tmp_path / "worker.log").read_text()


def test_error_is_reported_not_raised(tiny_model, tmp_path):
    result = run_trial(_config(tiny_model, target_modules=("no_such_proj",)), tmp_path, model_path=str(tiny_model))
    assert result.status == "error" and "no_such_proj" in result.reason and result.fail_phase == "load"


def test_quantization_check_catches_a_mismatch(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from sweeper.trial._child.checks import QuantizationCheckError, check_quantization

    asked = _config(tiny_model, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model,
        quantization_config=BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        ),
    )
    assert check_quantization(model, asked) == 14
    for field, value in [
        ("bnb_4bit_quant_type", "fp4"),
        ("bnb_4bit_use_double_quant", False),
        ("bnb_4bit_compute_dtype", "float16"),
    ]:
        with pytest.raises(QuantizationCheckError, match=field):
            check_quantization(model, _config(tiny_model, **{field: value}))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model)
    with pytest.raises(QuantizationCheckError, match="no bitsandbytes 4-bit"):
        check_quantization(plain, asked)


def test_a_target_that_matches_nothing_is_an_error_even_when_another_matches(tiny_model, tmp_path):
    # peft raises only when no target matches at all; q_proj matches, v_projj does not: the trial must not train on
    # q_proj alone as if v_projj had taken effect.
    config = _config(tiny_model, target_modules=("q_proj", "v_projj"))
    result = run_trial(config, tmp_path, model_path=str(tiny_model))
    assert result.status == "error" and result.fail_phase == "load", result.reason
    assert "LoRA target check failed" in result.reason and "['v_projj']" in result.reason and "q_proj" in result.reason
