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
from sweeper.export import pick_trial, write_export
from sweeper.export._axolotl import AXOLOTL_LORA_KERNELS
from sweeper.space import parse_space
from sweeper.study import snapshot
from sweeper.study._storage import open_study
from sweeper.testing import REPO, STACKS, add_configured_trials, add_trial, make_study, run_in_venv, stack_venv

#: Trial 6's settings, none at the tools' defaults: float16, fp4 without double quantization, r 16 with lora_alpha
#: 8 (LLaMA-Factory's default would be 2 * r), four target modules, batch 4 of 128 tokens, paged 8-bit AdamW, no
#: gradient checkpointing. Trial 7 is trial 6 in float32; trial 8 is trial 1 with lora_alpha_ratio 0.3 (lora_alpha
#: 2.4); trials 9 and 10 are trials 6 and 1 with packing (behind the front).
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

#: ``use_cpu``: the side venvs' torch is a CPU build, and transformers refuses bf16/fp16 without a GPU unless told to
#: use the CPU. The dataset is the export's own (the trial's rows, written beside it).
LLAMA_FACTORY_ADDS = {"use_cpu": True}
AXOLOTL_ADDS: dict = {}

#: The tool's libraries are offline, and axolotl's telemetry is off.
OFFLINE = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1"}


@pytest.fixture(scope="module")
def study(tmp_path_factory, tiny_model):
    """make_study's trials 0-5 on the tiny model, and trials 6-10 (see :data:`OTHER`). Trial 8 dominates trial 1:
    the front is trials 0 and 8."""
    folder = tmp_path_factory.mktemp("tools-study")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the study's folder (studies/rep/) goes there, not into the checkout
        return _make(folder, tiny_model)


def _make(folder, tiny_model):
    study = make_study(folder, model=str(tiny_model))
    float32 = {**OTHER, "bnb_4bit_compute_dtype": "float32"}
    packed = [({**OTHER, "packing": True}, 3.0, 0.95), ({"packing": True}, 3.1, 0.95)]
    add_configured_trials(
        study, tiny_model, [(OTHER, 1.8, 0.3), (float32, 1.9, 0.35), ({"lora_alpha_ratio": 0.3}, 1.4, 0.1), *packed]
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
    assert pick_trial(snapshot(study), pick="knee").number == 8
    assert pick_trial(snapshot(study), pick="knee", fmt="axolotl").number == 1
    assert pick_trial(snapshot(study), pick="most-stable", fmt="axolotl").number == 1
    with pytest.raises(
        StudyError,
        match=r"trial 8: its lora_alpha 2\.4 .*not a whole number.*nearest trial it can express is 1 .*"
        r"--format hf, trl or llama-factory",
    ):
        pick_trial(snapshot(study), number=8, fmt="axolotl")
    with pytest.raises(StudyError, match="lora_alpha 2.4, not a whole number, which axolotl cannot express"):
        write_export(snapshot(study), pick_trial(snapshot(study), number=8), "axolotl", tmp_path / "ax")
    lf, *_ = write_export(
        snapshot(study), pick_trial(snapshot(study), number=8, fmt="llama-factory"), "llama-factory", tmp_path / "lf"
    )
    assert yaml.safe_load(lf.read_text())["lora_alpha"] == 2.4
    # The float32 trial: axolotl expresses it, LLaMA-Factory names the formats that do.
    assert pick_trial(snapshot(study), number=7, fmt="axolotl").number == 7
    with pytest.raises(StudyError, match=r"trial 7: it computed in float32.*--format hf, trl or axolotl$"):
        pick_trial(snapshot(study), number=7, fmt="llama-factory")
    # A study of fractional lora_alphas only: the pick says what axolotl lacks and which formats express them.
    monkeypatch.chdir(tmp_path)
    lone = open_study(
        parse_space({"study": {"name": "lone"}}, "space.yaml"), f"sqlite:///{tmp_path}/lone.db", "lone", 8
    )
    attrs = {k: study.trials[8].user_attrs[k] for k in ("config", "lora_alpha")}
    add_trial(lone, r=8, batch=2, seq=64, status="complete", peak=1.0, instability=0.1, extra=attrs)
    with pytest.raises(StudyError, match=r"fractional lora_alpha.*--format hf, trl or llama-factory, or run trials"):
        pick_trial(snapshot(lone), pick="knee", fmt="axolotl")


@pytest.mark.network
@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_llama_factory_parses_the_export_into_the_trials_settings(llama_factory, study, tmp_path, tiny_model, packing):
    """LLaMA-Factory 0.9.5 accepts the exports of trials 1 (bfloat16, nf4), 6 (float16, fp4, no double quant, every
    setting off its defaults) and 8 (a fractional lora_alpha), and every key comes out with the file's value, which
    is the trial's; it computes in the dtype the file's comment states, and quantizes with the trial's settings.
    Packed, trials 10 and 9 (1 and 6 with packing): packing with neat_packing, its block-diagonal attention on; it
    packs rows of cutoff_len - 1 tokens (its DataArguments take one off with packing)."""
    trials = [pick_trial(snapshot(study), number=n, fmt="llama-factory") for n in ((10, 9) if packing else (1, 6, 8))]
    files = [write_export(snapshot(study), t, "llama-factory", tmp_path / f"lf{t.number}")[0] for t in trials]
    results = _check(llama_factory, "llama-factory", LLAMA_FACTORY_ADDS, files, tmp_path)
    pins = _pins("llama-factory")
    for trial, path, got in zip(trials, files, results):
        text = path.read_text()
        exported = yaml.safe_load(text)
        assert "add your dataset" not in text and exported["dataset"] == f"rep-trial{trial.number}"
        assert set(exported) <= set(got), set(exported) - set(got)
        for key, value in exported.items():
            want = value.split(",") if key in ("lora_target", "dataset") else value
            want = want - 1 if key == "cutoff_len" and packing else want
            assert got[key] == want, (trial.number, key, got[key], want)
        c = trial.config
        assert got["model_name_or_path"] == str(tiny_model) and got["quantization_method"] == "bnb"
        assert got["lora_rank"] == c.r and got["lora_alpha"] == trial.lora_alpha
        assert got["lora_target"] == list(c.target_modules) and got["lora_dropout"] == c.lora_dropout
        assert got["per_device_train_batch_size"] == c.per_device_train_batch_size
        assert got["gradient_accumulation_steps"] == math.ceil(16 / c.per_device_train_batch_size)
        assert got["cutoff_len"] == c.max_seq_length - (1 if packing else 0) and got["learning_rate"] == c.learning_rate
        assert got["optim"] == c.optim and got["disable_gradient_checkpointing"] is not c.gradient_checkpointing
        assert c.packing is packing and got["train_on_prompt"] is False  # the replies supervised
        assert got["packing"] is got["neat_packing"] is got["block_diag_attn"] is packing  # no cross-attention
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
    assert [r["bnb"]["bnb_4bit_quant_type"] for r in results] == (["nf4", "fp4"] if packing else ["nf4", "fp4", "nf4"])


@pytest.mark.network
@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_axolotl_validates_the_export_and_keeps_the_trials_settings(axolotl, study, tmp_path, tiny_model, packing):
    """axolotl 0.21.0 accepts the exports of trials 1 (bfloat16), 6 (float16, fp4, no double quant) and 7 (float32)
    and keeps every key: through validate_config on an Ampere GPU's capabilities (where tf32: auto would turn TF32
    on, and does when the key is left out) and without, and through normalize_config; its BitsAndBytesConfig takes
    the trial's compute dtype, quant type and double quantization from bnb_config_kwargs. Padded: sample_packing and
    pad_to_sequence_len false (pad to the longest row). Packed, trials 10 and 9 (1 and 6 with packing):
    sample_packing and pad_to_sequence_len true, with the trial's attention (sdpa), which keeps samples apart."""
    trials = [pick_trial(snapshot(study), number=n, fmt="axolotl") for n in ((10, 9) if packing else (1, 6, 7))]
    files = [write_export(snapshot(study), t, "axolotl", tmp_path / f"ax{t.number}")[0] for t in trials]
    results = _check(axolotl, "axolotl", AXOLOTL_ADDS, files, tmp_path)
    pins = _pins("axolotl")
    for trial, path, got in zip(trials, files, results):
        exported = yaml.safe_load(path.read_text())
        for stage in ("validated", "validated_without_capabilities", "normalized"):
            assert set(exported) <= set(got[stage]), (stage, set(exported) - set(got[stage]))
            for key, value in exported.items():
                assert got[stage][key] == value, (trial.number, stage, key, got[stage][key], value)
        c, v = trial.config, got["normalized"]
        assert v["tf32"] is False and v["excess_length_strategy"] == "truncate" and c.packing is packing
        assert v["sample_packing"] is v["pad_to_sequence_len"] is packing
        assert v["attn_implementation"] == ("sdpa" if packing else None)
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
    dtypes = ["bfloat16", "float16"] + ([] if packing else ["float32"])
    assert [r["bnb"]["bnb_4bit_compute_dtype"] for r in results] == dtypes


#: SmolLM2-135M-Instruct's chat template (from the built-in model's GGUF file): ChatML that opens with a default
#: system turn when the conversation has none.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou "
    "are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + "
    "message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: Chat rows: one turn, two exchanges, a system turn, and one whose user speaks twice (the trial trains it,
#: LLaMA-Factory's reader skips it: the export says so); and alpaca rows, one with an input (the trial joins it to the
#: instruction with a blank line, LLaMA-Factory's alpaca reader with a newline: the export writes them as turns).
DATASETS = {
    "chat.jsonl": [
        {"messages": [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "Seven."}]},
        {"messages": [
            {"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Add 2 and 3."}, {"role": "assistant", "content": "2 + 3 = 5."},
        ]},
        {"messages": [
            {"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Thanks"},
            {"role": "assistant", "content": "De rien !"},
        ]},
        {"messages": [
            {"role": "user", "content": "One"}, {"role": "user", "content": "Two"},
            {"role": "assistant", "content": "Three"},
        ]},
    ],
    "alpaca.jsonl": [
        {"instruction": "Translate to German.", "input": "good morning", "output": "Guten Morgen"},
        {"instruction": "Say hello.", "input": "", "output": "Hello."},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def templated_model(tmp_path_factory, tiny_model):
    """The tiny Llama whose tokenizer carries SmolLM2's chat template (LLaMA-Factory parses it from the tokenizer)."""
    import shutil

    from transformers import AutoTokenizer

    target = tmp_path_factory.mktemp("templated") / "model"
    shutil.copytree(tiny_model, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    tokenizer.save_pretrained(target)
    return target


def _row_exports(fmt, models, datasets, tmp_path, monkeypatch):
    """For each model and each of ``datasets`` (``{file name: rows}``): a study whose trial 6 read the rows, its
    ``fmt`` export, and the trial's tokens at 4096 (``tokenize_samples``: ids and labels, a row each, in the file's
    order, without the rows LLaMA-Factory's reader skips, which the export counts)."""
    from sweeper.data import load_samples, load_tokenizer, tokenize_samples
    from sweeper.export._dataset import _alternates
    from sweeper.space import DatasetSpec

    files, expected = [], []
    for k, model in enumerate(models):
        for name, rows in datasets.items():
            folder = tmp_path / f"{fmt}-model{k}-{name}"
            folder.mkdir()
            monkeypatch.chdir(folder)  # each study's folder (studies/rep/) apart
            data = folder / name
            data.write_text("".join(json.dumps(r) + "\n" for r in rows))
            study = make_study(folder, model=str(model))
            dataset = {"path": str(data), "format": "auto", "max_samples": 512, "seed": 0, "split": "train"}
            add_configured_trials(study, model, [({"dataset": dataset}, 1.0, 0.1)])
            path, *_ = write_export(snapshot(study), pick_trial(snapshot(study), number=6, fmt=fmt), fmt, folder / fmt)
            samples = sorted(load_samples(DatasetSpec(path=str(data))), key=lambda s: s.index)
            skipped = sum(s.messages is not None and not _alternates(s.messages) for s in samples)
            if fmt == "llama-factory":
                assert (f"; {skipped} of them do not alternate" in path.read_text()) is bool(skipped)
                samples = [s for s in samples if s.messages is None or _alternates(s.messages)]
            tokens = tokenize_samples(samples, load_tokenizer(str(model)), 4096)
            files.append(path)
            expected.append((model, name, skipped, [(t.input_ids, t.labels) for t in tokens]))
    return files, expected


@pytest.mark.network
def test_llama_factory_trains_the_exported_rows_on_the_trials_tokens(
    llama_factory, tmp_path, tiny_model, templated_model, monkeypatch
):
    """LLaMA-Factory 0.9.5's own loader (``get_dataset``, stage sft, after ``get_template_and_fix_tokenizer``) reads
    the export's dataset entry into the input ids and labels the trial trains on (``tokenize_samples``), row for row:
    for a tokenizer without a chat template (``template: chatml``) and one with SmolLM2's (parsed from the tokenizer,
    its default system turn included), on chat and alpaca rows. The one row LLaMA-Factory skips is the one the
    export's comment counts. At 4096 tokens, so that no row is cut (the cut differs, and the export says so)."""
    files, expected = _row_exports("llama-factory", (tiny_model, templated_model), DATASETS, tmp_path, monkeypatch)
    adds = {**LLAMA_FACTORY_ADDS, "cutoff_len": 4096, "overwrite_cache": True}
    results = _check(llama_factory, "llama-factory-rows", adds, files, tmp_path)
    assert sum(skipped for *_, skipped, _ in expected) == 2  # the speaker-twice row, once a model
    for (model, name, _, want), got in zip(expected, results):
        assert got["template"] == ("chatml" if model == tiny_model else None), (model, name)
        assert list(zip(got["input_ids"], got["labels"])) == want, (str(model), name)


@pytest.mark.network
def test_axolotl_trains_the_exported_rows_on_the_trials_tokens_but_one_a_turn(
    axolotl, tmp_path, tiny_model, templated_model, monkeypatch
):
    """axolotl 0.21.0's own dataset loader and tokenizing strategies (``load_dataset_with_config``,
    ``get_dataset_wrapper``: ``chat_template`` with the export's template, ``completion``) make of the export's
    entry the input ids the trial trains on, row for row, and the same labels but one token an assistant turn: the
    newline the template writes after the end-of-turn token, which the trial supervises (it is the end of the turn's
    text) and axolotl's ``train_on_eos: turn`` does not (the export's comment says so). Text rows: the same ids and
    labels."""
    datasets = {**DATASETS, "text.jsonl": [{"text": "The cat sat."}, {"text": "Two plus two is four."}]}
    files, expected = _row_exports("axolotl", (tiny_model, templated_model), datasets, tmp_path, monkeypatch)
    results = _check(axolotl, "axolotl-rows", AXOLOTL_ADDS, files, tmp_path)
    for (model, name, _, want), got in zip(expected, results):
        assert [ids for ids, _ in want] == got["input_ids"], (str(model), name)
        for (ids, ours), theirs in zip(want, got["labels"]):
            differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
            eos = got["eos_token_id"]
            turns = sum(t == eos for t, label in zip(ids, ours) if label != -100)
            assert all(theirs[i] == -100 and ids[i - 1] == eos for i in differ), (str(model), name, differ)
            assert len(differ) == (0 if name == "text.jsonl" else turns), (str(model), name, differ, turns)
