"""``sweep export``: every format carries every value of the trial; the ``hf`` file's objects train two real steps on
the tiny model; the ``trl`` file builds a real ``SFTConfig``; a trial that did not complete is refused in one line."""

import dataclasses
import json
import runpy

import pytest
import yaml
from conftest import sweep
from test_report import make_study

from sweeper.report._export import pick_trial, write_export


@pytest.fixture
def study_and_knee(tmp_path, tiny_model):
    study = make_study(tmp_path, model=str(tiny_model))
    return study, pick_trial(study, pick="knee")  # trial 1: r=8, batch 2, seq 64, bfloat16, nf4, double quant


def test_yaml_and_json_exports_carry_every_value(study_and_knee, tmp_path):
    study, trial = study_and_knee
    assert trial.number == 1
    [ax] = write_export(study, trial, "axolotl", tmp_path / "out" / "ax")
    text = ax.read_text()
    assert text.startswith("# Exported by sweeper from study 'rep', trial 1") and "peak memory 1.5 GiB" in text
    a = yaml.safe_load(text)
    assert a["adapter"] == "qlora" and a["load_in_4bit"] is True and a["lora_r"] == 8 and a["lora_alpha"] == 16
    assert a["lora_target_modules"] == ["q_proj", "v_proj"] and a["sequence_len"] == 64
    assert a["micro_batch_size"] == 2 and a["gradient_accumulation_steps"] == 8  # 16 / 2: the effective batch kept
    assert a["bf16"] is True and a["fp16"] is False and a["lora_dropout"] == 0.05
    assert a["bnb_config_kwargs"] == {
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    assert "ties bnb_4bit_compute_dtype" in text  # what axolotl cannot express the same way is said
    [lf] = write_export(study, trial, "llama-factory", tmp_path / "lf.yaml")
    f = yaml.safe_load(lf.read_text())
    assert f["finetuning_type"] == "lora" and f["quantization_bit"] == 4 and f["quantization_type"] == "nf4"
    assert f["double_quantization"] is True and f["lora_rank"] == 8 and f["lora_alpha"] == 16
    assert f["lora_target"] == "q_proj,v_proj" and f["cutoff_len"] == 64
    assert f["per_device_train_batch_size"] == 2 and f["gradient_accumulation_steps"] == 8 and f["bf16"] is True
    assert "bnb_4bit_compute_dtype=bfloat16 in the trial; LLaMA-Factory has no key for it" in lf.read_text()
    [js] = write_export(study, trial, "json", tmp_path / "x.json")
    j = json.loads(js.read_text())
    assert j["provenance"]["trial"] == 1 and j["provenance"]["memory_kind"] == "cpu_peak_rss"
    assert j["bnb_config"]["bnb_4bit_compute_dtype"] == "bfloat16" and j["effective_batch_size"] == 16


@pytest.mark.slow
def test_hf_export_trains_two_steps(study_and_knee, tmp_path, tiny_model):
    import torch
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer

    study, trial = study_and_knee
    py, js = write_export(study, trial, "hf", tmp_path / "knee")
    assert py.suffix == ".py" and js.suffix == ".json"
    ns = runpy.run_path(str(py))
    bnb, lora, args = ns["bnb_config"], ns["lora_config"], ns["training_args"]
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16 and bnb.bnb_4bit_quant_type == "nf4"
    assert lora.r == 8 and lora.lora_alpha == 16 and args.gradient_accumulation_steps == 8 and args.bf16
    tokenizer = AutoTokenizer.from_pretrained(ns["MODEL_NAME"])
    ids = tokenizer("The for statement is used to iterate over the elements of a sequence. " * 4)["input_ids"]
    rows = [{"input_ids": ids[:32], "attention_mask": [1] * 32, "labels": ids[:32]} for _ in range(32)]
    model = AutoModelForCausalLM.from_pretrained(
        ns["MODEL_NAME"], quantization_config=bnb, dtype=bnb.bnb_4bit_compute_dtype
    )
    model = get_peft_model(prepare_model_for_kbit_training(model), lora)
    short = dataclasses.replace(
        args,
        output_dir=str(tmp_path / "run"),
        max_steps=2,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    out = Trainer(model=model, args=short, train_dataset=rows).train()
    assert out.global_step == 2 and out.training_loss > 0


def test_trl_export_builds_a_real_sft_config(study_and_knee, tmp_path):
    from trl import SFTConfig

    study, trial = study_and_knee
    [py] = write_export(study, trial, "trl", tmp_path / "trl")
    ns = runpy.run_path(str(py))
    args = ns["training_args"]
    assert isinstance(args, SFTConfig) and args.max_length == 64 and args.assistant_only_loss
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 8 and args.bf16


def test_export_cli_refuses_an_incomplete_trial(study_and_knee, tmp_path):
    db = tmp_path / "rep.db"
    out = sweep("export", str(db), "--trial", "3", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "trial 3 did not complete (oom" in lines[0]
    ok = sweep("export", str(db), "--pick", "most-stable", "--format", "llama-factory", "-o", "cfg", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "most-stable of the front: trial 1" in ok.stdout and (tmp_path / "cfg.yaml").is_file()


def test_report_html_path_must_be_html_and_dashboard_port_must_be_free(study_and_knee, tmp_path):
    import socket

    db = tmp_path / "rep.db"
    before = db.read_bytes()
    out = sweep("report", str(db), "--html", str(db), cwd=tmp_path)
    assert out.returncode == 2 and "--html" in out.stderr and db.read_bytes() == before
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = sweep("dashboard", str(db), "--port", str(port), cwd=tmp_path, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "cannot listen there" in lines[0], out.stderr
