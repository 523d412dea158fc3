"""The ``policy`` export (issue 58): the chosen configuration and the envelope the study measured around it, frozen
in a small Python module (standard library only at import; transformers, peft and torch inside the helpers that
build their objects), and a pytest file beside it that turns red when a production config leaves that envelope.

The write-ups people follow after a QLoRA OOM end with a frozen policy and a pytest guard whose bounds are guesses
(``0 < max_seq_length <= 4096``); these bounds are what the study measured: the quantization the trial ran, its
effective batch, the largest ``max_seq_length`` that fit at its batch (and what ran out above it), and the low end
of ``predicted_max_lr``'s interval as the safe learning rate. The test reads the production config the user names
(``SWEEPER_PRODUCTION_CONFIG``: an axolotl or LLaMA-Factory YAML, or a JSON of the keyword arguments, as the
``json`` export or a TRL/transformers script writes them), or the policy's own fields when none is named.
"""

from __future__ import annotations

import pprint

from sweeper.export._dataset import ExportData
from sweeper.export._format import ExportFormat
from sweeper.export._settings import ExportSettings
from sweeper.stability import DEFAULT_HORIZON_STEPS

#: The environment variable naming the production config the guard checks.
PRODUCTION_ENV = "SWEEPER_PRODUCTION_CONFIG"

_MODULE = '''"""The QLoRA configuration sweeper measured, frozen as a policy: study {study!r}, trial {trial}.

Written by 'sweep export --format policy' (sweeper {version}, {exported}). The single source of truth of the
production run's memory-moving settings, and the envelope the study measured around them; the test file beside it
(this file's name with "_test") checks a production config against it. Imports only the standard library;
bnb_config() and lora_config() import transformers, peft and torch when called.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Envelope:
    """What the study measured around this configuration.

    peak_memory_gib: the trial's measured peak ({memory_kind}) under memory_limit_gib on {device}.
    largest_fit_max_seq_length: the largest max_seq_length a trial ran within the cap at this
        per_device_train_batch_size (fit_peak_memory_gib its peak).
    oom_above: the smallest shape measured out of memory above it, (per_device_train_batch_size, max_seq_length,
        peak_memory_gib), or None.
    safe_learning_rate: the largest constant rate whose chance of diverging within the study's horizon has its
        upper end at 5% (predicted_max_lr is the edge, where long runs fail about half the time), or None when not
        measured.
    """

    peak_memory_gib: float | None
    memory_limit_gib: float
    device: str | None
    largest_fit_max_seq_length: int
    fit_peak_memory_gib: float | None
    oom_above: tuple[int, int, float | None] | None
    predicted_max_lr: float | None
    safe_learning_rate: float | None
    measured_effective_batch_size: int


@dataclass(frozen=True)
class Policy:
    """The configuration: 4-bit loading, LoRA, the batch and the collation, as the trial ran them (the effective
    batch as exported), with its Envelope and where it came from."""

    model: str
    load_in_4bit: bool
    bnb_4bit_quant_type: str
    bnb_4bit_use_double_quant: bool
    bnb_4bit_compute_dtype: str
    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: tuple[str, ...]
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    optim: str
    gradient_checkpointing: bool
    max_grad_norm: float
    max_seq_length: int
    packing: bool
    attn_implementation: str
    study: str
    trial: int
    sweeper_version: str | None
    envelope: Envelope

    def effective_batch(self) -> int:
        """per_device_train_batch_size x gradient_accumulation_steps (one device)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    def bnb_config(self) -> Any:
        """transformers.BitsAndBytesConfig of the trial's 4-bit loading."""
        import torch
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=self.load_in_4bit,
            bnb_4bit_quant_type=self.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=self.bnb_4bit_use_double_quant,
            bnb_4bit_compute_dtype=getattr(torch, self.bnb_4bit_compute_dtype),
        )

    def lora_config(self) -> Any:
        """peft.LoraConfig of the trial's adapter."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )

    def training_arguments(self) -> dict[str, Any]:
        """Keyword arguments of transformers.TrainingArguments (or TRL's SFTConfig) for the measured settings; add
        output_dir and the run's length."""
        return {{
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "optim": self.optim,
            "gradient_checkpointing": self.gradient_checkpointing,
            "max_grad_norm": self.max_grad_norm,
            "bf16": self.bnb_4bit_compute_dtype == "bfloat16",
            "fp16": self.bnb_4bit_compute_dtype == "float16",
        }}

    def as_flat(self) -> dict[str, Any]:
        """The policy's settings by their standard names (what the test compares a production config with)."""
        flat = asdict(self)
        flat.pop("envelope")
        return flat


POLICY = Policy(
{fields}
)
'''

_TEST = '''"""Guards the production config with the envelope sweeper measured (study {study!r}, trial {trial}): run
pytest on this file in CI. Set {env}=PATH to check a production file (an axolotl or LLaMA-Factory YAML, or a JSON of
keyword arguments: the 'json' export, or a TRL/transformers script's BitsAndBytesConfig, LoraConfig and
TrainingArguments/SFTConfig keywords, flat or as the json export nests them); without it the policy's own fields are
checked. Written by 'sweep export --format policy' beside the policy module it imports (this file's name without
"_test").
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__)
_MODULE = _HERE.with_name(_HERE.name.removesuffix("_test.py") + ".py")
_spec = importlib.util.spec_from_file_location("sweeper_policy", _MODULE)
assert _spec is not None and _spec.loader is not None
_policy = importlib.util.module_from_spec(_spec)
sys.modules["sweeper_policy"] = _policy  # dataclasses look their module up by name
_spec.loader.exec_module(_policy)
POLICY = _policy.POLICY
ENVELOPE = POLICY.envelope

#: Each production format's names for the policy's settings (None: the key is read by a rule below).
_AXOLOTL = {{
    "load_in_4bit": "load_in_4bit", "micro_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps", "sequence_len": "max_seq_length",
    "learning_rate": "learning_rate", "optimizer": "optim", "gradient_checkpointing": "gradient_checkpointing",
    "lora_r": "r", "lora_alpha": "lora_alpha", "sample_packing": "packing",
}}
_LLAMA_FACTORY = {{
    "quantization_type": "bnb_4bit_quant_type", "double_quantization": "bnb_4bit_use_double_quant",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps", "cutoff_len": "max_seq_length",
    "learning_rate": "learning_rate", "optim": "optim", "lora_rank": "r", "lora_alpha": "lora_alpha",
    "packing": "packing",
}}


def _dtype(config: dict[str, Any]) -> str | None:
    """The compute dtype a YAML file's bf16/fp16 flags choose (None when it sets neither)."""
    if config.get("bf16") in (True, "true", "auto"):
        return "bfloat16"
    if config.get("fp16") in (True, "true"):
        return "float16"
    return None


def _from_yaml(config: dict[str, Any]) -> dict[str, Any]:
    """An axolotl or LLaMA-Factory config by the policy's names."""
    if "quantization_bit" in config or "cutoff_len" in config:  # LLaMA-Factory
        flat = {{ours: config[theirs] for theirs, ours in _LLAMA_FACTORY.items() if theirs in config}}
        flat["load_in_4bit"] = config.get("quantization_bit") == 4
        flat["gradient_checkpointing"] = not config.get("disable_gradient_checkpointing", False)
        flat["bnb_4bit_compute_dtype"] = _dtype(config) or "float32"
        return flat
    flat = {{ours: config[theirs] for theirs, ours in _AXOLOTL.items() if theirs in config}}
    flat.update(config.get("bnb_config_kwargs") or {{}})
    flat.setdefault("bnb_4bit_compute_dtype", _dtype(config) or "float32")
    return flat


def _from_json(config: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments by the policy's names: flat, or nested as the json export writes them."""
    flat = {{**config.get("bnb_config", {{}}), **config.get("lora_config", {{}}), **config.get("training_args", {{}})}}
    flat.update({{k: v for k, v in config.items() if not isinstance(v, dict)}})
    if "max_length" in flat:  # TRL's SFTConfig name
        flat.setdefault("max_seq_length", flat["max_length"])
    if "bnb_4bit_compute_dtype" not in flat and _dtype(flat):
        flat["bnb_4bit_compute_dtype"] = _dtype(flat)
    flat.setdefault("load_in_4bit", "bnb_4bit_quant_type" in flat)
    collation = config.get("collation")
    if isinstance(collation, dict) and "packing" in collation:
        flat["packing"] = collation["packing"]
    return flat


def _production() -> dict[str, Any]:
    """The production config under check, by the policy's names."""
    path = os.environ.get({env!r})
    if not path:
        return POLICY.as_flat()
    if not Path(path).is_file():
        raise pytest.UsageError(
            f"{env}={{path}}: no such file; give the production config (an axolotl or LLaMA-Factory .yaml, or a "
            ".json of keyword arguments), or unset it to check the policy's own fields"
        )
    text = Path(path).read_text()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return _from_yaml(yaml.safe_load(text))
    return _from_json(json.loads(text))


PRODUCTION = _production()


def _value(key: str) -> Any:
    if key not in PRODUCTION:
        pytest.fail(f"the production config sets no {{key}}: set it to {{getattr(POLICY, key)!r}}, as measured")
    return PRODUCTION[key]


_MEASURED = (
    f"measured by sweeper in study {{POLICY.study!r}}, trial {{POLICY.trial}}: peak {{ENVELOPE.peak_memory_gib}} GiB "
    f"under a {{ENVELOPE.memory_limit_gib}} GiB cap on {{ENVELOPE.device}}"
)


def test_4bit_loading_is_on_as_measured():
    assert _value("load_in_4bit") is True, (
        f"load_in_4bit is off: the {{ENVELOPE.peak_memory_gib}} GiB peak was of 4-bit weights ({{_MEASURED}})"
    )


@pytest.mark.parametrize("key", ["bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype"])
def test_quantization_is_as_measured(key):
    got, want = _value(key), getattr(POLICY, key)
    assert str(got).removeprefix("torch.") == str(want), (
        f"{{key}} {{got}} != {{want}}: the memory and stability figures were measured at {{want}} ({{_MEASURED}})"
    )


def test_effective_batch_is_as_measured():
    batch, accumulation = _value("per_device_train_batch_size"), _value("gradient_accumulation_steps")
    assert batch * accumulation == POLICY.effective_batch(), (
        f"per_device_train_batch_size {{batch}} x gradient_accumulation_steps {{accumulation}} = "
        f"{{batch * accumulation}}, "
        f"not the policy's effective batch {{POLICY.effective_batch()}}: the stability figures hold at the batch they "
        f"were measured at ({{ENVELOPE.measured_effective_batch_size}} in the trial)"
    )


def test_the_batch_is_the_measured_one():
    batch = _value("per_device_train_batch_size")
    oom = ENVELOPE.oom_above
    above = oom is not None and oom[0] > POLICY.per_device_train_batch_size
    ran_out = f"; batch {{oom[0]}} x {{oom[1]}} ran out of memory ({{oom[2]}} GiB)" if above else ""
    assert batch <= POLICY.per_device_train_batch_size, (
        f"per_device_train_batch_size {{batch}} > {{POLICY.per_device_train_batch_size}}: the measured envelope is "
        f"batch "
        f"{{POLICY.per_device_train_batch_size}} x {{ENVELOPE.largest_fit_max_seq_length}} tokens at most{{ran_out}} "
        f"({{_MEASURED}})"
    )


def test_max_seq_length_is_within_what_fit_at_this_batch():
    length = _value("max_seq_length")
    oom = ENVELOPE.oom_above
    ran_out = f"; {{oom[0]}} x {{oom[1]}} ran out of memory ({{oom[2]}} GiB)" if oom else ""
    assert length <= ENVELOPE.largest_fit_max_seq_length, (
        f"max_seq_length {{length}} > {{ENVELOPE.largest_fit_max_seq_length}}: the longest measured to fit at batch "
        f"{{POLICY.per_device_train_batch_size}} (peak {{ENVELOPE.fit_peak_memory_gib}} GiB under the "
        f"{{ENVELOPE.memory_limit_gib}} GiB cap){{ran_out}}"
    )


def test_learning_rate_is_at_most_the_safe_rate():
    if ENVELOPE.safe_learning_rate is None:
        pytest.skip("the trial has no measured margin: no safe rate was measured")
    rate = float(_value("learning_rate"))
    assert rate <= ENVELOPE.safe_learning_rate, (
        f"learning_rate {{rate:g}} > {{ENVELOPE.safe_learning_rate:.3g}}, the safe rate for a {horizon}-step run: the "
        f"largest whose chance of diverging within {horizon} steps has its upper end at 5% (predicted_max_lr "
        f"{{ENVELOPE.predicted_max_lr:.3g}} is the edge, where {horizon}-step runs fail about half the time; a longer "
        f"run is riskier) ({{_MEASURED}})"
    )


@pytest.mark.parametrize("key", ["gradient_checkpointing", "optim", "packing"])
def test_memory_moving_settings_are_as_measured(key):
    if key not in PRODUCTION:
        pytest.skip(f"the production config does not set {{key}}")
    assert PRODUCTION[key] == getattr(POLICY, key), (
        f"{{key}} {{PRODUCTION[key]!r}} != {{getattr(POLICY, key)!r}}: the peak was measured with "
        f"{{getattr(POLICY, key)!r}} ({{_MEASURED}})"
    )


def test_the_model_loads_in_4bit():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the model is loaded in 4-bit only on a GPU")
    model_path = os.environ.get("SWEEPER_POLICY_MODEL")
    if not model_path:
        pytest.skip("set SWEEPER_POLICY_MODEL to the model's local folder to load it (no hub download in a test)")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=POLICY.bnb_config())
    assert model.is_loaded_in_4bit, f"{{model_path}} did not load in 4-bit with the policy's BitsAndBytesConfig"
'''


def render_policy(s: ExportSettings) -> tuple[str, str]:
    """The policy module's text and its test's: :data:`_MODULE` and :data:`_TEST` filled from ``s``.

    Raises:
        ValueError: ``s`` has no envelope (settings made without a study).
    """
    if s.envelope is None:
        raise ValueError("a policy export needs the study's envelope")
    p, t, q, lora, e = s.provenance, s.training, s.quantization, s.lora, s.envelope
    values = {
        "model": s.model,
        "load_in_4bit": True,
        "bnb_4bit_quant_type": q.bnb_4bit_quant_type,
        "bnb_4bit_use_double_quant": q.bnb_4bit_use_double_quant,
        "bnb_4bit_compute_dtype": q.bnb_4bit_compute_dtype,
        "r": lora.r,
        "lora_alpha": lora.lora_alpha,
        "lora_dropout": lora.lora_dropout,
        "target_modules": tuple(lora.target_modules),
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "learning_rate": t.learning_rate,
        "optim": t.optim,
        "gradient_checkpointing": t.gradient_checkpointing,
        "max_grad_norm": t.max_grad_norm,
        "max_seq_length": s.max_seq_length,
        "packing": s.collation.packing,
        "attn_implementation": s.collation.attn_implementation,
        "study": p.study,
        "trial": p.trial,
        "sweeper_version": dict(p.versions).get("sweeper"),
    }
    envelope = {
        "peak_memory_gib": p.peak_memory_gib,
        "memory_limit_gib": p.memory_limit_gib,
        "device": p.device,
        "largest_fit_max_seq_length": e.largest_fit_max_seq_length,
        "fit_peak_memory_gib": e.fit_peak_memory_gib,
        "oom_above": e.oom_above,
        "predicted_max_lr": p.stability.predicted_max_lr,
        "safe_learning_rate": e.safe_learning_rate,
        "measured_effective_batch_size": p.measured_effective_batch_size,
    }
    lines = [f"    {k}={pprint.pformat(v)}," for k, v in values.items()]
    lines.append("    envelope=Envelope(")
    lines += [f"        {k}={pprint.pformat(v)}," for k, v in envelope.items()]
    lines.append("    ),")
    module = _MODULE.format(
        study=p.study,
        trial=p.trial,
        version=dict(p.versions).get("sweeper"),
        exported=p.exported,
        memory_kind=p.memory_kind,
        device=p.device,
        fields="\n".join(lines),
    )
    horizon = p.stability.horizon_steps or DEFAULT_HORIZON_STEPS
    test = _TEST.format(study=p.study, trial=p.trial, env=PRODUCTION_ENV, horizon=horizon)
    return module, test


def _files(s: ExportSettings, data: ExportData | None) -> dict[str, str]:
    """The policy module (``.py``) and its test beside it (``_test.py``)."""
    module, test = render_policy(s)
    return {".py": module, "_test.py": test}


POLICY = ExportFormat(
    name="policy",
    suffix=".py",
    help="the configuration and its measured envelope as a frozen Python policy, and a pytest guard beside it",
    render=_files,
    offered_instead=False,
)
