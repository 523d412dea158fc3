"""The ``axolotl`` and ``llama-factory`` exports read by the real tools' own config parsers, each tool in a venv of
its own (``tests/fixtures/stacks/{llama-factory,axolotl}.txt``, built by ``stack_venv`` of
``test_export_stacks.py``): LLaMA-Factory 0.9.5's ``get_train_args`` as ``llamafactory-cli train`` calls it, and
axolotl 0.21.0's ``validate_config`` and ``normalize_config`` as ``axolotl train`` calls them, then the
``BitsAndBytesConfig`` each tool's model loader builds (``tests/export/tool_check.py``). Every key the file writes must
come out of the tool with the file's value, and the file's values are the trial's; a fast test checks that axolotl is
given no fractional lora_alpha (its schema rejects one). The model is the tiny local Llama; no hub is reached.
Building both venvs takes about 3.5 minutes here (no pip cache); they are reused under
``$SWEEPER_STACK_VENVS`` when that is set."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from sweeper.errors import StudyError
from sweeper.export import AXOLOTL_LORA_KERNELS, pick_trial, write_export
from sweeper.space import parse_space
from sweeper.study import open_study
from sweeper.testing import REPO, STACKS, add_configured_trials, add_trial, make_study, run_in_venv, stack_venv

#: Trial 6's settings, none at the tools' defaults: float16, fp4 without double quantization, r 16 with lora_alpha
#: 8 (LLaMA-Factory's default would be 2 * r), four target modules, batch 4 of 128 tokens, paged 8-bit AdamW, no
#: gradient checkpointing. Trial 7 is trial 6 in float32; trial 8 is trial 1 with lora_alpha_ratio 0.3 (lora_alpha
#: 2.4).
OTHER = {
    "bnb_4bit_compute_dtype": "float16",
    "bnb_4bit_quant_type": "fp4",
    "bnb_4bit_use_double_quant": False,
    "r": 16,
    "lora_alpha_ratio": 0.5,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "per_device_train_batch_size": 4,
    "max_seq_length": 128,
    "learning_rate": 1e-4,
    "optim": "paged_adamw_8bit",
    "gradient_checkpointing": False,
    "max_grad_norm": 0.3,
    "warmup_steps": 2,
    "weight_decay": 0.01,
    "lora_dropout": 0.1,
    "seed": 7,
}

#: The user's part of a real run, which an export leaves to them (its notes say so): a dataset. ``use_cpu``: the
#: side venvs' torch is a CPU build, and transformers refuses bf16/fp16 without a GPU unless told to use the CPU.
LLAMA_FACTORY_ADDS = {"dataset": "rows", "use_cpu": True}
AXOLOTL_ADDS = {"datasets": [{"path": "rows.jsonl", "type": "chat_template"}]}

#: The tool's libraries are offline, and axolotl's telemetry is off.
OFFLINE = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1"}


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_model):
    """make_study's trials 0-5 on the tiny model, and trials 6-8 (see :data:`OTHER`). Trial 8 dominates trial 1:
    the front is trials 0 and 8."""
    folder = tmp_path_factory.mktemp("tools-study")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the study's folder (studies/rep/) goes there, not into the checkout
        return _make(folder, tiny_model)


def _make(folder, tiny_model):
    study = make_study(folder, model=str(tiny_model))
    float32 = {**OTHER, "bnb_4bit_compute_dtype": "float32"}
    add_configured_trials(
        study, tiny_model, [(OTHER, 1.8, 0.3), (float32, 1.9, 0.35), ({"lora_alpha_ratio": 0.3}, 1.4, 0.1)]
    )
    return study


@pytest.fixture(scope="module")
def llama_factory(tmp_path_factory):
    return stack_venv("llama-factory", tmp_path_factory)


@pytest.fixture(scope="module")
def axolotl(tmp_path_factory):
    return stack_venv("axolotl", tmp_path_factory)


def _pins(name: str) -> dict[str, str]:
    text = (STACKS / f"{name}.txt").read_text()
    return dict(line.split("==") for line in text.split() if "==" in line)


def _check(python, tool: str, adds: dict, files: list, cwd) -> list[dict]:
    """``tests/export/tool_check.py`` in the tool's venv: one result per file, each checked to be no rejection."""
    out = run_in_venv(
        python,
        str(REPO / "tests" / "export" / "tool_check.py"),
        tool,
        json.dumps(adds),
        *map(str, files),
        cwd=cwd,
        **OFFLINE,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for path, result in zip(files, results):
        assert "error" not in result, f"{tool} rejects {path.name}: {result.get('traceback', result)}"
    return results


def test_axolotl_is_given_only_whole_lora_alphas(study, tmp_path, monkeypatch):
    """axolotl 0.21's lora_alpha is an int (its schema rejects 2.4: see the slow test below), so a trial whose
    lora_alpha_ratio * r is fractional is not exported as axolotl: the pick is made among the other trials, and
    --trial names the nearest one it can express. LLaMA-Factory passes a float lora_alpha on to peft."""
    assert pick_trial(study, pick="knee").number == 8
    assert pick_trial(study, pick="knee", fmt="axolotl").number == 1
    assert pick_trial(study, pick="most-stable", fmt="axolotl").number == 1
    with pytest.raises(
        StudyError,
        match=r"trial 8: its lora_alpha 2\.4 .*not a whole number.*nearest trial it can express is 1 .*"
        r"--format hf, trl or llama-factory",
    ):
        pick_trial(study, number=8, fmt="axolotl")
    with pytest.raises(StudyError, match="lora_alpha 2.4, not a whole number, which axolotl cannot express"):
        write_export(study, pick_trial(study, number=8), "axolotl", tmp_path / "ax")
    [lf] = write_export(study, pick_trial(study, number=8, fmt="llama-factory"), "llama-factory", tmp_path / "lf")
    assert yaml.safe_load(lf.read_text())["lora_alpha"] == 2.4
    # The float32 trial: axolotl expresses it, LLaMA-Factory names the formats that do.
    assert pick_trial(study, number=7, fmt="axolotl").number == 7
    with pytest.raises(StudyError, match=r"trial 7: it computed in float32.*--format hf, trl or axolotl$"):
        pick_trial(study, number=7, fmt="llama-factory")
    # A study of fractional lora_alphas only: the pick says what axolotl lacks and which formats express them.
    monkeypatch.chdir(tmp_path)
    lone = open_study(
        parse_space({"study": {"name": "lone"}}, "space.yaml"), f"sqlite:///{tmp_path}/lone.db", "lone", 8
    )
    attrs = {k: study.trials[8].user_attrs[k] for k in ("config", "lora_alpha")}
    add_trial(lone, r=8, batch=2, seq=64, status="complete", peak=1.0, instability=0.1, extra=attrs)
    with pytest.raises(StudyError, match=r"fractional lora_alpha.*--format hf, trl or llama-factory, or run trials"):
        pick_trial(lone, pick="knee", fmt="axolotl")


@pytest.mark.network
def test_llama_factory_parses_the_export_into_the_trials_settings(llama_factory, study, tmp_path, tiny_model):
    """LLaMA-Factory 0.9.5 accepts the exports of trials 1 (bfloat16, nf4), 6 (float16, fp4, no double quant, every
    setting off its defaults) and 8 (a fractional lora_alpha), and every key comes out with the file's value, which
    is the trial's; it computes in the dtype the file's comment states, and quantizes with the trial's settings."""
    trials = [pick_trial(study, number=n, fmt="llama-factory") for n in (1, 6, 8)]
    files = [write_export(study, t, "llama-factory", tmp_path / f"lf{t.number}")[0] for t in trials]
    results = _check(llama_factory, "llama-factory", LLAMA_FACTORY_ADDS, files, tmp_path)
    pins = _pins("llama-factory")
    for trial, path, got in zip(trials, files, results):
        text = path.read_text()
        exported = yaml.safe_load(text)
        assert "add your dataset" in text  # the export leaves the dataset to the user, who adds it as here
        assert set(exported) <= set(got), set(exported) - set(got)
        for key, value in exported.items():
            want = value.split(",") if key == "lora_target" else value
            assert got[key] == want, (trial.number, key, got[key], want)
        c = trial.config
        assert got["model_name_or_path"] == str(tiny_model) and got["quantization_method"] == "bnb"
        assert got["lora_rank"] == c.r and got["lora_alpha"] == trial.lora_alpha
        assert got["lora_target"] == list(c.target_modules) and got["lora_dropout"] == c.lora_dropout
        assert got["per_device_train_batch_size"] == c.per_device_train_batch_size
        assert got["gradient_accumulation_steps"] == math.ceil(16 / c.per_device_train_batch_size)
        assert got["cutoff_len"] == c.max_seq_length and got["learning_rate"] == c.learning_rate
        assert got["optim"] == c.optim and got["disable_gradient_checkpointing"] is not c.gradient_checkpointing
        assert got["packing"] is False and got["train_on_prompt"] is False  # one row a sample, replies supervised
        [stated] = re.findall(r"LLaMA-Factory computes the 4-bit layers in (\w+)", text)
        assert got["compute_dtype"] == stated == c.bnb_4bit_compute_dtype
        assert got["bnb"] == {
            "load_in_4bit": True,
            "bnb_4bit_compute_dtype": c.bnb_4bit_compute_dtype,
            "bnb_4bit_quant_type": c.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": c.bnb_4bit_use_double_quant,
            "bnb_4bit_quant_storage": c.bnb_4bit_compute_dtype,  # LLaMA-Factory's choice (for FSDP), same bytes
        }
        assert got["versions"]["llamafactory"] == pins["llamafactory"]
        assert got["versions"]["transformers"] == pins["transformers"]
    assert [r["bnb"]["bnb_4bit_quant_type"] for r in results] == ["nf4", "fp4", "nf4"]


@pytest.mark.network
def test_axolotl_validates_the_export_and_keeps_the_trials_settings(axolotl, study, tmp_path, tiny_model):
    """axolotl 0.21.0 accepts the exports of trials 1 (bfloat16), 6 (float16, fp4, no double quant) and 7 (float32)
    and keeps every key: through validate_config on an Ampere GPU's capabilities (where tf32: auto would turn TF32
    on, and does when the key is left out) and without, and through normalize_config; its BitsAndBytesConfig takes
    the trial's compute dtype, quant type and double quantization from bnb_config_kwargs."""
    trials = [pick_trial(study, number=n, fmt="axolotl") for n in (1, 6, 7)]
    files = [write_export(study, t, "axolotl", tmp_path / f"ax{t.number}")[0] for t in trials]
    results = _check(axolotl, "axolotl", AXOLOTL_ADDS, files, tmp_path)
    pins = _pins("axolotl")
    for trial, path, got in zip(trials, files, results):
        exported = yaml.safe_load(path.read_text())
        for stage in ("validated", "validated_without_capabilities", "normalized"):
            assert set(exported) <= set(got[stage]), (stage, set(exported) - set(got[stage]))
            for key, value in exported.items():
                assert got[stage][key] == value, (trial.number, stage, key, got[stage][key], value)
        c, v = trial.config, got["normalized"]
        assert v["tf32"] is False and v["excess_length_strategy"] == "truncate" and v["sample_packing"] is False
        assert v["load_in_4bit"] is True and v["adapter"] == "qlora" and v["base_model"] == str(tiny_model)
        assert v["lora_r"] == c.r and v["lora_alpha"] == trial.lora_alpha and v["lora_dropout"] == c.lora_dropout
        assert v["lora_target_modules"] == list(c.target_modules) and v["sequence_len"] == c.max_seq_length
        assert v["micro_batch_size"] == c.per_device_train_batch_size
        assert v["gradient_accumulation_steps"] == math.ceil(16 / c.per_device_train_batch_size)
        assert v["batch_size"] == 16 and v["optimizer"] == c.optim and v["model_config_type"] == "llama"
        assert v["torch_dtype"] == c.bnb_4bit_compute_dtype  # from bf16/fp16: float32 with neither
        assert got["bnb"] == {
            "load_in_4bit": True,
            "bnb_4bit_compute_dtype": c.bnb_4bit_compute_dtype,
            "bnb_4bit_quant_type": c.bnb_4bit_quant_type,
            "bnb_4bit_use_double_quant": c.bnb_4bit_use_double_quant,
            "bnb_4bit_quant_storage": "bfloat16",  # axolotl's choice, same bytes
        }
        # Why the file writes them: left out, axolotl turns TF32 on for this GPU, and drops rows over sequence_len
        # (None: its data code's default, drop); and why a fractional lora_alpha is not exported to it.
        assert got["tf32_unset"] is True and got["excess_length_strategy_unset"] is None
        assert got["lora_kernels_unset"] == dict.fromkeys(AXOLOTL_LORA_KERNELS, True)  # axolotl's QLoRA default
        assert all(v[k] is False for k in AXOLOTL_LORA_KERNELS)  # the file's: the trial ran peft's own layers
        assert "lora_alpha" in got["fractional_alpha_error"] and "valid integer" in got["fractional_alpha_error"]
        assert got["versions"]["axolotl"] == pins["axolotl"]
        assert got["versions"]["transformers"] == pins["transformers"]
    assert [r["bnb"]["bnb_4bit_compute_dtype"] for r in results] == ["bfloat16", "float16", "float32"]
