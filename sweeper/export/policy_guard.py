"""The guard of a production config: a pytest file that turns red when the production run leaves what sweeper
measured (the ``policy`` export, issues 58 and 67).

``sweep export --format policy`` copies this file as it stands beside the policy module (``NAME.py``, from
:mod:`sweeper.export.policy_module`) and the production config reader (``NAME_read.py``, from
:mod:`sweeper.export.production`), as ``NAME_test.py``. Run ``pytest NAME_test.py`` in CI with
``SWEEPER_PRODUCTION_CONFIG=PATH`` naming the production file: an axolotl, LLaMA-Factory or TRL ``--config`` YAML, or
a JSON of keyword arguments. The file is read as ``sweep init --from`` reads it: an absent key is its tool's default
and is checked as such; every message names the file's own key, the value the study measured and the figure it
measured there. Without the variable every check of the production file is skipped as "production not checked".
Here, inside sweeper, it is linted and type-checked; sweeper never imports it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: The environment variable naming the production config the guard checks.
PRODUCTION_ENV = "SWEEPER_PRODUCTION_CONFIG"

#: The settings each parametrized check compares with the measured value (sweeper's names; the messages use the
#: file's). ``tests/export/test_production.py`` checks that every key of the trial schema that moves memory (its
#: memory role, ``grows``, ``shrinks`` or ``same``) or the stability measured is checked here or named there as not a
#: production file's key.
QUANTIZATION = ("bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype", "mixed_precision")
ADAPTER = ("r", "lora_alpha", "lora_dropout", "target_modules")
MEASURED_AS_IS = ("gradient_checkpointing", "optim", "packing", "max_grad_norm", "attn_implementation")
#: Every setting the guard checks: the lists above and those with a check of their own.
CHECKED = (
    *QUANTIZATION,
    *ADAPTER,
    *MEASURED_AS_IS,
    "model",
    "load_in_4bit",
    "load_in_8bit",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_seq_length",
    "pad_to_max_length",
    "learning_rate",
)

_HERE = Path(__file__)
_STEM = _HERE.name.removesuffix("_test.py")


def _load(name: str, path: Path) -> ModuleType:
    """The Python file at ``path`` as module ``name`` (registered: dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise pytest.UsageError(f"{path}: missing; export the policy again with 'sweep export --format policy'")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_POLICY_FILE = _HERE.with_name(_STEM + ".py")
_read: Any
POLICY: Any
if _HERE.name.endswith("_test.py"):  # the exported guard: its two files beside it
    _read = _load("sweeper_production_reader", _HERE.with_name(_STEM + "_read.py"))
    POLICY = _load("sweeper_policy", _POLICY_FILE).POLICY
else:  # inside sweeper's package, where it is linted and its references checked: the package's own modules
    from sweeper.export import policy_module, production

    _read, POLICY, _POLICY_FILE = production, policy_module.POLICY, Path(policy_module.__file__)
ENVELOPE: Any = POLICY.envelope


def _reading() -> Any:
    """The production config, read (None when the variable is unset); one line naming the file and the formats read
    for a file that cannot be read."""
    path = os.environ.get(PRODUCTION_ENV, "").strip()
    if not path:
        return None
    try:
        return _read.read_production(path)
    except _read.ProductionConfigError as exc:
        raise pytest.UsageError(f"{PRODUCTION_ENV}: {exc}") from None


READING = _reading()

_MEASURED = (
    f"measured by sweeper in study {POLICY.study!r}, trial {POLICY.trial}, on {POLICY.model}: peak "
    f"{ENVELOPE.peak_memory_gib} GiB under a {ENVELOPE.memory_limit_gib} GiB cap on {ENVELOPE.device}"
)


def _production() -> Any:
    if READING is None:
        pytest.skip(
            f"production not checked: {PRODUCTION_ENV} is unset; set it to the production config ({_read.FORMATS})"
        )
    return READING


def _fix(setting: str, value: Any) -> str:
    """What to write in the production file for ``setting`` at ``value``, in its own keys."""
    return str(_read.as_file_says(_production().tool, setting, value))


def _said(setting: str) -> str:
    """How the production file states ``setting``: ``micro_batch_size 4``, or ``optimizer (unset: axolotl's default
    adamw_torch_fused)``."""
    reading = _production()
    value = reading.settings.get(setting)
    if reading.defaulted(setting):
        return f"{reading.key(setting)} (unset: {reading.tool}'s default {value!r})"
    written = next((line.value for line in reading.lines if line.key == reading.keys.get(setting)), value)
    return f"{reading.key(setting)} {written!r}"


def _value(setting: str) -> Any:
    reading = _production()
    value = reading.settings.get(setting)
    if value is None:
        pytest.fail(
            f"{reading.path}: sets no {reading.key(setting)} and {reading.tool} has no default for it: write "
            f"{_fix(setting, getattr(POLICY, setting))}, as measured ({_MEASURED})"
        )
    return value


def _same_model(name: str) -> bool:
    """Whether a production model names the measured one: the same id or path, or the same last part of it
    (``meta-llama/Meta-Llama-3-8B`` and ``/models/Meta-Llama-3-8B``), or one of the policy's local copies."""

    def last(n: str) -> str:
        return n.rstrip("/").split("/")[-1].lower()

    names = {POLICY.model, *POLICY.model_aliases}
    return name in names or last(name) in {last(n) for n in names}


def _measured_model() -> None:
    """Skip a check of a figure measured on the policy's model when production trains another."""
    model = _production().settings.get("model")
    if model is not None and not _same_model(str(model)):
        pytest.skip(f"no figure for {model}: the study measured {POLICY.model} (test_the_model_is_the_measured_one)")


def test_the_policy_is_as_exported() -> None:
    text = _POLICY_FILE.read_text()
    found = re.search(r"# sweeper-sha256: ([0-9a-f]{64})\n\Z", text)
    assert found is not None and hashlib.sha256(text[: found.start()].encode()).hexdigest() == found.group(1), (
        f"{_POLICY_FILE.name} was edited since sweep exported it: its values are no longer what the study measured; "
        "export it again ('sweep export STUDY --format policy')"
    )


def test_the_model_is_the_measured_one() -> None:
    model = _value("model")
    assert _same_model(str(model)), (
        f"{_production().key('model')} {model!r} is not the measured model {POLICY.model!r}: every figure of this "
        f"policy (peak memory, safe learning rate) is of {POLICY.model}; sweep {model} itself ('sweep init --from "
        f"{_production().path}')"
    )


def test_4bit_loading_is_on_as_measured() -> None:
    reading = _production()
    assert _value("load_in_4bit") is True and not reading.settings.get("load_in_8bit"), (
        f"{_said('load_in_4bit')}, {_said('load_in_8bit')}: the {ENVELOPE.peak_memory_gib} GiB peak was of 4-bit "
        f"weights; write {_fix('load_in_4bit', True)} ({_MEASURED})"
    )


@pytest.mark.parametrize("setting", QUANTIZATION)
def test_quantization_and_precision_are_as_measured(setting: str) -> None:
    reading = _production()
    got = reading.settings.get(setting) if setting == "mixed_precision" else _value(setting)
    want = getattr(POLICY, setting)
    why = {
        "bnb_4bit_quant_type": "the 4-bit weights' code (nf4 or fp4) moves the numerics",
        "bnb_4bit_use_double_quant": "double quant moves the 4-bit weights' bytes",
        "bnb_4bit_compute_dtype": "the compute dtype moves the peak and the precision (float16 overflows)",
        "mixed_precision": "the autocast moves the peak and the precision (an fp16 autocast is the precision NaN)",
    }[setting]
    assert got == want, (
        f"{_said(setting)}: the figures were measured at {setting} {want} ({why}); write {_fix(setting, want)} "
        f"({_MEASURED})"
    )


@pytest.mark.parametrize("setting", ADAPTER)
def test_the_adapter_is_as_measured(setting: str) -> None:
    got, want = _value(setting), getattr(POLICY, setting)
    if setting == "target_modules" and got == "all-linear":  # the decoder's linear layers of Llama-family models
        same = set(want) == set(_read.ALL_LINEAR)
    elif setting == "target_modules" and not isinstance(got, str):
        same = set(got) == set(want)
    else:
        same = got == want
    assert same, (
        f"{_said(setting)}: the adapter measured has {setting} {want!r} (lora_alpha / r scales its step: "
        f"{POLICY.lora_alpha / POLICY.r:g} measured); write {_fix(setting, want)} ({_MEASURED})"
    )


def test_effective_batch_is_as_measured() -> None:
    batch, accumulation = _value("per_device_train_batch_size"), _value("gradient_accumulation_steps")
    ran = {POLICY.effective_batch(), ENVELOPE.measured_effective_batch_size, ENVELOPE.confirmed_effective_batch_size}
    ran.discard(None)
    assert batch * accumulation in ran, (
        f"{_said('per_device_train_batch_size')} x {_said('gradient_accumulation_steps')} = {batch * accumulation}: "
        f"the stability figures hold at an effective batch measured: {' or '.join(map(str, sorted(ran)))} (the "
        f"trial ran {ENVELOPE.measured_effective_batch_size}, the policy's is {POLICY.effective_batch()})"
    )


def test_the_batch_is_the_measured_one() -> None:
    _measured_model()
    batch = _value("per_device_train_batch_size")
    oom = ENVELOPE.oom_above
    above = oom is not None and oom[0] > POLICY.per_device_train_batch_size
    ran_out = f"; batch {oom[0]} x {oom[1]} ran out of memory ({oom[2]} GiB)" if above else ""
    assert batch <= POLICY.per_device_train_batch_size, (
        f"{_said('per_device_train_batch_size')} > {POLICY.per_device_train_batch_size}: the measured envelope is "
        f"batch {POLICY.per_device_train_batch_size} x {ENVELOPE.largest_fit_max_seq_length} tokens at most"
        f"{ran_out} ({_MEASURED})"
    )


def test_max_seq_length_is_within_what_was_measured() -> None:
    _measured_model()
    reading = _production()
    length = _value("max_seq_length")
    rows = ENVELOPE.largest_fit_row_tokens or ENVELOPE.largest_fit_max_seq_length
    oom = ENVELOPE.oom_above
    ran_out = f"; {oom[0]} x {oom[1]} ran out of memory ({oom[2]} GiB)" if oom else ""
    padded = reading.settings.get("packing") or reading.settings.get("pad_to_max_length")
    if padded:
        how = _said("packing") if reading.settings.get("packing") else _said("pad_to_max_length")
        assert length <= rows, (
            f"{_said('max_seq_length')} with {how}: every row is {length} tokens long, but the longest rows measured "
            f"to fit at batch {POLICY.per_device_train_batch_size} were {rows} tokens (peak "
            f"{ENVELOPE.fit_peak_memory_gib} GiB under the {ENVELOPE.memory_limit_gib} GiB cap){ran_out}"
        )
        return
    assert length <= ENVELOPE.largest_fit_max_seq_length, (
        f"{_said('max_seq_length')} > {ENVELOPE.largest_fit_max_seq_length}: the longest measured to fit at batch "
        f"{POLICY.per_device_train_batch_size}, whose rows were {rows} tokens (peak {ENVELOPE.fit_peak_memory_gib} "
        f"GiB under the {ENVELOPE.memory_limit_gib} GiB cap){ran_out}"
    )
    if length > rows:
        warnings.warn(
            f"{_said('max_seq_length')}: the study's rows were at most {rows} tokens, so its peak holds for "
            f"production rows of at most {rows} tokens; longer ones were not measured",
            stacklevel=1,
        )


def test_learning_rate_is_at_most_the_safe_rate() -> None:
    _measured_model()
    if ENVELOPE.safe_learning_rate is None:
        pytest.skip("the trial has no measured margin: no safe rate was measured")
    rate = float(_value("learning_rate"))
    horizon = ENVELOPE.horizon_steps
    assert rate <= ENVELOPE.safe_learning_rate, (
        f"{_said('learning_rate')} > {ENVELOPE.safe_learning_rate:.3g}, the safe rate for a {horizon}-step run: the "
        f"largest whose chance of diverging within {horizon} steps has its upper end at 5% (predicted_max_lr "
        f"{ENVELOPE.predicted_max_lr:.3g} is the edge, where {horizon}-step runs fail about half the time; a longer "
        f"run is riskier) ({_MEASURED})"
    )


@pytest.mark.parametrize("setting", MEASURED_AS_IS)
def test_memory_moving_settings_are_as_measured(setting: str) -> None:
    reading = _production()
    got, want = _value(setting), getattr(POLICY, setting)
    assert got == want, (
        f"{_said(setting)}: the peak and the margin were measured with {setting} {want!r}; write "
        f"{_fix(setting, want)} ({_MEASURED})"
    )
    if setting == "packing" and reading.settings.get("packing_across_samples"):
        pytest.fail(
            f"{_said('packing')} without neat_packing: samples attend to each other, which no trial measured; write "
            f"{_fix('packing', True)}"
        )


def test_nothing_unmeasured_moves_memory() -> None:
    reading = _production()
    assert not reading.not_measured, f"{reading.path}: " + "; ".join(
        f"{key}: {why}" for key, why in reading.not_measured.items()
    )


def test_every_key_is_read() -> None:
    reading = _production()
    for key, why in reading.noted.items():
        warnings.warn(f"{reading.path}: {key}: {why}", stacklevel=1)
    unread = [line.key for line in reading.lines if line.status == "unread"]
    if unread:
        warnings.warn(
            f"{reading.path}: {len(unread)} key(s) sweeper does not know, not checked: {', '.join(unread)}",
            stacklevel=1,
        )


def test_the_run_starts_with_the_measured_environment() -> None:
    if not POLICY.environment:
        pytest.skip("the trial ran with the allocator's defaults: no environment to set")
    missing = {k: v for k, v in POLICY.environment.items() if os.environ.get(k) != v}
    if missing:
        warnings.warn(
            "the production run must start with "
            + " ".join(f"{k}={v}" for k, v in missing.items())
            + " (the trial's allocator settings); this CI job does not set it",
            stacklevel=1,
        )


def test_the_model_loads_in_4bit() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the model is loaded in 4-bit only on a GPU")
    model_path = os.environ.get("SWEEPER_POLICY_MODEL")
    if not model_path:
        pytest.skip("set SWEEPER_POLICY_MODEL to the model's local folder to load it (no hub download in a test)")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=POLICY.bnb_config())
    assert model.is_loaded_in_4bit, f"{model_path} did not load in 4-bit with the policy's BitsAndBytesConfig"
