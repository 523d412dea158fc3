"""The round trip of issue 67: the user's own axolotl config (axolotl's published Llama-3 QLoRA example, on the tiny
model) -> ``sweep init --from`` -> ``sweep run`` -> ``sweep export --onto`` the same file: only the keys the trial
measured differ (every other line, comments included, as the user wrote it), and the policy guard passes on it."""

from __future__ import annotations

import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from sweeper.export.production import read_production
from sweeper.testing import run_cli

FIXTURES = Path(__file__).parents[1] / "fixtures" / "production"

#: The keys ``--onto`` may write onto an axolotl file (:func:`sweeper.export.production.written`'s axolotl keys).
MEASURED_KEYS = {
    "load_in_4bit", "load_in_8bit", "bnb_config_kwargs", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
    "bnb_4bit_compute_dtype", "bf16", "fp16", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    "lora_target_linear", "micro_batch_size", "gradient_accumulation_steps", "learning_rate", "optimizer",
    "gradient_checkpointing", "max_grad_norm", "sequence_len", "sample_packing", "pad_to_sequence_len",
    "attn_implementation", "flash_attention", "sdp_attention",
}  # fmt: skip


def _user_file(folder: Path, model: Path) -> Path:
    """axolotl's examples/llama-3/qlora.yml as a user adapts it to a small run: the tiny model, 64 tokens, no
    packing, r 8, AdamW; its comments and every other key as published."""
    text = (FIXTURES / "axolotl_llama3-8b_qlora.yaml").read_text()
    for pattern, replacement in (
        (r"(?m)^base_model: .*$", f"base_model: {model}"),
        (r"(?m)^sequence_len: .*$", "sequence_len: 64"),
        (r"(?m)^sample_packing: .*$", "sample_packing: false"),
        (r"(?m)^lora_r: .*$", "lora_r: 8"),
        (r"(?m)^lora_alpha: .*$", "lora_alpha: 16"),
        (r"(?m)^optimizer: .*$", "optimizer: adamw_torch"),
    ):
        text, found = re.subn(pattern, replacement, text)
        assert found == 1, pattern
    path = folder / "qlora.yml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_init_run_and_export_onto_the_users_file_changes_only_the_measured_keys(workdir, tiny_model):
    user = _user_file(workdir, tiny_model)
    before = user.read_text()
    out = run_cli("init", "--from", str(user), "-o", "space.yaml")
    assert out.returncode == 0, out.stderr
    sets = [
        "--set", "dataset.path=builtin:pydoc-topics", "--set", "dataset.format=auto", "--set",
        "model.attn_implementation=sdpa", "--set", "training.memory_limit_gib=4", "--set", "training.max_steps=3",
        "--set", "study.sampler=random", "--set", "dataset.max_samples=32", "--set", "bnb_4bit_compute_dtype=float32",
    ]  # fmt: skip
    out = run_cli("run", "space.yaml", "--n-trials", "2", *sets)
    assert out.returncode == 0, out.stderr
    study = optuna.load_study(study_name="qlora", storage="sqlite:///studies/qlora.db")
    trial = next(t.number for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE)
    out = run_cli("export", "qlora", "--trial", str(trial), "--onto", str(user))
    assert out.returncode == 0, out.stderr
    after = user.read_text()
    assert (workdir / "qlora.yml.orig").read_text() == before  # the original kept
    changed = [
        line[1:] for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]  # fmt: skip
    for line in changed:
        if line.startswith("#"):
            assert line.startswith("# sweeper --onto:") or line.startswith("# Keys written"), line
            continue
        key = line.strip().split(":", 1)[0]
        assert key in MEASURED_KEYS, line
    kept = [line for line in before.splitlines() if line.startswith("#")]
    assert all(line in after for line in kept)  # the user's comments, as written
    assert yaml.safe_load(after)["base_model"] == str(tiny_model)
    reading = read_production(user)
    assert reading.settings["gradient_accumulation_steps"] * reading.settings["per_device_train_batch_size"] == 8
    # The guard of the same trial passes on the file as written back.
    out = run_cli("export", "qlora", "--trial", str(trial), "--format", "policy", "-o", "guard/")
    assert out.returncode == 0, out.stderr
    guard = next((workdir / "guard").glob("*_test.py"))
    env = {**os.environ, "SWEEPER_PRODUCTION_CONFIG": str(user)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(guard)],
        capture_output=True, text=True, cwd=workdir, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    # A second --onto of the same trial changes nothing but its header.
    again = run_cli("export", "qlora", "--trial", str(trial), "--onto", str(user))
    assert again.returncode == 0 and "no key changed" in again.stdout, again.stdout
