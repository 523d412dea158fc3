"""The one reader of production configs (issue 67), on the tools' published example configs
(``tests/fixtures/production``, verbatim, sources in its SOURCES.md) and on what users write by hand: every key of a
file accounted for, each tool's defaults as the tool itself has them (TRL and transformers, installed here), bad
input as one line; and ``sweep init --from`` on each input kind: a space that loads, every key in its table."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from sweeper.export import space_from
from sweeper.export.production import (
    INFERRED_PRECISION,
    SETTINGS,
    TOOL_KEYS,
    ProductionConfigError,
    as_file_says,
    read_production,
    written,
)
from sweeper.space import load_space
from sweeper.testing import run_cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "production"
PUBLISHED = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".json"))


def _top_keys(path: Path) -> set[str]:
    config = json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    return set(config)


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: p.name)
def test_every_key_of_a_published_config_is_accounted_for(path):
    reading = read_production(path)
    said = {line.key.split(".")[0] for line in reading.lines}
    assert _top_keys(path) <= said, _top_keys(path) - said
    for line in reading.lines:
        assert line.status in ("carried", "translated", "default", "not carried", "unread"), line
        assert line.status not in ("not carried", "unread") or line.note, line  # a reason with every one


def test_the_published_configs_read_as_their_tools_run_them():
    llama = read_production(FIXTURES / "axolotl_llama3-8b_qlora.yaml").settings
    assert (llama["model"], llama["r"], llama["lora_alpha"], llama["target_modules"]) == (
        "NousResearch/Meta-Llama-3-8B",
        32,
        16,
        "all-linear",
    )
    assert (llama["per_device_train_batch_size"], llama["gradient_accumulation_steps"], llama["max_seq_length"]) == (
        2,
        4,
        4096,
    )
    # axolotl: nf4 with double quant by default, compute dtype from bf16: auto, pad_to_sequence_len on with packing
    assert (llama["bnb_4bit_quant_type"], llama["bnb_4bit_use_double_quant"], llama["bnb_4bit_compute_dtype"]) == (
        "nf4",
        True,
        "bfloat16",
    )
    assert llama["packing"] is True and llama["pad_to_max_length"] is True and llama["optim"] == "paged_adamw_32bit"
    eight = read_production(FIXTURES / "axolotl_llama3-8b_lora-8bit.yaml")
    assert eight.settings["load_in_8bit"] is True and "lora_modules_to_save" in eight.not_measured
    qwen = read_production(FIXTURES / "axolotl_qwen3-32b_qlora.yaml")
    assert qwen.settings["gradient_checkpointing"] is True and "gradient_checkpointing" in qwen.not_measured  # offload
    assert "plugins" in qwen.not_measured
    gemma = read_production(FIXTURES / "axolotl_gemma4-31b_qlora.yaml").settings
    assert gemma["target_modules"].startswith("re:")  # a pattern, never split into names
    # LLaMA-Factory: quantization_bit 4, lora_alpha defaults to 2 x lora_rank, lora_target all
    otfq = read_production(FIXTURES / "llamafactory_qwen3_lora_sft_otfq.yaml")
    assert otfq.tool == "llama-factory" and otfq.settings["load_in_4bit"] is True
    assert otfq.settings["lora_alpha"] == 16 and otfq.defaulted("lora_alpha")
    assert otfq.settings["target_modules"] == "all-linear" and otfq.settings["mixed_precision"] == "bf16"
    npu = read_production(FIXTURES / "llamafactory_qwen3_lora_sft_bnb_npu.yaml").settings
    assert npu["bnb_4bit_use_double_quant"] is False
    # TRL 1.x: no torch_dtype or max_seq_length field (its parser drops them): float32 compute, rows cut at 1024
    zephyr = read_production(FIXTURES / "trl_zephyr-7b-beta_sft_config_qlora.yaml")
    assert zephyr.tool == "trl" and zephyr.settings["bnb_4bit_compute_dtype"] == "float32"
    assert {"torch_dtype", "max_seq_length"} <= set(zephyr.noted) and zephyr.settings["max_seq_length"] == 1024
    adapter = read_production(FIXTURES / "peft_adapter_config.json").settings
    assert (adapter["model"], adapter["r"], adapter["lora_alpha"]) == ("google/gemma-2-9b-it", 16, 32)


def test_the_trl_and_transformers_defaults_are_the_tools_own():
    trl = pytest.importorskip("trl")
    from transformers import TrainingArguments

    def defaults(cls):
        return {f.name: f.default for f in dataclasses.fields(cls)}

    model, sft, args = defaults(trl.ModelConfig), defaults(trl.SFTConfig), defaults(TrainingArguments)
    ours = TOOL_KEYS["trl"].defaults
    assert (ours["r"], ours["lora_alpha"], ours["lora_dropout"]) == (
        model["lora_r"],
        model["lora_alpha"],
        model["lora_dropout"],
    )
    assert (ours["bnb_4bit_quant_type"], ours["bnb_4bit_use_double_quant"], ours["bnb_4bit_compute_dtype"]) == (
        model["bnb_4bit_quant_type"],
        model["use_bnb_nested_quant"],
        model["dtype"],
    )
    for ours_key, theirs in (("max_seq_length", "max_length"), ("packing", "packing"),
                             ("gradient_checkpointing", "gradient_checkpointing"), ("learning_rate", "learning_rate"),
                             ("per_device_train_batch_size", "per_device_train_batch_size"), ("optim", "optim"),
                             ("max_grad_norm", "max_grad_norm"), ("seed", "seed")):  # fmt: skip
        assert ours[ours_key] == sft[theirs], ours_key
    assert sft["bf16"] is None  # TRL: None is `not fp16`, bf16 on
    plain = TOOL_KEYS["json"].defaults
    for key in ("per_device_train_batch_size", "optim", "max_grad_norm", "warmup_steps", "weight_decay"):
        assert plain[key] == args[key], key
    assert bool(args["gradient_checkpointing"]) is plain["gradient_checkpointing"]


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("train.py", "x = 1\n", "a Python script is not read"),
        ("train.toml", "[a]\n", "a .toml file is not read"),
        ("empty.yaml", "", "not a config of keys"),
        ("list.yaml", "- a\n- b\n", "not a config of keys"),
        ("broken.json", "{", "does not parse as JSON"),
        ("bad.yaml", "micro_batch_size: two\nbase_model: m\n", "micro_batch_size: could not convert"),
        ("space.yaml", "study: {name: x}\nsearch: {r: [4]}\n", "this is a sweeper space"),
    ],
)
def test_bad_input_is_one_line_naming_the_file(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ProductionConfigError) as raised:
        read_production(path)
    message = str(raised.value)
    assert "\n" not in message and str(path) in message and said in message, message


def test_string_values_of_an_argv_dump_read_as_their_types(tmp_path):
    path = tmp_path / "args.json"
    path.write_text(json.dumps({
        "model_name_or_path": "m", "use_4bit_quantization": "True", "use_nested_quant": "false", "lora_r": "16",
        "lora_alpha": "32", "per_device_train_batch_size": "2", "gradient_accumulation_steps": "8",
        "learning_rate": "2e-4", "max_seq_len": "2048", "max_length": None, "bf16": "true",
    }))  # fmt: skip
    s = read_production(path).settings
    assert (s["load_in_4bit"], s["bnb_4bit_use_double_quant"], s["r"], s["lora_alpha"]) == (True, False, 16, 32)
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"], s["max_seq_length"]) == (2, 8, 2048)
    assert s["learning_rate"] == 2e-4 and s["mixed_precision"] == "bf16"


def test_llama_factory_without_bf16_or_fp16_is_left_to_the_gpu(tmp_path):
    text = (FIXTURES / "llamafactory_qwen3_lora_sft_otfq.yaml").read_text().replace("bf16: true", "")
    (tmp_path / "lf.yaml").write_text(text)
    s = read_production(tmp_path / "lf.yaml").settings
    assert s["mixed_precision"] == INFERRED_PRECISION and s["bnb_4bit_compute_dtype"] == INFERRED_PRECISION


def test_a_setting_is_written_under_each_tools_own_keys():
    assert written("llama-factory", "gradient_checkpointing", True) == {"disable_gradient_checkpointing": False}
    assert written("llama-factory", "target_modules", ("q_proj", "v_proj")) == {"lora_target": "q_proj,v_proj"}
    assert written("axolotl", "per_device_train_batch_size", 2) == {"micro_batch_size": 2}
    assert written("axolotl", "bnb_4bit_compute_dtype", "bfloat16") == {
        "bnb_config_kwargs.bnb_4bit_compute_dtype": "bfloat16"
    }
    assert written("trl", "bnb_4bit_compute_dtype", "bfloat16") == {"dtype": "bfloat16"}
    assert as_file_says("axolotl", "mixed_precision", "bf16") == "bf16: true, fp16: false"
    with pytest.raises(ValueError, match="float32"):
        written("llama-factory", "mixed_precision", None)


@pytest.mark.parametrize(
    "name",
    [
        "axolotl_llama3-8b_qlora.yaml",
        "llamafactory_qwen3_lora_sft_otfq.yaml",
        "trl_zephyr-7b-beta_sft_config_qlora.yaml",
        "peft_adapter_config.json",
        "args.json",
    ],
)
def test_init_from_each_input_kind_writes_a_space_that_loads_with_every_key_in_its_table(workdir, name):
    if name == "args.json":  # a JSON of SFTConfig/LoraConfig keyword arguments, as a script dumps them
        source = workdir / name
        source.write_text(json.dumps({
            "model_name_or_path": "Qwen/Qwen2.5-7B", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
            "r": 16, "lora_alpha": 32, "target_modules": "all-linear", "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 4, "learning_rate": 1e-4, "max_length": 1024, "bf16": True,
            "optim": "paged_adamw_8bit", "gradient_checkpointing": True, "output_dir": "out",
        }))  # fmt: skip
    else:
        source = FIXTURES / name
    out = run_cli("init", "--from", str(source), "-o", "space.yaml")
    assert out.returncode == 0, out.stderr
    space = load_space(workdir / "space.yaml")
    reading = read_production(source)
    for key in _top_keys(source):
        assert f"  {key} " in out.stdout, key  # every key of the file, in the table
    assert space.model.name_or_path == reading.settings["model"]
    base = space.base
    if reading.settings.get("learning_rate"):
        assert base.learning_rate == pytest.approx(reading.settings["learning_rate"])
    batch = reading.settings["per_device_train_batch_size"] * reading.settings["gradient_accumulation_steps"]
    assert base.target_effective_batch_size == batch  # the user's effective batch, never the default 16
    first = {key: dim.choices[0] for key, dim in space.search.items()}
    assert first["r"] == reading.settings["r"]
    assert first["lora_alpha_ratio"] == pytest.approx(reading.settings["lora_alpha"] / reading.settings["r"])
    if reading.settings.get("target_modules") == "all-linear":
        assert len(base.target_modules) == 7  # spelled out
    again = run_cli("init", "--from", str(source), "-o", "space.yaml")
    assert again.returncode != 0 and "exists" in again.stderr  # never replaced without --force


def test_init_says_which_way_an_unmeasured_key_moves_the_peak(workdir):
    out = run_cli("init", "--from", str(FIXTURES / "axolotl_llama3-8b_lora-8bit.yaml"), "-o", "s.yaml")
    assert out.returncode == 0, out.stderr
    assert "lora_modules_to_save: not carried" in out.stdout and "HIGHER than measured" in out.stdout
    made = space_from(read_production(FIXTURES / "axolotl_gemma4-31b_qlora.yaml"))
    assert any("activation_offloading" in w and "LOWER" in w for w in made.warnings)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [  # the fifth kind, axolotl's YAML, runs a whole sweep from its space in tests/export/test_onto.py
        "llamafactory_qwen3_lora_sft_otfq.yaml",
        "trl_zephyr-7b-beta_sft_config_qlora.yaml",
        "peft_adapter_config.json",
        "trial-json.json",
    ],
)
def test_a_space_from_each_input_kind_runs_a_trial(workdir, tiny_model, name):
    """``sweep trial`` runs the space ``sweep init --from`` writes, with ``--set`` of what is not local here: the
    model and the data (the tiny model and the built-in rows), a card, and a CPU's compute dtype and a short run."""
    source = FIXTURES / name if name != "trial-json.json" else workdir / name
    if name == "trial-json.json":  # the json export's nesting, as sweep writes it
        source.write_text(json.dumps({
            "model": "m", "max_seq_length": 64, "collation": {"packing": False, "attn_implementation": "sdpa"},
            "bnb_config": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
                           "bnb_4bit_compute_dtype": "bfloat16"},
            "lora_config": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
            "training_args": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                              "learning_rate": 2e-4, "optim": "adamw_torch", "gradient_checkpointing": True},
        }))  # fmt: skip
    out = run_cli("init", "--from", str(source), "-o", "space.yaml")
    assert out.returncode == 0, out.stderr
    sets = {
        "model.name_or_path": str(tiny_model), "model.attn_implementation": "sdpa",
        "dataset.path": "builtin:pydoc-topics", "dataset.format": "auto", "dataset.max_samples": "16",
        "training.memory_limit_gib": "4", "training.max_steps": "2", "training.packing": "false",
        "max_seq_length": "128", "per_device_train_batch_size": "1", "bnb_4bit_compute_dtype": "float32",
    }  # fmt: skip
    out = run_cli("trial", "space.yaml", *[arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")])
    assert out.returncode == 0 and re.search(r"(?m)^status +complete", out.stdout), (out.stdout[-2000:], out.stderr)


#: Keys of the trial schema that move memory or the stability measured and are no key of a production config, each
#: with where the policy keeps it instead.
NOT_A_PRODUCTION_KEY = {
    "memory_limit_gib": "the card the trials ran under: the policy's envelope",
    "expandable_segments": "an allocator option of the environment: Policy.environment, the guard's warning",
    "dataset": "the rows: the exports write the trial's rows beside the file",
    "lora_alpha_ratio": "lora_alpha / r: checked as lora_alpha and r",
    "seed": "a seed: its noise is in every figure's interval",
    "max_steps": "the short trial's length: the horizon of the chance of diverging",
    "warmup_steps": "a longer warmup only lowers the early steps' rate",
    "weight_decay": "AdamW's decay: no part of the measured margin's model",
}


def test_every_memory_or_stability_key_of_the_schema_is_guarded():
    from sweeper.export import policy_guard
    from sweeper.space import RUN_POLICY_KEYS, TrialConfig, memory_roles

    keys = set(memory_roles(TrialConfig)) - set(RUN_POLICY_KEYS)
    unguarded = keys - set(policy_guard.CHECKED) - set(NOT_A_PRODUCTION_KEY)
    assert not unguarded, f"keys of TrialConfig the policy guard does not check: {sorted(unguarded)}"
    assert set(policy_guard.CHECKED) <= set(SETTINGS)  # each read from a production file


def _read_text(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return read_production(path)


def test_the_reader_reads_what_the_tools_run_not_what_the_file_seems_to_say(tmp_path):
    # TRL 1.x has no max_seq_length (its parser drops it): the rows are cut at max_length's default
    trl = _read_text(tmp_path, "trl.yaml", "model_name_or_path: m\nuse_peft: true\nmax_seq_length: 64\n")
    assert trl.settings["max_seq_length"] == 1024 and "max_seq_length" in trl.noted
    # LLaMA-Factory with both flags off: the GPU and the checkpoint choose the precision, not float32
    lf = _read_text(tmp_path, "lf.yaml", "model_name_or_path: m\nstage: sft\nbf16: false\nfp16: false\n")
    assert lf.settings["mixed_precision"] == INFERRED_PRECISION
    # flags as pydantic and TRL's parser read them
    for text in ("yes", "on", "'y'", "1"):
        ax = _read_text(tmp_path, "ax.yaml", f"base_model: m\nbf16: {text}\n")
        assert ax.settings["mixed_precision"] == "bf16", text
    # transformers 5's activation_checkpointing overrides gradient_checkpointing
    off = _read_text(tmp_path, "t2.yaml", "model_name_or_path: m\ngradient_checkpointing: true\n"
                     "activation_checkpointing: false\n")  # fmt: skip
    assert off.settings["gradient_checkpointing"] is False and off.keys["gradient_checkpointing"] == (
        "activation_checkpointing"
    )
    # LLaMA-Factory's stage and quantization method: other than sft and bnb is not what was measured
    dpo = _read_text(tmp_path, "lf2.yaml", "model_name_or_path: m\nstage: dpo\nquantization_method: hqq\n")
    assert {"stage", "quantization_method"} <= set(dpo.not_measured)
    pt = _read_text(tmp_path, "lf3.yaml", "model_name_or_path: m\nstage: pt\n")
    assert pt.settings["packing"] is True
    # a top-level keyword beside the json export's nest is said, never dropped; string booleans in JSON are noted
    js = tmp_path / "x.json"
    js.write_text(json.dumps({"learning_rate": 0.5, "training_args": {"learning_rate": 0.002}, "packing": "false"}))
    reading = read_production(js)
    assert reading.settings["learning_rate"] == 0.002 and "packing" in reading.noted
    assert any(line.key == "learning_rate" and line.status == "not carried" for line in reading.lines)
    # a TRL --config with a datasets mixture is TRL's, not axolotl's
    assert _read_text(tmp_path, "t3.yaml", "model_name_or_path: m\ndatasets:\n  - path: d\n").tool == "trl"
    # keys that move memory or the adapter's step are never 'moves neither'
    ax = _read_text(tmp_path, "ax2.yaml", "base_model: m\npeft_use_rslora: true\nloraplus_lr_ratio: 16\n"
                    "lora_qkv_kernel: true\nbnb_config_kwargs:\n  llm_int8_skip_modules: [mlp]\n")  # fmt: skip
    assert {
        "peft_use_rslora",
        "loraplus_lr_ratio",
        "lora_qkv_kernel",
        "bnb_config_kwargs.llm_int8_skip_modules",
    } <= set(ax.not_measured)


def test_init_refuses_to_write_over_its_source_and_names_the_files_key_for_a_bad_value(workdir):
    source = workdir / "qlora.yml"
    source.write_text("base_model: m\nlora_r: 0\n")
    out = run_cli("init", "--from", str(source), "-o", str(source), "--force")
    assert out.returncode == 2 and "names the config read" in out.stderr and source.read_text().startswith("base")
    out = run_cli("init", "--from", str(source), "-o", "space.yaml")
    assert out.returncode == 2 and "lora_r: 0 is below 1" in out.stderr and "Traceback" not in out.stderr
    assert not (workdir / "space.yaml").exists()
