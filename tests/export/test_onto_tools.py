"""``sweep export STUDY --trial N --onto FILE`` (issue 67) on the tools' own published QLoRA examples, read back by
the real tools' config parsers: axolotl's examples/llama-3/qlora.yml (0.21.0's ``validate_config`` and
``normalize_config`` and its model loader's ``BitsAndBytesConfig``) and LLaMA-Factory's
examples/train_qlora/qwen3_lora_sft_otfq.yaml (0.9.5's ``get_train_args``, as ``llamafactory-cli train`` calls it,
and the ``BitsAndBytesConfig`` of its loader), each in its own venv (``tests/fixtures/stacks``, ``stack_venv``) and
through ``tests/export/tool_check.py``. The user's file is the published one with the tiny local Llama as its model
(its dataset kept: neither parser loads data); the trials' settings differ from the file's in every measured key, so
every key is really written, and the tool must read the trial's measured value from each (quantization, compute
dtype, LoRA, batch and accumulation, length, learning rate, optimizer, checkpointing, clipping, packing), while every
other key of the user's file comes out of the tool as the user wrote it. No hub is reached.

Study: :func:`sweeper.testing.make_study`'s trials 0-5 on the tiny model, then (:data:`TRIALS`) 6: float16, fp4, no
double quant, r 16 with lora_alpha 8, four targets, batch 4 x 128 tokens, paged 8-bit AdamW, no checkpointing;
7: trial 6 in float32 (axolotl only: LLaMA-Factory has no float32 compute, and --onto refuses); 8: the defaults with
a learning rate whose measured value, 1e-05, YAML writes without a point (PyYAML reads ``1e-05`` as a string);
9: r 16 with lora_alpha 16 (= LLaMA-Factory's default for the file's lora_rank 8, not for r 16); 10: trial 6 packed;
11: lora_alpha 2.4 (lora_alpha_ratio 0.3), which axolotl's schema rejects.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from sweeper.export import pick_trial
from sweeper.export._onto import HEADER_KEYS, HEADER_MARK, measured_settings
from sweeper.export._settings import settings_of
from sweeper.study import snapshot
from sweeper.testing import REPO, add_configured_trials, make_study, run_cli, run_in_venv, stack_venv

FIXTURES = REPO / "tests" / "fixtures" / "production"

#: test_export_tools.py's trial 6: none of its settings at the tools' defaults or the published files' values.
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

#: Trials 6-10 (see the module's docstring): overrides, peak GiB, instability.
TRIALS = [
    (OTHER, 1.8, 0.3),
    ({**OTHER, "bnb_4bit_compute_dtype": "float32"}, 1.9, 0.35),
    ({"learning_rate": 1e-5}, 1.4, 0.01),
    ({"r": 16, "lora_alpha_ratio": 1.0}, 1.6, 0.2),
    ({**OTHER, "packing": True}, 3.0, 0.95),
    ({"lora_alpha_ratio": 0.3}, 1.45, 0.1),
]

#: As test_export_tools.py: the side venvs' torch is a CPU build (LLaMA-Factory is told use_cpu, as a user adds it on
#: the command line), the tools' libraries offline, axolotl's telemetry off.
LLAMA_FACTORY_ADDS = {"use_cpu": True}
OFFLINE = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1"}

#: The keys --onto may write onto each tool's file (production.written's keys for the measured settings).
WRITABLE = {
    "axolotl": {
        "load_in_4bit", "load_in_8bit", "bnb_config_kwargs", "bf16", "fp16", "lora_r", "lora_alpha", "lora_dropout",
        "lora_target_modules", "lora_target_linear", "micro_batch_size", "gradient_accumulation_steps",
        "learning_rate", "optimizer", "gradient_checkpointing", "max_grad_norm", "sequence_len", "sample_packing",
        "pad_to_sequence_len", "attn_implementation", "flash_attention", "sdp_attention",
    },
    "llama-factory": {
        "quantization_bit", "quantization_type", "double_quantization", "bf16", "fp16", "lora_rank", "lora_alpha",
        "lora_dropout", "lora_target", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
        "optim", "disable_gradient_checkpointing", "max_grad_norm", "cutoff_len", "packing", "neat_packing",
        "flash_attn",
    },
}  # fmt: skip

#: Run in the tool's venv: tool_check.py's result for each file, and under "all" everything the tool parsed (to see
#: that the user's other keys came through): axolotl's config validated on an Ampere card and normalized (on it too:
#: see the patch below); LLaMA-Factory's four argument objects.
CHECK = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import tool_check

if sys.argv[2] == "axolotl":
    # normalize_config resolves the file's bf16: auto from the card it runs on (here none: it would be fp16); the
    # card is the Ampere one that tool_check.py tells validate_config of, which has bfloat16
    import axolotl.utils.config
    axolotl.utils.config.is_torch_bf16_gpu_available = lambda: True
else:
    # get_train_args leaves the file's own quantization_method: bnb a str (parse_dict converts no type), where
    # tool_check.py reads the enum's .value of its default: the same StrEnum, made of it
    import llamafactory.hparams
    from llamafactory.extras.constants import QuantizationMethod
    parse = llamafactory.hparams.get_train_args

    def get_train_args(*args, **kwargs):
        model, *rest = parse(*args, **kwargs)
        model.quantization_method = QuantizationMethod(model.quantization_method)
        return (model, *rest)

    llamafactory.hparams.get_train_args = get_train_args

def axolotl_all(path, overrides):
    from importlib import metadata
    import yaml
    from axolotl.utils.config import normalize_config, validate_config
    from axolotl.utils.dict import DictDefault
    with open(path, encoding="utf-8") as f:
        raw = {**yaml.safe_load(f), **overrides}
    env = {"torch_version": metadata.version("torch").split("+")[0]}
    data = DictDefault(json.loads(json.dumps(raw)))
    cfg = validate_config(data, capabilities=tool_check.AMPERE, env_capabilities=env)
    normalize_config(cfg)
    return {k: v for k, v in cfg.items()}

def llama_factory_all(path, overrides):
    from llamafactory.hparams import get_train_args
    from llamafactory.hparams.parser import read_args
    sys.argv = ["llamafactory-cli", path, *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]
    model, data, training, finetuning, _ = get_train_args(read_args())
    return {"model": vars(model), "data": vars(data), "finetuning": vars(finetuning), "training": training.to_dict()}

tool, overrides, paths = sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
check = {"axolotl": (tool_check.axolotl, axolotl_all), "llama-factory": (tool_check.llama_factory, llama_factory_all)}
out = []
for path in paths:
    try:
        parsed, everything = (f(path, overrides) for f in check[tool])
        out.append({**parsed, "all": everything})
    except Exception as exc:
        import traceback
        out.append({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]})
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, tiny_model):
    """The study's working directory (``studies/rep/`` and ``rep.db``): make_study's trials and :data:`TRIALS`."""
    folder = tmp_path_factory.mktemp("onto-tools-study")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        study = make_study(folder, model=str(tiny_model))
        add_configured_trials(study, tiny_model, TRIALS)
    return folder


@pytest.fixture(scope="module")
def llama_factory(tmp_path_factory):
    return stack_venv("llama-factory", tmp_path_factory)


@pytest.fixture(scope="module")
def axolotl(tmp_path_factory):
    return stack_venv("axolotl", tmp_path_factory)


def _measured(folder: Path, number: int, fmt: str) -> tuple:
    """Trial ``number``'s config and what --onto writes of it (``measured_settings``) and its ExportSettings."""
    from optuna import load_study

    study = snapshot(load_study(study_name="rep", storage=f"sqlite:///{folder}/rep.db"))
    trial = pick_trial(study, number=number, fmt=fmt)
    assert trial.number == number
    s = settings_of(study, trial)
    return trial, s, measured_settings(s)


def _user_file(source: str, folder: Path, edits: dict[str, str]) -> Path:
    """The published example at ``source`` with ``edits`` (``{key: value}``, each key's one line replaced)."""
    text = (FIXTURES / source).read_text()
    for key, value in edits.items():
        text, found = re.subn(rf"(?m)^{key}: .*$", f"{key}: {value}", text)
        assert found == 1, key
    folder.mkdir(parents=True)
    path = folder / ("qlora.yml" if source.startswith("axolotl") else "qwen3_lora_sft_otfq.yaml")
    path.write_text(text)
    return path


#: The packed trial (--onto takes the file's tool as the format: a packed trial goes onto an axolotl or LLaMA-Factory
#: file, never refused as --format hf would refuse it).
PACKED = 10


def _onto(study_dir: Path, number: int, path: Path, tool: str) -> tuple[dict, dict, set[str]]:
    """``sweep export rep --trial N --onto PATH``: the file before and after (parsed) and the keys it wrote (checked
    to be the tool's keys by the callers, after the tool has read them); the original is kept, with every comment
    line of it, and every key it did not write."""
    before_text = path.read_text()
    out = run_cli("export", "rep", "--trial", str(number), "--onto", str(path), cwd=study_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    after_text = path.read_text()
    assert Path(f"{path}.orig").read_text() == before_text
    lines = after_text.splitlines()
    assert lines[0].startswith(f"{HEADER_MARK} study 'rep', trial {number} "), lines[0]
    assert lines[1].startswith(HEADER_KEYS), lines[1]
    listed = re.fullmatch(
        rf"{re.escape(HEADER_KEYS)} (.*)\. 'sweep export rep --format policy' writes the guard\.", lines[1]
    )
    assert listed, lines[1]
    written = {k.split(".")[0] for k in listed.group(1).split(", ")}
    assert all(line in after_text for line in before_text.splitlines() if line.lstrip().startswith("#"))
    before, after = yaml.safe_load(before_text), yaml.safe_load(after_text)
    for key, value in before.items():  # every other key of the user's, as written
        if key not in written:
            assert after[key] == value, (number, key, after[key], value)
    assert set(after) - set(before) <= written
    return before, after, written


def _run(python: Path, tool: str, adds: dict, files: list[Path], cwd: Path) -> list[dict]:
    """:data:`CHECK` in the tool's venv: one result per file, each checked to be no rejection."""
    script = cwd / "onto_check.py"
    script.write_text(CHECK)
    out = run_in_venv(
        python,
        str(script),
        str(REPO / "tests" / "export"),
        tool,
        json.dumps(adds),
        *map(str, files),
        cwd=cwd,
        **OFFLINE,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    for path, result in zip(files, results):
        assert "error" not in result, f"{tool} rejects {path}: {result.get('traceback', result)}"
    return results


#: axolotl's llama-3 QLoRA example as a user points it at a local model (else as published: r 32, lora_alpha 16,
#: every linear layer, micro batch 2 x 4 accumulation, 4096 tokens packed, paged 32-bit AdamW, bf16: auto,
#: checkpointing on, flash attention 2).
AXOLOTL_USER = "axolotl_llama3-8b_qlora.yaml"


@pytest.mark.network
def test_axolotl_reads_the_trials_measured_keys_off_its_own_example_written_onto(
    axolotl, study_dir, tmp_path, tiny_model
):
    """Trials 6 (float16, fp4), 7 (float32), 8 (learning rate 1e-05), 9 (r 16) and 10 (packed) --onto axolotl's
    published example: axolotl 0.21.0 accepts each file, and its validated and normalized config and its
    BitsAndBytesConfig hold the trial's measured values; the accumulation is the export's (ExportSettings: the
    study's target_effective_batch_size, 16, not the file's 2 x 4); the user's other keys come through as written."""
    numbers = [6, 7, 8, 9, 10]
    files, written = [], {}
    for n in numbers:
        path = _user_file(AXOLOTL_USER, tmp_path / f"ax{n}", {"base_model": str(tiny_model)})
        before, after, written[n] = _onto(study_dir, n, path, "axolotl")
        files.append(path)
    results = _run(axolotl, "axolotl", {}, files, tmp_path)
    for n, path, got in zip(numbers, files, results):
        assert written[n] <= WRITABLE["axolotl"], (n, written[n] - WRITABLE["axolotl"])
        trial, s, m = _measured(study_dir, n, "axolotl")
        c, v, everything = trial.config, got["normalized"], got["all"]
        assert written[n] >= {"lora_r", "sequence_len", "optimizer", "learning_rate"}, written[n]
        # quantization and compute dtype: the BitsAndBytesConfig axolotl's model loader builds
        assert v["load_in_4bit"] is True and v["adapter"] == "qlora" and everything["load_in_8bit"] is False
        assert got["bnb"]["bnb_4bit_quant_type"] == c.bnb_4bit_quant_type == m["bnb_4bit_quant_type"], n
        assert got["bnb"]["bnb_4bit_use_double_quant"] is c.bnb_4bit_use_double_quant, n
        assert got["bnb"]["bnb_4bit_compute_dtype"] == c.bnb_4bit_compute_dtype == m["bnb_4bit_compute_dtype"], n
        assert v["torch_dtype"] == c.bnb_4bit_compute_dtype, n  # bf16/fp16 as the trial's autocast
        assert (v["bf16"] is True) is (c.bnb_4bit_compute_dtype == "bfloat16"), (n, v["bf16"])
        assert (v["fp16"] is True) is (c.bnb_4bit_compute_dtype == "float16"), (n, v["fp16"])
        # LoRA
        assert v["lora_r"] == c.r == m["r"] and v["lora_alpha"] == trial.lora_alpha == m["lora_alpha"], n
        assert v["lora_dropout"] == c.lora_dropout and v["lora_target_modules"] == list(c.target_modules), n
        assert not everything.get("lora_target_linear"), (n, everything.get("lora_target_linear"))
        # batch: the trial's micro batch, the accumulation that keeps ExportSettings' effective batch
        assert v["micro_batch_size"] == c.per_device_train_batch_size == s.training.per_device_train_batch_size
        assert (
            v["gradient_accumulation_steps"]
            == s.training.gradient_accumulation_steps
            == m["gradient_accumulation_steps"]
        )
        assert v["batch_size"] == s.effective_batch_size == s.target_effective_batch_size == 16, n
        # length, packing, optimizer, checkpointing, clipping, learning rate
        assert v["sequence_len"] == c.max_seq_length and v["sample_packing"] is c.packing, n
        assert v["pad_to_sequence_len"] is c.packing, n
        assert v["optimizer"] == c.optim and v["gradient_checkpointing"] is c.gradient_checkpointing, n
        assert (v["max_grad_norm"] or 1.0) == c.max_grad_norm, n  # unset: TrainingArguments' 1.0
        assert isinstance(v["learning_rate"], float), (n, v["learning_rate"])
        assert v["learning_rate"] == m["learning_rate"] <= c.learning_rate, n
        # the user's other keys, as axolotl reads them
        assert v["base_model"] == str(tiny_model) and v["tf32"] is False
        assert everything["type_of_model"] == "AutoModelForCausalLM"  # axolotl's name for the file's model_type
        assert everything["tokenizer_type"] == "AutoTokenizer"
        assert got["validated"]["datasets"] == [{"path": "aaditya/alpaca_subset_1", "type": "alpaca"}]
        assert everything["output_dir"] == "./outputs/qlora-out" and everything["val_set_size"] == 0
        assert everything["num_epochs"] == 4 and everything["lr_scheduler"] == "cosine"
        assert everything["warmup_ratio"] == 0.1 and everything["weight_decay"] == 0.0
        assert everything["logging_steps"] == 1 and everything["saves_per_epoch"] == 1
        assert everything["attn_implementation"] == c.model.attn_implementation == "sdpa"  # the measured attention
        assert everything["special_tokens"] == {"pad_token": "<|end_of_text|>"}
    assert [r["bnb"]["bnb_4bit_compute_dtype"] for r in results] == [
        "float16", "float32", "bfloat16", "bfloat16", "float16"
    ]  # fmt: skip


#: LLaMA-Factory's on-the-fly QLoRA example (Qwen3-4B, rank 8 with lora_alpha left to its default 2 x rank, every
#: linear layer, batch 1 x 8 accumulation, 2048 tokens, bf16, its optimizer and checkpointing at their defaults).
LLAMA_FACTORY_USER = "llamafactory_qwen3_lora_sft_otfq.yaml"


def _llama_factory_files(study_dir, tmp_path, tiny_model, numbers):
    files, written = [], {}
    for n in numbers:
        path = _user_file(LLAMA_FACTORY_USER, tmp_path / f"lf{n}", {"model_name_or_path": str(tiny_model)})
        _, _, written[n] = _onto(study_dir, n, path, "llama-factory")
        files.append(path)
    return files, written


@pytest.mark.network
def test_llama_factory_reads_the_trials_measured_keys_off_its_own_example_written_onto(
    llama_factory, study_dir, tmp_path, tiny_model
):
    """Trials 6 (float16, fp4, no double quant) and 8 (bfloat16, learning rate 1e-05) --onto LLaMA-Factory's
    published QLoRA example: 0.9.5's get_train_args accepts each file, and its arguments and the
    BitsAndBytesConfig its loader builds hold the trial's measured values; the user's other keys come through. The
    float32 trial 7 is refused with the fix, the file untouched."""
    numbers = [6, 8]
    _llama_factory_parses(llama_factory, study_dir, tmp_path, tiny_model, numbers)
    # float32 compute: LLaMA-Factory cannot express it; the file is left as it was
    path = _user_file(LLAMA_FACTORY_USER, tmp_path / "lf7", {"model_name_or_path": str(tiny_model)})
    before = path.read_text()
    out = run_cli("export", "rep", "--trial", "7", "--onto", str(path), cwd=study_dir)
    assert out.returncode != 0 and "float32" in out.stderr and "--trial 6" in out.stderr, out.stderr
    assert path.read_text() == before and not Path(f"{path}.orig").exists()


@pytest.mark.network
def test_llama_factory_reads_a_packed_trial_written_onto_its_example(llama_factory, study_dir, tmp_path, tiny_model):
    """Trial 10 (trial 6 packed) --onto LLaMA-Factory's example :
    get_train_args accepts the file, and packs with neat_packing, at cutoff_len - 1, with the trial's other values."""
    _llama_factory_parses(llama_factory, study_dir, tmp_path, tiny_model, [PACKED])


def _llama_factory_parses(llama_factory, study_dir, tmp_path, tiny_model, numbers):
    """``numbers`` --onto LLaMA-Factory's example, parsed by get_train_args: the trial's measured values and the
    user's other keys come out of it."""
    files, written = _llama_factory_files(study_dir, tmp_path, tiny_model, numbers)
    results = _run(llama_factory, "llama-factory", LLAMA_FACTORY_ADDS, files, tmp_path)
    for n, got in zip(numbers, results):
        assert written[n] <= WRITABLE["llama-factory"], (n, written[n] - WRITABLE["llama-factory"])
        trial, s, m = _measured(study_dir, n, "llama-factory")
        c, everything = trial.config, got["all"]
        packing = c.packing
        # quantization and compute dtype
        assert got["quantization_method"] == "bnb" and got["quantization_bit"] == 4, n
        assert got["quantization_type"] == c.bnb_4bit_quant_type == m["bnb_4bit_quant_type"], n
        assert got["double_quantization"] is c.bnb_4bit_use_double_quant, n
        assert got["compute_dtype"] == c.bnb_4bit_compute_dtype == m["bnb_4bit_compute_dtype"], n
        assert got["bnb"]["bnb_4bit_compute_dtype"] == c.bnb_4bit_compute_dtype, n
        assert got["bnb"]["bnb_4bit_quant_type"] == c.bnb_4bit_quant_type, n
        assert got["bnb"]["bnb_4bit_use_double_quant"] is c.bnb_4bit_use_double_quant, n
        assert got["bf16"] is (c.bnb_4bit_compute_dtype == "bfloat16") and got["fp16"] is (
            c.bnb_4bit_compute_dtype == "float16"
        ), n
        # LoRA
        assert got["lora_rank"] == c.r and got["lora_alpha"] == trial.lora_alpha == m["lora_alpha"], n
        assert got["lora_target"] == list(c.target_modules) and got["lora_dropout"] == c.lora_dropout, n
        # batch
        assert got["per_device_train_batch_size"] == c.per_device_train_batch_size, n
        assert got["gradient_accumulation_steps"] == s.training.gradient_accumulation_steps, n
        assert got["per_device_train_batch_size"] * got["gradient_accumulation_steps"] == s.effective_batch_size
        # length (LLaMA-Factory packs rows of cutoff_len - 1), packing without cross-attention
        assert got["cutoff_len"] == c.max_seq_length - (1 if packing else 0), n
        assert got["packing"] is got["neat_packing"] is got["block_diag_attn"] is packing, n
        # optimizer, checkpointing, clipping, learning rate
        assert got["optim"] == c.optim and got["disable_gradient_checkpointing"] is not c.gradient_checkpointing, n
        assert got["max_grad_norm"] == c.max_grad_norm, n
        assert got["learning_rate"] == m["learning_rate"] <= c.learning_rate, n
        # the user's other keys, as LLaMA-Factory parsed them
        assert got["model_name_or_path"] == str(tiny_model) and got["stage"] == "sft" and got["do_train"] is True
        assert got["finetuning_type"] == "lora" and got["dataset"] == ["identity", "alpaca_en_demo"]
        assert got["template"] == "qwen3_nothink" and got["output_dir"] == "saves/qwen3-4b/lora/sft"
        assert everything["model"]["trust_remote_code"] is True
        assert everything["data"]["max_samples"] == 1000 and everything["data"]["preprocessing_num_workers"] == 16
        t = everything["training"]
        assert t["num_train_epochs"] == 3.0 and t["lr_scheduler_type"] == "cosine" and t["warmup_ratio"] == 0.1
        assert t["logging_steps"] == 10 and t["save_steps"] == 500 and t["ddp_timeout"] == 180000000
        assert t["dataloader_num_workers"] == 4 and t["report_to"] in ([], "none", ["none"]), t["report_to"]
        assert everything["finetuning"]["plot_loss"] is True


@pytest.mark.network
def test_llama_factory_reads_the_trials_lora_alpha_where_the_file_left_it_to_the_rank(
    llama_factory, study_dir, tmp_path, tiny_model
):
    """Trial 9 (r 16, lora_alpha 16) --onto LLaMA-Factory's example, whose lora_alpha is left to its default (2 x
    lora_rank, the file's 8): LLaMA-Factory must read the trial's lora_alpha, 16, with its rank, 16."""
    files, written = _llama_factory_files(study_dir, tmp_path, tiny_model, [9])
    [got] = _run(llama_factory, "llama-factory", LLAMA_FACTORY_ADDS, files, tmp_path)
    trial, _, m = _measured(study_dir, 9, "llama-factory")
    assert got["lora_rank"] == trial.config.r == 16
    assert got["lora_alpha"] == trial.lora_alpha == m["lora_alpha"] == 16, (got["lora_alpha"], written[9])


def test_a_packed_trial_goes_onto_a_file_of_a_tool_that_packs_without_format(study_dir, tmp_path, tiny_model):
    """axolotl and LLaMA-Factory pack; --onto must write the packed trial 10 onto their files without --format."""
    for source, key in ((AXOLOTL_USER, "base_model"), (LLAMA_FACTORY_USER, "model_name_or_path")):
        path = _user_file(source, tmp_path / source, {key: str(tiny_model)})
        out = run_cli("export", "rep", "--trial", "10", "--onto", str(path), cwd=study_dir)
        assert out.returncode == 0, out.stderr


@pytest.mark.network
def test_axolotl_is_given_no_fractional_lora_alpha_onto_its_file(axolotl, study_dir, tmp_path, tiny_model):
    """Trial 11's lora_alpha (2.4) onto axolotl's example: either --onto refuses it as --format axolotl does (and
    leaves the file), or axolotl accepts what it wrote."""
    path = _user_file(AXOLOTL_USER, tmp_path / "ax11", {"base_model": str(tiny_model)})
    before = path.read_text()
    out = run_cli("export", "rep", "--trial", "11", "--onto", str(path), cwd=study_dir)
    if out.returncode != 0:
        assert "lora_alpha 2.4" in out.stderr and "not a whole number" in out.stderr, out.stderr
        assert path.read_text() == before
        return
    [got] = _run(axolotl, "axolotl", {}, [path], tmp_path)  # asserts that axolotl accepts the file
    assert got["normalized"]["lora_alpha"] == 2.4
