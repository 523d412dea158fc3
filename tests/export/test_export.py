"""``sweep export``: every format carries every value of the trial; the ``hf`` file's objects train two real steps on
the tiny model; the ``trl`` file builds a real ``SFTTrainer`` that trains the trial's tokens; LLaMA-Factory is given
only trials it can express; a trial that did not complete is refused in one line; a format registered with one line
is a CLI choice. ``test_export_stacks.py`` runs the files under the production stacks' older library versions."""

import dataclasses
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sweeper.export import pick_trial, write_export
from sweeper.study import snapshot
from sweeper.testing import make_study, run_cli, sweep


@pytest.fixture
def study_and_knee(tmp_path, tiny_model):
    study = make_study(tmp_path, model=str(tiny_model))
    return study, pick_trial(snapshot(study), pick="knee")  # trial 1: r=8, batch 2, seq 64, bfloat16, nf4, double quant


def test_yaml_and_json_exports_carry_every_value(study_and_knee, tmp_path):
    study, trial = study_and_knee
    assert trial.number == 1
    ax, *_ = write_export(snapshot(study), trial, "axolotl", tmp_path / "out" / "ax")
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
    # and what it does otherwise than the trial's preparation (issue 57): its embeddings and lm_head in bfloat16
    assert "adapter: qlora  # axolotl converts embed_tokens, lm_head and the norms back to the compute dtype" in text
    # axolotl's defaults would train otherwise than the trial: TF32 matmuls on Ampere+, rows over sequence_len dropped
    assert a["tf32"] is False and a["excess_length_strategy"] == "truncate" and a["sample_packing"] is False
    lf, *_ = write_export(snapshot(study), trial, "llama-factory", tmp_path / "lf.yaml")
    f = yaml.safe_load(lf.read_text())
    assert f["finetuning_type"] == "lora" and f["quantization_bit"] == 4 and f["quantization_type"] == "nf4"
    assert f["double_quantization"] is True and f["lora_rank"] == 8 and f["lora_alpha"] == 16
    assert f["lora_target"] == "q_proj,v_proj" and f["cutoff_len"] == 64
    assert f["per_device_train_batch_size"] == 2 and f["gradient_accumulation_steps"] == 8 and f["bf16"] is True
    text = lf.read_text()
    assert "bf16: true  # LLaMA-Factory computes the 4-bit layers in bfloat16, as the trial" in text
    assert "float16 on other GPUs and for a float16 or float32 checkpoint" in text  # the case without bf16/fp16
    [js] = write_export(snapshot(study), trial, "json", tmp_path / "x.json")
    j = json.loads(js.read_text())
    assert j["provenance"]["trial"] == 1 and j["provenance"]["memory_kind"] == "cpu_peak_rss"
    assert j["bnb_config"]["bnb_4bit_compute_dtype"] == "bfloat16" and j["effective_batch_size"] == 16


def test_the_typed_settings_write_the_json_exports_keys_in_order(study_and_knee, tmp_path):
    """ExportSettings' parts are typed (frozen dataclasses); their to_dict gives the keys the JSON export has always
    written, in the same order (docs/contract.md: the file formats are a contract)."""
    study, trial = study_and_knee
    [js] = write_export(snapshot(study), trial, "json", tmp_path / "x.json")
    j = json.loads(js.read_text())
    assert list(j) == [
        "provenance", "notes", "model", "max_seq_length", "collation", "environment", "bnb_config", "lora_config",
        "training_args", "effective_batch_size", "target_effective_batch_size", "sweeper_sha256",
    ]  # fmt: skip
    assert j["collation"] == {"packing": False, "attn_implementation": "sdpa"} and j["environment"] == {}
    assert j["bnb_config"] == {
        "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }  # fmt: skip
    assert list(j["bnb_config"]) == ["load_in_4bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                                     "bnb_4bit_compute_dtype"]  # fmt: skip
    lora = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "bias": "none",
            "task_type": "CAUSAL_LM"}  # fmt: skip
    assert j["lora_config"] == lora and list(j["lora_config"]) == list(lora)
    assert list(j["training_args"]) == [
        "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "optim",
        "gradient_checkpointing", "max_grad_norm", "warmup_steps", "weight_decay", "bf16", "fp16", "seed",
    ]  # fmt: skip
    assert list(j["provenance"]) == [
        "study", "trial", "peak_memory_gib", "memory_kind", "memory_limit_gib", "instability", "stability_margin",
        "margin_capped", "lr_ceiling", "predicted_max_lr", "stability_margin_low", "stability_margin_high",
        "predicted_max_lr_low", "predicted_max_lr_high", "predicted_max_lr_source", "headroom", "headroom_low",
        "headroom_high", "near_edge", "horizon_steps", "p_diverge", "p_diverge_low", "p_diverge_high",
        "stability_call", "safe_learning_rate", "measured_effective_batch_size", "learning_progress", "confirmation",
        "device",
        "versions", "exported", "cuda_alloc_conf", "cached_share",
    ]  # fmt: skip
    # the trial's allocator setting travels with it (issue 57): the test studies are CPU-like records without one
    assert j["provenance"]["cuda_alloc_conf"] is None
    assert list(j["provenance"]["versions"])[-1] == "sweeper" and j["provenance"]["confirmation"] is None


@pytest.fixture
def toml_format():
    """A throwaway export format, registered as a format's module is: its record one line on the registry list
    (taken off after the test). It writes r and lora_alpha as TOML and cannot express a trial whose r is not 8."""
    from sweeper.export import EXPORT_FORMATS
    from sweeper.export._format import ExportFormat, Limit

    def render(s, data):
        return {".toml": f'base_model = "{s.model}"\nr = {s.lora.r}\nlora_alpha = {s.lora.lora_alpha}\n'}

    def r_not_8(trial):
        return None if trial.config.r == 8 else f"its r {trial.config.r} is not 8, which toml cannot express"

    toml = ExportFormat(
        name="toml",
        suffix=".toml",
        help="r and lora_alpha as TOML (a test's format)",
        render=render,
        limit=Limit(why=r_not_8, every="every one has an r other than 8", fix="run trials with r 8"),
    )
    EXPORT_FORMATS.append(toml)
    yield toml
    EXPORT_FORMATS.remove(toml)


def test_a_format_registers_with_one_line(study_and_knee, tmp_path, tiny_model, toml_format):
    """A format appended to the registry is a --format choice with its help line, is written through the real CLI
    with its suffix (stamped, under studies/<study>/exports/ by default), and its limit steers the pick and the
    refusal as LLaMA-Factory's does."""
    db = str(tmp_path / "rep.db")
    usage = run_cli("export", "--help")
    assert usage.returncode == 0 and "{hf,trl,axolotl,llama-factory,json,policy,toml}" in usage.stdout
    assert "; toml: r and lora_alpha as TOML (a test's format)" in " ".join(usage.stdout.split())
    ok = run_cli("export", db, "--pick", "min-memory", "--format", "toml", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    # trial 0 (r 4) is the study's min-memory; toml's pick is made on the front of the trials it can express
    assert "min-memory #1, among the front of the trials toml can express (1);" in ok.stdout
    assert "; the study's min-memory is trial 0: " in ok.stdout
    written = tmp_path / "studies" / "rep" / "exports" / "trial1-toml.toml"
    assert ok.stdout.rstrip().endswith(f"as toml: {written.relative_to(tmp_path)}"), ok.stdout
    text = written.read_text()
    assert text.startswith(f'base_model = "{tiny_model}"\nr = 8\nlora_alpha = 16\n# sweeper-sha256: '), text
    mine = run_cli("export", db, "--trial", "1", "--format", "toml", "-o", "cfg", cwd=tmp_path)
    assert mine.returncode == 0 and (tmp_path / "cfg.toml").is_file(), mine.stderr
    wrong = run_cli("export", db, "--trial", "1", "--format", "toml", "-o", "cfg.yaml", cwd=tmp_path)
    assert wrong.returncode == 2 and "the toml export is a .toml file" in wrong.stderr, wrong.stderr
    # -o - wrote ./-.toml, -o /dev/null wrote /dev/null.toml (issue 48): an export is files, in a file or a folder
    for target, needle in (("-", "-: -o: an export is files, not a stream"), ("/dev/null", "not a regular file")):
        out = run_cli("export", db, "--trial", "1", "--format", "toml", "-o", target, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and needle in lines[0], out.stderr
    assert not (tmp_path / "-.toml").exists() and not Path("/dev/null.toml").exists()
    refused = run_cli("export", db, "--trial", "0", "--format", "toml", cwd=tmp_path)
    [line] = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and "trial 0: its r 4 is not 8, which toml cannot express" in line, line
    assert "nearest trial it can express is 1 " in line and "--format hf, trl, axolotl or llama-factory" in line


@pytest.mark.slow
def test_hf_export_trains_two_steps(study_and_knee, tmp_path, tiny_model):
    import transformers
    from export_check import train_hf

    study, trial = study_and_knee
    py, js = write_export(snapshot(study), trial, "hf", tmp_path / "knee")
    assert py.suffix == ".py" and js.suffix == ".json"
    ns = runpy.run_path(str(py))
    bnb, lora, args = ns["bnb_config"], ns["lora_config"], ns["training_args"]
    assert bnb.bnb_4bit_compute_dtype == torch_dtype("bfloat16") and bnb.bnb_4bit_quant_type == "nf4"
    assert lora.r == 8 and lora.lora_alpha == 16 and args.gradient_accumulation_steps == 8 and args.bf16
    # The checkpointing key by the name the installed transformers has (activation_checkpointing from 5.23).
    new_name = "activation_checkpointing" in transformers.TrainingArguments.__dataclass_fields__
    assert ns["CHECKPOINTING"] == ("activation_checkpointing" if new_name else "gradient_checkpointing")
    out = train_hf(py, tiny_model, tmp_path / "run")
    assert out["global_step"] == 2 and out["loss"] > 0 and out["checkpointing"]
    assert out["first_batch"] == [2, 25] and out["first_batch_padding_labels"] == [-100]  # padded to its longest row
    # adapt_model prepares the bfloat16-loaded model as the trial did: the weights outside the 4-bit layers in float32
    assert out["frozen_float_dtypes"] == ["torch.float32"]


def torch_dtype(name):
    import torch

    return getattr(torch, name)


def test_trl_export_builds_a_real_sft_config(study_and_knee, tmp_path):
    from trl import SFTConfig

    study, trial = study_and_knee
    [py] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    ns = runpy.run_path(str(py))
    args = ns["training_args"]
    assert isinstance(args, SFTConfig) and args.max_length == 64 and args.truncation_mode == "keep_start"
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 8 and args.bf16
    assert not args.packing and args.gradient_checkpointing
    assert args.loss_type == "nll"  # TRL 1.14: the trial's loss over the full logits (1.16: tiled, docs/exports.md)
    assert ns["make_sft_config"](max_steps=3).max_steps == 3 and callable(ns["build_trainer"])


@pytest.fixture
def packed_study(study_and_knee, tiny_model):
    """make_study's trials and trial 6: trial 1 (the knee) with packing, measured lighter and as stable."""
    from sweeper.testing import add_configured_trials

    study, _ = study_and_knee
    add_configured_trials(study, tiny_model, [({"packing": True}, 1.2, 0.2)])
    return study, pick_trial(snapshot(study), number=6)


def _collation_line(text, packing):
    """The header line of the collation the trial measured."""
    [line] = [line for line in text.splitlines() if line.startswith("# Collation: ")]
    how = "samples packed into rows of at most 64 tokens" if packing else "each micro-batch padded to its longest row"
    assert how in line and line.endswith("train with it, or its memory and stability figures do not hold."), line
    return line


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_every_format_writes_the_trials_collation_in_its_own_keys(study_and_knee, packed_study, tmp_path, packing):
    """The trial's collation, in each stack's own keys, and in each file's header: padded (one sample a row, each
    micro-batch padded to its longest row) or packed (rows of at most max_seq_length tokens, position ids restarting
    at each sample, no attention across samples). TRL's real SFTConfig takes the trl file's keys."""
    study, trial = packed_study if packing else study_and_knee
    assert trial.config.packing is packing and trial.config.max_seq_length == 64
    [trl] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    _collation_line(trl.read_text(), packing)
    args = runpy.run_path(str(trl))["training_args"]
    assert args.packing is packing and args.max_length == 64 and args.truncation_mode == "keep_start"
    assert args.padding_free is packing and args.packing_strategy == "bfd"  # whole samples a row, each cut at 64
    # TRL flattens a packed micro-batch into one row: on sdpa its mask is (2 x 64)^2, twice the trial's 2 x 64^2.
    flat = [line for line in trl.read_text().splitlines() if line.startswith("# TRL packs padding-free")]
    assert flat == ([] if not packing else [flat[0]]) and all("= 16,384 elements where the trial's 2 rows held 8,192" in
                                                              line for line in flat), flat  # fmt: skip
    ax, *_ = write_export(snapshot(study), trial, "axolotl", tmp_path / "ax")
    _collation_line(ax.read_text(), packing)
    a = yaml.safe_load(ax.read_text())
    assert a["sample_packing"] is packing and a["pad_to_sequence_len"] is packing and a["sequence_len"] == 64
    assert a.get("attn_implementation") == ("sdpa" if packing else None)  # what keeps packed samples apart
    lf, *_ = write_export(snapshot(study), trial, "llama-factory", tmp_path / "lf")
    _collation_line(lf.read_text(), packing)
    f = yaml.safe_load(lf.read_text())
    assert f["packing"] is packing and f.get("neat_packing") is (True if packing else None) and f["cutoff_len"] == 64
    [js] = write_export(snapshot(study), trial, "json", tmp_path / "x.json")
    assert json.loads(js.read_text())["collation"] == {"packing": packing, "attn_implementation": "sdpa"}
    if not packing:
        py, hf_json = write_export(snapshot(study), trial, "hf", tmp_path / "hf")
        text = py.read_text()
        _collation_line(text, packing)
        assert "# hf pads only: a trial that packed samples is exported with --format trl" in text
        assert 'DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)' in text
        assert json.loads(hf_json.read_text())["collation"]["packing"] is False
        return
    # The hf export has no packing: a packed trial is refused, naming the fix, and picks pass over it.
    from sweeper.errors import StudyError

    with pytest.raises(StudyError, match=r"trial 6: it packed samples into rows \(packing: true\).*--format trl$"):
        write_export(snapshot(study), trial, "hf", tmp_path / "hf")
    with pytest.raises(
        StudyError,
        match=r"trial 6: it packed samples.*nearest trial it can express is 1 .*--format trl, axolotl or "
        r"llama-factory$",
    ):
        pick_trial(snapshot(study), number=6, fmt="hf")
    assert (
        pick_trial(snapshot(study), pick="knee").number == 6
        and pick_trial(snapshot(study), pick="knee", fmt="hf").number == 1
    )


def test_the_hf_files_collator_pads_each_micro_batch_to_its_longest_row(study_and_knee, tmp_path, tiny_model):
    """The hf file's make_data_collator is transformers' DataCollatorForSeq2Seq padding to the longest row of the
    micro-batch (not to max_seq_length), on the right, the padding unsupervised; a tokenizer without a pad token gets
    the end-of-sequence token, as in the trial."""
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    py, _ = write_export(snapshot(study_and_knee[0]), study_and_knee[1], "hf", tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.pad_token, tokenizer.padding_side = None, "left"  # a tokenizer without a pad token, padding left
    collator = runpy.run_path(str(py))["make_data_collator"](tokenizer)
    assert isinstance(collator, DataCollatorForSeq2Seq) and tokenizer.pad_token == tokenizer.eos_token
    batch = collator(
        [{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9, 10, 11, 12], "labels": [8] * 5}]
    )
    assert (
        batch["input_ids"].shape == (2, 5)
        and batch["input_ids"][0].tolist() == [5, 6, 7] + [tokenizer.pad_token_id] * 2
    )
    assert batch["labels"][0].tolist() == [5, 6, 7, -100, -100] and batch["attention_mask"][0].tolist() == [
        1,
        1,
        1,
        0,
        0,
    ]


@pytest.mark.slow
def test_trl_export_of_a_packed_trial_trains_packed_rows(packed_study, tmp_path, tiny_model):
    """The packed trial's trl file builds an SFTTrainer that packs whole samples into rows of at most 64 tokens and
    trains two steps on them: a micro-batch is the packed rows' samples without padding or attention mask, their
    position ids restarting at each sample (what keeps them apart)."""
    from export_check import SHORT_ROWS, train_trl

    [py] = write_export(snapshot(packed_study[0]), packed_study[1], "trl", tmp_path / "trl")
    out = train_trl(py, tiny_model, tmp_path / "run", SHORT_ROWS)
    assert out["global_step"] == 2 and out["finite"] and out["packing"] and out["padding_free"]
    assert out["rows"] < len(SHORT_ROWS) and out["samples_in_batch"] > 2  # more than one sample a row
    assert out["position_starts"] == out["samples_in_batch"] and out["batch_shape"][0] == 1
    assert "attention_mask" not in out["batch_keys"] and "position_ids" in out["batch_keys"]


#: ChatML with transformers' generation markers around each reply and its end of turn.
GENERATION_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
    "{{ m['content'] }}<|im_end|>\n{% endgeneration %}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _trial_rows(tokenizer, rows, max_seq_length):
    """What the trial trains on for ``rows``: input ids and labels, as the worker tokenizes them."""
    from sweeper.data import Sample, tokenize_samples

    samples = [Sample(index=i, messages=tuple(r["messages"])) for i, r in enumerate(rows)]
    return [(t.input_ids, t.labels) for t in tokenize_samples(samples, tokenizer, max_seq_length)]


@pytest.mark.slow
@pytest.mark.parametrize("template", ["none", "generation"])
def test_trl_export_builds_an_sft_trainer_that_trains_what_the_trial_trained(
    study_and_knee, tmp_path, tiny_model, template
):
    """The tiny model's tokenizer has no chat template (the trial used sweeper's ChatML, without generation markers):
    TRL cannot mask assistant turns with it, so the file gives TRL each reply as a prompt/completion row. With a
    template that has generation markers, assistant_only_loss keeps a conversation one row. Either way the first row's
    tokens and labels are the trial's."""
    import shutil

    from export_check import CHAT_ROWS, train_trl
    from transformers import AutoTokenizer

    model_dir = tiny_model
    if template == "generation":
        model_dir = tmp_path / "model"
        shutil.copytree(tiny_model, model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = GENERATION_CHATML
        tokenizer.save_pretrained(model_dir)
    study, trial = study_and_knee
    [py] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    out = train_trl(py, model_dir, tmp_path / "run")
    assert out["global_step"] == 2 and out["finite"] and out["adapter_dtypes"] == ["torch.float32"]
    # the trial's preparation, which TRL does not do: the bfloat16-loaded weights outside the 4-bit layers in float32
    assert out["frozen_float_dtypes"] == ["torch.float32"]
    assert out["assistant_only_loss"] is (template == "generation")
    assert out["completion_only_loss"] is (template == "none")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template is None:
        tokenizer.chat_template = runpy.run_path(str(py))["TRIAL_CHAT_TEMPLATE"]
    ids, labels = _trial_rows(tokenizer, CHAT_ROWS, 64)[0]
    assert out["supervised_first_row"] == [t for t in labels if t != -100]
    assert tokenizer.decode(out["supervised_first_row"]).endswith("sequence.<|im_end|>\n")


@pytest.mark.slow
def test_trl_export_builds_an_sft_trainer_with_smollm2s_tokenizer(study_and_knee, tmp_path, tiny_model):
    """SmolLM2's template has no generation markers and TRL has no training version of it: assistant_only_loss
    would fail ("The chat template is not training-compatible"); the file chooses prompt/completion rows."""
    from export_check import CHAT_ROWS
    from transformers import AutoModelForCausalLM

    from sweeper.data import load_tokenizer
    from sweeper.model import resolve_model
    from sweeper.space import ModelSpec

    smollm2 = load_tokenizer(resolve_model(ModelSpec()))
    study, trial = study_and_knee
    [py] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    ns = runpy.run_path(str(py))
    assert not ns["chat_template_masks_assistant"](smollm2)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))  # the trainer is built, not trained
    trainer = ns["build_trainer"](model, smollm2, CHAT_ROWS, output_dir=str(tmp_path / "run"), report_to="none")
    assert trainer.args.completion_only_loss and not trainer.args.assistant_only_loss
    [(ids, labels)] = _trial_rows(smollm2, CHAT_ROWS[:1], 64)
    first = trainer.train_dataset[0]
    assert first["input_ids"] == ids and [t for t in first["labels"] if t != -100] == [t for t in labels if t != -100]


def _float32_study(tmp_path, tiny_model):
    """The report's study (trials 0-5) and three more: trial 6 computes in float32 and is the knee of the front
    (trials 0 and 6); trial 7 is its configuration in bfloat16 again (as trial 1), measured higher; trial 8 is another
    bfloat16 trial, dominated by trial 6 only."""
    from sweeper.testing import add_configured_trials, add_trial

    study = make_study(tmp_path, model=str(tiny_model))
    dtypes = (("float32", 1.4, 0.15), ("bfloat16", 1.6, 0.25))
    add_configured_trials(study, tiny_model, [({"bnb_4bit_compute_dtype": d}, p, i) for d, p, i in dtypes])
    add_trial(study, r=4, batch=1, seq=64, status="complete", peak=1.45, instability=0.8, model=str(tiny_model))
    return study


def test_llama_factory_picks_among_the_trials_it_can_express(tmp_path, tiny_model):
    from sweeper.errors import StudyError

    study = _float32_study(tmp_path, tiny_model)
    assert pick_trial(snapshot(study), pick="knee").number == 6  # the front's knee computes in float32
    assert pick_trial(snapshot(study), pick="knee", fmt="axolotl").number == 6  # axolotl expresses it
    # LLaMA-Factory cannot: its pick is made on the front of the bf16/fp16 trials (0, 1, 8 without the float32 one).
    assert pick_trial(snapshot(study), pick="knee", fmt="llama-factory").number == 1
    assert pick_trial(snapshot(study), pick="min-memory", fmt="llama-factory").number == 0
    # The nearest it can express: its configuration in bfloat16 (trials 1 and 7), the nearer measurement first.
    with pytest.raises(StudyError, match=r"trial 6: it computed in float32.*nearest trial it can express is 1 "):
        pick_trial(snapshot(study), number=6, fmt="llama-factory")
    with pytest.raises(StudyError, match="cannot express"):
        write_export(snapshot(study), pick_trial(snapshot(study), number=6), "llama-factory", tmp_path / "lf")
    ax, *_ = write_export(snapshot(study), pick_trial(snapshot(study), number=6), "axolotl", tmp_path / "ax")
    a = yaml.safe_load(ax.read_text())
    assert a["bf16"] is False and a["fp16"] is False and a["tf32"] is False
    assert a["bnb_config_kwargs"]["bnb_4bit_compute_dtype"] == "float32"
    [trl] = write_export(snapshot(study), pick_trial(snapshot(study), number=6), "trl", tmp_path / "trl")
    args = runpy.run_path(str(trl))["training_args"]
    assert not args.bf16 and not args.fp16  # TRL's SFTConfig would default to bf16


def test_export_cli_llama_factory_pick_and_refusal(tmp_path, tiny_model):
    _float32_study(tmp_path, tiny_model)
    db = tmp_path / "rep.db"
    ok = run_cli("export", str(db), "--pick", "knee", "--format", "llama-factory", "-o", "lf", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "knee #1, among the front of the trials llama-factory can express (2)" in ok.stdout
    assert "study's knee is trial 6: it computed in float32, which LLaMA-Factory cannot express" in ok.stdout
    f = yaml.safe_load((tmp_path / "lf.yaml").read_text())
    assert f["bf16"] is True and f["lora_rank"] == 8
    out = run_cli("export", str(db), "--trial", "6", "--format", "llama-factory", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "--trial 1" in lines[0], out.stderr


def test_export_cli_refuses_an_incomplete_trial(study_and_knee, tmp_path):
    db = tmp_path / "rep.db"
    out = run_cli("export", str(db), "--trial", "3", cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "trial 3 did not complete (oom" in lines[0]
    ok = run_cli("export", str(db), "--pick", "most-stable", "--format", "llama-factory", "-o", "cfg", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "most-stable #1, among the front's 2 trials" in ok.stdout and (tmp_path / "cfg.yaml").is_file()


def test_report_html_path_must_be_html_and_dashboard_port_must_be_free(study_and_knee, tmp_path):
    import socket

    db = tmp_path / "rep.db"
    before = db.read_bytes()
    out = run_cli("report", str(db), "--html", str(db), cwd=tmp_path)
    assert out.returncode == 2 and "--html" in out.stderr and db.read_bytes() == before
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = sweep("dashboard", str(db), "--port", str(port), cwd=tmp_path, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "cannot listen there" in lines[0], out.stderr


def test_a_trial_whose_target_matched_nothing_is_not_exported(tmp_path, tiny_model):
    """A study from before sweep run checked target_modules: its trial trained LoRA on q_proj only, and an export
    would write v_projj into the production config as if it had taken effect."""
    from sweeper.testing import add_trial

    study = make_study(tmp_path, model=str(tiny_model))
    study.set_user_attr("model_path", str(tiny_model))
    bad = dict(study.trials[0].user_attrs["config"], target_modules=["q_proj", "v_projj"])
    add_trial(study, r=16, batch=1, seq=64, status="complete", peak=0.5, instability=0.01, extra={"config": bad})
    number = len(study.trials) - 1
    out = run_cli("export", f"{tmp_path}/rep.db", "--trial", str(number), "--format", "hf", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "['v_projj'] match no module" in out.stderr and "q_proj" in out.stderr and "not exported" in out.stderr
    ok = run_cli("export", f"{tmp_path}/rep.db", "--trial", "0", "--format", "hf", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_the_trl_file_leaves_out_the_rows_the_trial_left_out(study_and_knee, tmp_path, tiny_model, capsys):
    """The trl file reads a user's rows again, outside sweeper: it keeps exactly the rows load_samples keeps (every
    speaker, content and tool-call rule), each conversation one row where TRL masks assistant turns, and says how
    many it left out."""
    from transformers import AutoTokenizer

    from sweeper.data import load_samples
    from sweeper.errors import DataError
    from sweeper.space import DatasetSpec
    from sweeper.testing import GENERATION_CHATML

    def chat(*turns, **row):
        return {"messages": [{"role": r, "content": c} for r, c in turns], **row}

    rows = [
        chat(("user", "Q"), ("assistant", "A")),
        {"messages": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": "Be brief."},
        chat(("user", "Q"), ("observation", "42"), ("assistant", "A")),
        chat(("user", "Q"), ("assistant", None)),
        chat(("user", "Q"), ("assistant", [{"type": "image", "url": "x.png"}])),
        chat(("user", "Q"), ("function_call", "f()")),
        chat(("system", "only a system turn")),
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": [{}]}]},
        chat(("user", "Q"), ("assistant", 7)),
    ]
    study, trial = study_and_knee
    [py] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    ns = runpy.run_path(str(py))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = GENERATION_CHATML  # TRL masks assistant turns: a conversation stays one row
    dataset, loss = ns["trl_dataset"](rows, tokenizer)
    kept = []
    for i, row in enumerate(rows):  # one file each: a table cannot hold these content types in one column
        path = tmp_path / f"row{i}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        try:
            kept += [[dict(m) for m in s.messages] for s in load_samples(DatasetSpec(path=str(path)))]
        except DataError:  # no usable row: the trial trains on none
            pass
    assert loss == {"assistant_only_loss": True}
    assert [list(r["messages"]) for r in dataset] == kept and len(kept) == 3  # a number is not text (issue 68)
    assert "6 of 9 rows left out, as the trial left them out" in capsys.readouterr().out


@pytest.mark.parametrize(
    "rows",
    [
        [{"prompt": f"Q{i}", "completion": f"A{i}"} for i in range(5)] + [{"text": "a stray text row"}],
        [{"text": f"Row {i}."} for i in range(5)]
        + [{"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]}],
        [
            {"prompt": [{"role": "user", "content": "Q"}], "completion": [{"role": "assistant", "content": "A"}]},
            {"prompt": [{"role": "user", "content": "Q2"}], "completion": [{"role": "assistant", "content": "A2"}]},
            {"prompt": "Q", "completion": None},
        ],
        [{"instruction": "Q", "input": None, "output": "A"}, {"instruction": None, "output": "A"}, {"text": "t"}],
    ],
    ids=["prompt-completion-and-a-text-row", "text-and-a-chat-row", "conversational-prompt-completion", "alpaca"],
)
def test_the_trl_file_reads_a_mixed_file_as_the_trial_does(study_and_knee, tmp_path, tiny_model, rows):
    """A text row in a prompt/completion file gave TRL a row of nulls ("You need to specify either text or
    text_target"), and a chat row in a text file a text row of None: the trl file now takes the format most rows
    have and leaves out the rest, as load_samples does; the same rows reach TRL as the trial trained on."""
    from transformers import AutoTokenizer

    from sweeper.data import load_samples
    from sweeper.space import DatasetSpec
    from sweeper.testing import GENERATION_CHATML

    [py] = write_export(snapshot(study_and_knee[0]), study_and_knee[1], "trl", tmp_path / "trl")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = GENERATION_CHATML
    dataset, _ = runpy.run_path(str(py))["trl_dataset"](rows, tokenizer)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_samples(DatasetSpec(path=str(path), max_samples=100))
    assert len(dataset) == len(samples) and len(samples.dropped) == len(rows) - len(samples)
    for record in dataset:
        assert all(v is not None for v in record.values()), record


def test_the_trl_row_reader_is_a_file_of_the_package_copied_into_the_trl_export(study_and_knee, tmp_path):
    """sweeper/export/trl_rows.py is the trl file's row reader: its text below the ``# fmt: off`` line is in the
    export as it stands, the export imports nothing of sweeper, and the file imports on its own (without sweeper's
    package, as the script would) with the reader's functions."""
    import importlib.util
    from pathlib import Path

    from sweeper.export._hf import trl_rows_source

    source = trl_rows_source()
    [py] = write_export(snapshot(study_and_knee[0]), study_and_knee[1], "trl", tmp_path / "trl")
    text = py.read_text()
    assert source.startswith("\n\ndef chat_template_masks_assistant(") and source.rstrip("\n") in text
    assert "sweeper" not in "".join(line for line in text.splitlines() if line.lstrip().startswith(("import", "from")))
    path = Path(__file__).resolve().parents[2] / "sweeper" / "export" / "trl_rows.py"
    spec = importlib.util.spec_from_file_location("trl_rows_alone", path)
    assert spec is not None and spec.loader is not None
    alone = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(alone)
    assert callable(alone.trl_dataset) and callable(alone.build_trainer)
    assert alone._kind({"instruction": "Q", "output": "A"}) == "alpaca"


def test_the_trl_row_reader_on_its_own_keeps_the_rows_load_samples_keeps(tiny_model, tmp_path):
    """The same parity as the exported file's, on sweeper.export.trl_rows imported as a module."""
    from transformers import AutoTokenizer

    from sweeper.data import load_samples
    from sweeper.export import trl_rows
    from sweeper.space import DatasetSpec
    from sweeper.testing import GENERATION_CHATML

    rows = [
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]},
        {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}], "system": "Be brief."},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "function_call", "content": "f()"}]},
        {"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": None}]},
        {"text": "a stray text row"},
    ]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenizer.chat_template = GENERATION_CHATML
    dataset, loss = trl_rows.trl_dataset(rows, tokenizer)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    samples = load_samples(DatasetSpec(path=str(path), max_samples=100))
    assert loss == {"assistant_only_loss": True}
    assert [list(r["messages"]) for r in dataset] == [[dict(m) for m in s.messages] for s in samples]
    assert len(dataset) == 2


def test_an_edited_export_is_never_replaced_without_force(study_and_knee, tmp_path):
    study, trial = study_and_knee
    from sweeper.errors import StudyError

    first, *_ = write_export(snapshot(study), trial, "axolotl", tmp_path / "cfg")
    again, *_ = write_export(snapshot(study), trial, "axolotl", tmp_path / "cfg")  # as sweep wrote it: replaced
    assert again == first
    edited = first.read_text() + "num_epochs: 3  # my own\n"
    first.write_text(edited)
    with pytest.raises(StudyError, match="changed since 'sweep export' wrote it.*--force"):
        write_export(snapshot(study), trial, "axolotl", tmp_path / "cfg")
    assert first.read_text() == edited  # untouched
    other = tmp_path / "theirs.yaml"
    other.write_text("base_model: x\n")  # a file sweep never wrote
    with pytest.raises(StudyError, match="--force"):
        write_export(snapshot(study), trial, "axolotl", other)
    write_export(snapshot(study), trial, "axolotl", tmp_path / "cfg", force=True)
    assert "my own" not in first.read_text()
    out = run_cli("export", str(tmp_path / "rep.db"), "--format", "axolotl", "-o", str(other), cwd=tmp_path)
    assert out.returncode == 2 and "--force" in out.stderr and other.read_text() == "base_model: x\n"
    forced = run_cli(
        "export", str(tmp_path / "rep.db"), "--format", "axolotl", "-o", str(other), "--force", cwd=tmp_path
    )
    assert forced.returncode == 0 and "replaced 1 earlier file" in forced.stdout, forced.stderr


def test_the_confirm_line_names_the_horizon_the_command_runs(study_and_knee):
    from sweeper.export._settings import settings_of

    study, trial = study_and_knee
    [default] = [n for n in settings_of(snapshot(study), trial).notes if "sweep confirm" in n]
    assert f"to run it {10 * trial.config.max_steps} steps first" in default
    study.set_user_attr("confirm_steps", 8)  # study.confirm_steps, which 'sweep confirm' runs by default
    [line] = [n for n in settings_of(snapshot(study), trial).notes if "sweep confirm" in n]
    assert "to run it 8 steps first" in line, line


def _data_study(tmp_path, tiny_model, rows, name="data.jsonl"):
    """make_study's trials and trial 6: trial 1's settings on ``rows`` (written as JSON lines to ``name``)."""
    from sweeper.testing import add_configured_trials

    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = make_study(tmp_path, model=str(tiny_model))
    dataset = {"path": str(path), "format": "auto", "max_samples": 2, "seed": 0, "split": "train"}
    add_configured_trials(study, tiny_model, [({"dataset": dataset}, 1.0, 0.1)])
    return study, pick_trial(snapshot(study), number=6), path


#: ShareGPT rows as LLaMA-Factory's and axolotl's examples spell them: speaker names, a system column; one row with a
#: speaker the trial does not know (left out, and said).
SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}], "system": "Be brief."},
    {"conversations": [{"from": "human", "value": "2+2?"}, {"from": "gpt", "value": "4"}]},
    {"conversations": [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "y"}]},
]


def test_the_tool_exports_write_the_rows_the_trial_read(tmp_path, tiny_model):
    """axolotl and LLaMA-Factory exports carry a dataset entry: the trial's rows as it read them (ShareGPT speakers
    as roles, the system column as the first turn, the unreadable row left out and counted), beside the file, in
    the tokenizer's template (the tiny one has none: sweeper's ChatML, which axolotl is given as jinja and
    LLaMA-Factory as chatml). tests/export/test_export_tools.py runs LLaMA-Factory's own loader on them."""
    from sweeper.data import DEFAULT_CHAT_TEMPLATE, load_samples
    from sweeper.space import DatasetSpec

    study, trial, path = _data_study(tmp_path, tiny_model, SHAREGPT)
    warnings: list[str] = []
    ax, rows_file = write_export(snapshot(study), trial, "axolotl", tmp_path / "out" / "ax", warnings=warnings)
    assert warnings == [] and rows_file == (tmp_path / "out" / "ax.data" / "rows.jsonl").resolve()
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert rows == [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
    ]  # fmt: skip
    read = sorted(load_samples(DatasetSpec(path=str(path))), key=lambda s: s.index)
    assert rows == [{"messages": [dict(m) for m in s.messages]} for s in read]  # what every trial reads
    a = yaml.safe_load(ax.read_text())
    assert a["datasets"] == [
        {
            "path": str(rows_file),
            "ds_type": "json",
            "type": "chat_template",
            "field_messages": "messages",
            "message_property_mappings": {"role": "role", "content": "content"},
            "roles_to_train": ["assistant"],
            "train_on_eos": "turn",
        }
    ]
    assert a["chat_template"] == "jinja" and a["chat_template_jinja"] == DEFAULT_CHAT_TEMPLATE
    text = ax.read_text()
    assert "1 of its 3 rows left out, as the trial left them out (1 row: unknown role 'narrator' (row 2))" in text
    assert "the trials drew 2 of them (dataset.max_samples 2)" in text and "add your dataset" not in text
    lf, lf_rows, info = write_export(snapshot(study), trial, "llama-factory", tmp_path / "out" / "lf")
    f = yaml.safe_load(lf.read_text())
    assert f["dataset"] == "rep-trial6" and f["dataset_dir"] == str(lf_rows.parent) and f["template"] == "chatml"
    assert lf_rows.read_text() == rows_file.read_text()
    assert json.loads(info.read_text())["rep-trial6"]["formatting"] == "sharegpt"


def test_a_dataset_that_cannot_be_read_or_is_text_is_said(tmp_path, tiny_model):
    """The rows file gone at export time: the export is still written, its comment and a warning say why there is no
    dataset entry. Text rows: axolotl's completion type; LLaMA-Factory has no stage that trains them row by row, and
    says so. An edited rows file is not replaced without --force."""
    from sweeper.errors import StudyError

    study, trial, path = _data_study(tmp_path, tiny_model, [{"text": "one"}, {"text": "two"}])
    ax, rows_file = write_export(snapshot(study), trial, "axolotl", tmp_path / "ax")
    assert yaml.safe_load(ax.read_text())["datasets"][0]["type"] == "completion"
    assert rows_file.read_text() == '{"text": "one"}\n{"text": "two"}\n'
    [lf] = write_export(snapshot(study), trial, "llama-factory", tmp_path / "lf")
    assert "dataset" not in yaml.safe_load(lf.read_text()) and "trains text rows only at stage pt" in lf.read_text()
    path.write_text('{"text": "one"}\n{"text": "three"}\n')  # the source changed: the rows file sweep wrote is replaced
    write_export(snapshot(study), trial, "axolotl", tmp_path / "ax")
    assert rows_file.read_text() == '{"text": "one"}\n{"text": "three"}\n'
    rows_file.write_text('{"text": "one, cleaned"}\n')  # edited by the user: kept
    with pytest.raises(StudyError, match="rows.jsonl: the file was changed since"):
        write_export(snapshot(study), trial, "axolotl", tmp_path / "ax")
    assert rows_file.read_text() == '{"text": "one, cleaned"}\n'
    path.unlink()
    warnings: list[str] = []
    [ax] = write_export(snapshot(study), trial, "axolotl", tmp_path / "ax2", warnings=warnings)
    [line] = warnings
    assert line.startswith("no dataset entry: the trial's rows could not be read here (") and "no such file" in line
    assert f"# {line}" in ax.read_text() and "add your dataset" in ax.read_text()


@pytest.mark.parametrize(
    "alloc, said",
    [
        (None, "not recorded"),
        ("not applicable (cpu)", "on the CPU, where the CUDA allocator's configuration moves nothing"),
        ("", "PYTORCH_CUDA_ALLOC_CONF unset, PyTorch's default (run without it"),
        ("expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (run with it set"),
    ],
)
def test_the_header_says_what_the_trial_ran_under_and_trl_runs_its_loss(study_and_knee, tmp_path, alloc, said):
    # issue 57: the settings that move the peak and that a production stack may choose otherwise, in every format's
    # header; the trl script sets the trial's loss (TRL's default chunked_nll computes fewer logits and peaks lower)
    study, trial = study_and_knee
    trial.result.provenance.cuda_alloc_conf = alloc
    for fmt, suffix in (("trl", ".py"), ("axolotl", ".yaml"), ("llama-factory", ".yaml"), ("hf", ".py")):
        [path, *_] = write_export(snapshot(study), trial, fmt, tmp_path / fmt / f"x{suffix}")
        text = path.read_text()
        [line] = [x for x in text.splitlines() if "Measured under:" in x]
        assert "attention sdpa" in line and "cross-entropy over the full logits" in line and said in line, line
        # TRL's own loss is named only where TRL trains: transformers' Trainer (hf, axolotl, LLaMA-Factory) computes
        # the full logits as the trial did
        assert ("TRL 1.16's nll is tiled" in line) == (fmt == "trl"), (fmt, line)
        # a CPU trial's peak is the host's resident memory, not a card's: every format says so under it
        assert "# On the CPU the peak is the trial process's resident memory on the host" in text, fmt
        assert ("AXOLOTL_DO_NOT_TRACK=1 axolotl train" in text) == (fmt == "axolotl"), fmt  # its telemetry is opt-out
        assert ('loss_type="nll"' in text) == (fmt == "trl"), fmt
        # TRL drops the examples truncation leaves fully masked, which the trial kept: the trl file says so
        assert ("# TRL drops the rows that truncation at max_length 64 leaves" in text) == (fmt == "trl"), fmt
    # On CUDA, a reserved peak that was a fifth the allocator's cache is said, with the setting that returns it,
    # unless the trial already ran with it; on the CPU there is no such share.
    memory = trial.result.memory
    if alloc != "not applicable (cpu)":  # a CUDA trial's reading (a CPU trial has no cached share)
        memory.memory_kind, memory.peak_memory_gib, memory.peak_allocated_gib = "cuda_max_reserved", 12.8, 10.24
    [path, *_] = write_export(snapshot(study), trial, "axolotl", tmp_path / "cached" / "x.yaml")
    [line] = [x for x in path.read_text().splitlines() if "Measured under:" in x]
    assert ("On the CPU the peak is" in path.read_text()) == (alloc == "not applicable (cpu)")  # a card's: no line
    cached = "20% of the reserved peak was the allocator's cache, not tensors (PYTORCH_CUDA_ALLOC_CONF="
    assert (cached in line) == (alloc in (None, "")), line


@pytest.mark.parametrize(
    "alloc, expandable, environment, source",
    [
        ("max_split_size_mb:128,expandable_segments:True", False, "max_split_size_mb:128,expandable_segments:True",
         "as the trial ran"),
        ("", True, None, None),  # measured on CUDA with the allocator's defaults: the record wins, nothing is set
        ("not applicable (cpu)", True, "expandable_segments:True",
         "as the trial's expandable_segments asks (not measured: the trial ran on the CPU)"),
        ("not applicable (cpu)", False, None, None),
    ],
)  # fmt: skip
def test_every_format_runs_with_the_allocator_options_the_trial_ran_under(
    study_and_knee, tmp_path, alloc, expandable, environment, source
):
    # issue 57: the JSON names the environment, every header says how to start the run with it, and the hf and trl
    # files set it before torch is imported (warning where the user's environment said otherwise)
    study, trial = study_and_knee
    trial.result.provenance.cuda_alloc_conf = alloc
    trial = dataclasses.replace(trial, config=dataclasses.replace(trial.config, expandable_segments=expandable))
    [js] = write_export(snapshot(study), trial, "json", tmp_path / "j.json")
    expected = {} if environment is None else {"PYTORCH_CUDA_ALLOC_CONF": environment}
    assert json.loads(js.read_text())["environment"] == expected
    for fmt, suffix in (("trl", ".py"), ("hf", ".py"), ("axolotl", ".yaml"), ("llama-factory", ".yaml")):
        [path, *_] = write_export(snapshot(study), trial, fmt, tmp_path / fmt / f"x{suffix}")
        text = path.read_text()
        lines = [x for x in text.splitlines() if x.startswith("# Environment:")]
        if environment is None:
            assert not lines and "os.environ[" not in text, fmt
            continue
        [line] = lines
        assert f"PYTORCH_CUDA_ALLOC_CONF={environment}, {source}" in line, line
        if suffix == ".yaml":
            assert "a YAML file cannot set it: start the run with it" in line, line
            continue
        assert "this file sets it before importing torch" in line, line
        head = text[: text.index("\nimport torch")]
        run = subprocess.run(
            [sys.executable, "-c", head + "\nprint(os.environ['PYTORCH_CUDA_ALLOC_CONF'])"],
            env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6"},
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0 and run.stdout == f"{environment}\n", run.stderr
        assert f"PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:0.6 replaced by the trial's {environment}" in (
            run.stderr
        )
        # torch's newer name, which some versions read first: replaced too where the user's environment sets it
        newer = "\nprint(os.environ['PYTORCH_CUDA_ALLOC_CONF'], os.environ.get('PYTORCH_ALLOC_CONF'))"
        both = {"PYTORCH_ALLOC_CONF": "expandable_segments:False", "PYTORCH_CUDA_ALLOC_CONF": ""}
        command = [sys.executable, "-c", head + newer]
        run = subprocess.run(command, env={**os.environ, **both}, capture_output=True, text=True)
        assert run.returncode == 0 and run.stdout == f"{environment} {environment}\n", run.stderr
        assert f"PYTORCH_ALLOC_CONF=expandable_segments:False replaced by the trial's {environment}" in run.stderr
        unset = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
        run = subprocess.run(command, env=unset, capture_output=True, text=True)
        assert run.stdout == f"{environment} None\n" and "replaced" not in run.stderr, run.stderr


def test_each_formats_file_carries_its_runs_measured_peak_as_the_committed_measurement_says(study_and_knee, tmp_path):
    # issue 57: the exported runs' peaks measured in their tools (benchmarks/memory/export_peak.py, committed results):
    # each training format's file says its run's median difference from the trial's, within or beyond the trial's noise,
    # and how much of it the tool's process held before training began and its steps beyond the hf run's. A check of
    # the committed measurement (the runs take ~35 minutes), which fails when a new measurement is committed without
    # the figures the files print, or a file stops printing them.
    import statistics

    from sweeper.export._peaks import CPU_MEMORY_NOISE_GIB, EXPORT_PEAK_RESULTS, EXPORT_PEAKS, measured_peak_line
    from sweeper.testing import REPO

    figures = json.loads((REPO / EXPORT_PEAK_RESULTS).read_text().splitlines()[-1])
    peaks, starts = figures["peaks"], figures["starts"]

    def growth(run: str) -> float:
        return statistics.median(peak - start for peak, start in zip(peaks[run], starts[run]))

    trial_peak = statistics.median(peaks["trial"])
    study, trial = study_and_knee
    assert set(EXPORT_PEAKS) == {"hf", "trl", "axolotl", "llama-factory"} <= set(peaks)
    for fmt, measured in EXPORT_PEAKS.items():
        assert len(peaks[fmt]) == len(peaks["trial"]) == 4, fmt
        assert measured.difference_gib == round(statistics.median(peaks[fmt]) - trial_peak, 2), fmt
        before = statistics.median(starts[fmt]) - statistics.median(starts["hf"])
        assert measured.before_training_gib == round(before, 2), fmt
        assert measured.in_steps_gib == round(growth(fmt) - growth("hf"), 2), fmt
        line = measured_peak_line(fmt)
        assert line is not None and f"{measured.difference_gib:+.2f} GiB of resident memory above that trial" in line
        size, noise = abs(measured.difference_gib), CPU_MEMORY_NOISE_GIB
        where = "within" if size < noise else "at the edge of" if size == noise else "beyond"
        assert f"{where} its {noise} GiB noise" in line and "not this trial" in line, line
        name = "x.py" if fmt in ("hf", "trl") else "x.yaml"
        [path, *_] = write_export(snapshot(study), trial, fmt, tmp_path / fmt / name)
        assert f"# {line}" in path.read_text().splitlines(), fmt
    assert measured_peak_line("json") is None and measured_peak_line("policy") is None  # neither trains


def test_every_export_names_the_files_rows_that_make_a_nan_step_at_its_length(study_and_knee, tmp_path):
    """Issue 68: the exports train every row of the file; the rows with no supervised token at the exported
    max_seq_length, as the last sweep run read them (``data_untrained_rows``), are named in the header with the
    choice, and a length they do not reach is not."""
    study, trial = study_and_knee
    study.set_user_attr("data_untrained_rows", {"64": [280], "128": [3, 280]})
    for fmt, name in (("axolotl", "ax"), ("llama-factory", "lf.yaml"), ("hf", "hf.py")):
        [path, *_] = write_export(snapshot(study), trial, fmt, tmp_path / name)
        text = path.read_text()
        assert (
            "NaN RISK in the data: row 280 of the dataset file keeps no supervised token at max_seq_length 64" in text
        )
        assert "drop it from the file, or raise max_seq_length" in text and "3, 280" not in text
    study.set_user_attr("data_untrained_rows", {"128": [3, 280]})  # only at a length the trial did not train
    [path, *_] = write_export(snapshot(study), trial, "axolotl", tmp_path / "ax2")
    assert "NaN RISK" not in path.read_text()
