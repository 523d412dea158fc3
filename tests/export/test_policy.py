"""The ``policy`` export (issues 58 and 67): a frozen policy module, its pytest guard and the production config reader
beside them, run here as a user's CI runs them. The guard passes on the same trial's axolotl, LLaMA-Factory and json
exports; each edit of a real production file out of what was measured (in the file's own keys, a deleted key being
its tool's default) fails exactly its check, naming the file's key and the measured figure; without a production
file nothing is said to be checked; a file it cannot read is one line; a hand-edited policy fails its seal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from sweeper.testing import run_cli
from sweeper.testing._studies import add_trial, make_study

#: rep's trial 7: r 16, batch 2, max_seq_length 128 on rows of at most 55 tokens (its worst-case step's shape).
_LONG = {"worst_case_shape": [2, 55]}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model):
    """``rep`` (:func:`make_study`) with a trial well below its edge (#6: r 8, batch 2 x 64, margin 50x) and one at
    least as large that fit at max_seq_length 128 on rows of 55 tokens (#7), exported as policy, axolotl, json and
    LLaMA-Factory; returns the folder."""
    workdir = tmp_path_factory.mktemp("policy")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(workdir)
        patch.setenv("SWEEPER_CACHE", str(workdir / "cache"))
        make_study(workdir, model=str(tiny_model))
        (workdir / "studies").mkdir(exist_ok=True)
        os.replace(workdir / "rep.db", workdir / "studies" / "rep.db")
        study = optuna.load_study(study_name="rep", storage="sqlite:///studies/rep.db")
        add_trial(study, r=8, batch=2, seq=64, status="complete", peak=1.4, instability=0.02, model=str(tiny_model))
        add_trial(study, r=16, batch=2, seq=128, status="complete", peak=1.6, instability=0.5,
                  model=str(tiny_model), extra=_LONG)  # fmt: skip
        for fmt in ("policy", "axolotl", "llama-factory", "json"):
            out = run_cli("export", "rep", "--trial", "6", "--format", fmt, "-o", "out/", cwd=workdir)
            assert out.returncode == 0, out.stderr
    return workdir / "out"


def _guard(folder: Path, production: Path | None = None) -> dict[str, str]:
    """Run the guard as a user's CI does; each test's outcome by name (``passed``, ``failed``, ``skipped``), the
    output under ``"messages"`` and the exit code under ``"rc"``."""
    env = {k: v for k, v in os.environ.items() if k != "SWEEPER_PRODUCTION_CONFIG"}
    if production is not None:
        env["SWEEPER_PRODUCTION_CONFIG"] = str(production)
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-rsw", "-p", "no:cacheprovider", str(folder / "trial6-policy_test.py"),
         "--tb=line"],
        capture_output=True, text=True, cwd=folder, env=env, timeout=120,
    )  # fmt: skip
    outcomes = {}
    for line in out.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED"):
            if "::" in line and f" {word}" in line:
                outcomes[line.split("::", 1)[1].split(" ")[0]] = word.lower()
    outcomes["messages"] = out.stdout + out.stderr
    outcomes["rc"] = str(out.returncode)
    return outcomes


def _failed(outcomes: dict[str, str]) -> list[str]:
    return sorted(name for name, what in outcomes.items() if what == "failed")


def _edited(folder: Path, name: str, edit: dict, drop: tuple[str, ...] = ()) -> Path:
    """A copy of the export ``name`` with ``edit``'s keys set and ``drop``'s removed."""
    source = folder / name
    config = yaml.safe_load(source.read_text()) if source.suffix == ".yaml" else json.loads(source.read_text())
    config.update(edit)
    for key in drop:
        config.pop(key)
    path = folder / f"edited{source.suffix}"
    path.write_text(yaml.safe_dump(config) if source.suffix == ".yaml" else json.dumps(config))
    return path


@pytest.mark.slow
def test_the_guard_passes_the_studys_own_exports_and_says_when_production_is_not_checked(exported):
    module = (exported / "trial6-policy.py").read_text()
    assert "import torch" not in module.split("class Policy")[0]  # the standard library at import
    alone = _guard(exported)
    assert _failed(alone) == [] and alone["test_the_policy_is_as_exported"] == "passed", alone["messages"]
    assert "production not checked: SWEEPER_PRODUCTION_CONFIG is unset" in alone["messages"]
    assert alone["test_the_batch_is_the_measured_one"] == "skipped"
    for name in ("trial6-axolotl.yaml", "trial6-llama-factory.yaml", "trial6-json.json"):
        outcomes = _guard(exported, exported / name)
        assert _failed(outcomes) == [] and outcomes["test_the_model_is_the_measured_one"] == "passed", (
            name,
            outcomes["messages"][-3000:],
        )


#: Each edit of the axolotl export, in axolotl's keys: the one check it fails and what its message says.
_AXOLOTL_EDITS = {
    "another model": ({"base_model": "meta-llama/Meta-Llama-3-8B"}, (), ["test_the_model_is_the_measured_one"],
                      "base_model 'meta-llama/Meta-Llama-3-8B' is not the measured model"),
    "r doubled": ({"lora_r": 16}, (), ["test_the_adapter_is_as_measured[r]"],
                  "lora_r 16: the adapter measured has r 8"),
    "lora_alpha 1024": ({"lora_alpha": 1024}, (), ["test_the_adapter_is_as_measured[lora_alpha]"],
                        "lora_alpha 1024: the adapter measured has lora_alpha 16"),
    "all-linear targets": ({"lora_target_linear": True}, (), ["test_the_adapter_is_as_measured[target_modules]"],
                           "lora_target_linear True"),
    "8-bit loading": ({"load_in_4bit": False, "load_in_8bit": True}, (), ["test_4bit_loading_is_on_as_measured"],
                      "load_in_4bit False, load_in_8bit True"),
    "fp16 flag": ({"bf16": False, "fp16": True}, (),
                  ["test_quantization_and_precision_are_as_measured[mixed_precision]"],
                  "fp16 True: the figures were measured at mixed_precision bf16"),
    "checkpointing deleted": ({}, ("gradient_checkpointing",),
                              ["test_memory_moving_settings_are_as_measured[gradient_checkpointing]"],
                              "gradient_checkpointing (unset: axolotl's default False)"),
    "optimizer deleted": ({}, ("optimizer",), ["test_memory_moving_settings_are_as_measured[optim]"],
                          "optimizer (unset: axolotl's default 'adamw_torch_fused')"),
    "batch doubled": ({"micro_batch_size": 4, "gradient_accumulation_steps": 4}, (),
                      ["test_the_batch_is_the_measured_one"],
                      "micro_batch_size 4 > 2: the measured envelope is batch 2 x 128 tokens at most; batch 4 x 128 "
                      "ran out of memory (3.9 GiB)"),
    "rows padded past the measured": ({"sequence_len": 128, "pad_to_sequence_len": True}, (),
                                      ["test_max_seq_length_is_within_what_was_measured"],
                                      "every row is 128 tokens long, but the longest rows measured to fit at batch 2 "
                                      "were 55 tokens"),
    "longer than any fit": ({"sequence_len": 256}, (), ["test_max_seq_length_is_within_what_was_measured"],
                            "sequence_len 256 > 128"),
    "embeddings trained": ({"lora_modules_to_save": ["embed_tokens", "lm_head"]}, (),
                           ["test_nothing_unmeasured_moves_memory"], "lora_modules_to_save: trains embed_tokens"),
}  # fmt: skip


#: The edits of :data:`_AXOLOTL_EDITS` that fail distinct checks, tried together in one file (one guard run): each
#: still fails exactly its own check, with its own message; the rest one at a time.
_TOGETHER = ("r doubled", "lora_alpha 1024", "all-linear targets", "8-bit loading", "fp16 flag",
             "checkpointing deleted", "optimizer deleted", "embeddings trained")  # fmt: skip


@pytest.mark.slow
def test_each_edit_of_a_real_production_file_fails_its_check_in_the_files_own_keys(exported):
    together = [_AXOLOTL_EDITS[what] for what in _TOGETHER]
    groups = [(_TOGETHER, together)] + [((what,), [e]) for what, e in _AXOLOTL_EDITS.items() if what not in _TOGETHER]
    for names, edits in groups:
        edit = {k: v for e in edits for k, v in e[0].items()}
        drop = tuple(k for e in edits for k in e[1])
        outcomes = _guard(exported, _edited(exported, "trial6-axolotl.yaml", edit, drop))
        checks = sorted(check for e in edits for check in e[2])
        assert _failed(outcomes) == checks, (names, _failed(outcomes), outcomes["messages"][-3000:])
        for what, e in zip(names, edits):
            assert e[3] in outcomes["messages"], (what, e[3], outcomes["messages"][-3000:])
    # another model: no figure of the study is said to hold for it
    other = _guard(exported, _edited(exported, "trial6-axolotl.yaml", _AXOLOTL_EDITS["another model"][0]))
    assert other["test_learning_rate_is_at_most_the_safe_rate"] == "skipped"
    assert "no figure for meta-llama/Meta-Llama-3-8B" in other["messages"]
    # LLaMA-Factory's own keys: neat packing, bf16 unset (the GPU then chooses), checkpointing disabled
    for edit, drop, check in (
        ({"packing": True, "neat_packing": True}, (), "test_memory_moving_settings_are_as_measured[packing]"),
        ({}, ("bf16",), "test_quantization_and_precision_are_as_measured[mixed_precision]"),
        ({"disable_gradient_checkpointing": True}, (),
         "test_memory_moving_settings_are_as_measured[gradient_checkpointing]"),
    ):  # fmt: skip
        outcomes = _guard(exported, _edited(exported, "trial6-llama-factory.yaml", edit, drop))
        assert check in _failed(outcomes), (edit, drop, outcomes["messages"][-3000:])
    # a TRL --config YAML at its own batch 8 (TRL's keys: not axolotl's)
    trl = exported / "trl.yaml"
    policy = json.loads((exported / "trial6-json.json").read_text())
    trl.write_text(yaml.safe_dump({
        "model_name_or_path": policy["model"], "load_in_4bit": True, "use_peft": True, "lora_r": 8,
        "lora_alpha": 16, "per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "max_length": 64,
        "learning_rate": 1e-4,
    }))  # fmt: skip
    outcomes = _guard(exported, trl)
    assert "test_the_batch_is_the_measured_one" in _failed(outcomes), outcomes["messages"][-3000:]
    assert "per_device_train_batch_size 8 > 2" in outcomes["messages"]


@pytest.mark.slow
def test_a_file_the_guard_cannot_read_is_one_line_and_a_hand_edited_policy_fails_its_seal(exported):
    for name, text in (("train.py", "x = 1\n"), ("empty.yaml", ""), ("list.yaml", "- 1\n"), ("c.toml", "[a]\n")):
        (exported / name).write_text(text)
        outcomes = _guard(exported, exported / name)
        assert outcomes["rc"] != "0" and "Traceback" not in outcomes["messages"], outcomes["messages"]
        assert f"SWEEPER_PRODUCTION_CONFIG: {exported / name}:" in outcomes["messages"], outcomes["messages"]
    policy = exported / "trial6-policy.py"
    text = policy.read_text()
    try:
        policy.write_text(text.replace("'r': 8,", "'r': 16,"))
        outcomes = _guard(exported, exported / "trial6-axolotl.yaml")
        assert "test_the_policy_is_as_exported" in _failed(outcomes), outcomes["messages"][-2000:]
        assert "was edited since sweep exported it" in outcomes["messages"]
    finally:
        policy.write_text(text)


@pytest.mark.slow
def test_onto_keeps_the_files_own_form_and_refuses_what_it_must_not_write(exported):
    cwd = exported.parent
    # a CRLF file keeps its line ends; only the changed key differs
    text = (exported / "trial6-axolotl.yaml").read_text().replace("lora_r: 8", "lora_r: 16")
    crlf = exported / "crlf.yaml"
    crlf.write_bytes(text.replace("\n", "\r\n").encode())
    out = run_cli("export", "rep", "--trial", "6", "--onto", str(crlf), cwd=cwd)
    assert out.returncode == 0, out.stderr
    written = crlf.read_bytes()
    assert b"lora_r: 8\r\n" in written and b"\n" not in written.replace(b"\r\n", b"")
    assert (exported / "crlf.yaml.orig").read_bytes() == text.replace("\n", "\r\n").encode()
    # the json export's nesting: a keyword deleted from training_args is written back there, its indent kept
    nested = json.loads((exported / "trial6-json.json").read_text())
    del nested["training_args"]["gradient_checkpointing"]
    js = exported / "nested.json"
    js.write_text(json.dumps(nested, indent=4, ensure_ascii=False))
    out = run_cli("export", "rep", "--trial", "6", "--onto", str(js), cwd=cwd)
    assert out.returncode == 0, out.stderr
    back = json.loads(js.read_text())
    assert back["training_args"]["gradient_checkpointing"] is True and "gradient_checkpointing" not in back
    assert js.read_text().startswith('{\n    "')
    # a peft adapter_config and another model's file are refused, the files left as they were
    adapter = exported / "adapter_config.json"
    adapter.write_text(json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "base_model_name_or_path": "m"}))
    other = exported / "other.yaml"
    other.write_text(text.replace("base_model:", "base_model: meta-llama/Meta-Llama-3-8B\n_was:"))
    for path, said in ((adapter, "describes trained weights"), (other, "pass --force")):
        before = path.read_text()
        out = run_cli("export", "rep", "--trial", "6", "--onto", str(path), cwd=cwd)
        assert out.returncode == 2 and said in out.stderr and path.read_text() == before, out.stderr


@pytest.mark.slow
def test_a_trl_config_written_onto_is_what_trls_own_parser_reads_and_the_guard_passes_it(exported):
    """A TRL ``--config`` YAML (the keys of TRL 1.x's ModelConfig, ScriptArguments and SFTConfig), written onto with
    trial 6's measured keys, parsed by ``trl.TrlParser`` as ``trl sft --config`` parses it: TRL reads the trial's
    values; the guard passes the file."""
    trl = pytest.importorskip("trl")
    settings = json.loads((exported / "trial6-json.json").read_text())
    path = exported / "sft.yaml"
    path.write_text(
        f"# the user's TRL recipe\nmodel_name_or_path: {settings['model']}\nload_in_4bit: true\nuse_peft: true\n"
        "lora_r: 32  # was tried first\nlora_alpha: 16\nper_device_train_batch_size: 8\nmax_length: 512\n"
        "learning_rate: 2.0e-4\noutput_dir: out\nuse_cpu: true\n"
    )  # fmt: skip
    out = run_cli("export", "rep", "--trial", "6", "--onto", str(path), cwd=exported.parent)
    assert out.returncode == 0, out.stderr
    assert "# the user's TRL recipe" in path.read_text() and "# was tried first" in path.read_text()
    parser = trl.TrlParser((trl.ScriptArguments, trl.SFTConfig, trl.ModelConfig))
    _, sft, model = parser.parse_args_and_config(["--config", str(path), "--dataset_name", "rows"])
    bnb, lora, args = settings["bnb_config"], settings["lora_config"], settings["training_args"]
    assert (model.lora_r, model.lora_alpha, model.lora_dropout) == (lora["r"], lora["lora_alpha"], lora["lora_dropout"])
    assert sorted(model.lora_target_modules) == sorted(lora["target_modules"])
    assert (model.bnb_4bit_quant_type, model.use_bnb_nested_quant, model.dtype) == (
        bnb["bnb_4bit_quant_type"], bnb["bnb_4bit_use_double_quant"], bnb["bnb_4bit_compute_dtype"]
    )  # fmt: skip
    assert (sft.per_device_train_batch_size, sft.gradient_accumulation_steps) == (
        args["per_device_train_batch_size"], args["gradient_accumulation_steps"]
    )  # fmt: skip
    assert sft.max_length == settings["max_seq_length"] and sft.bf16 is args["bf16"]
    assert str(sft.optim).removeprefix("OptimizerNames.").lower() == args["optim"]
    assert bool(sft.gradient_checkpointing) is args["gradient_checkpointing"]
    assert sft.learning_rate <= args["learning_rate"]
    assert _failed(_guard(exported, path)) == []
