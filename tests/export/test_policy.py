"""The ``policy`` export (issue 58): a frozen policy module and a pytest guard beside it, run here as a user's CI runs
them: the guard passes on the policy's own fields and on the axolotl and LLaMA-Factory exports of the same trial, and
each one-field edit of a production config out of the measured envelope fails exactly its check, with the measured
figure in its message."""

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


@pytest.fixture
def exported(workdir, tiny_model):
    """``rep`` (:func:`make_study`) with a trial well below its edge (#6: batch 2 x 64, margin 50x), exported as
    policy, axolotl and LLaMA-Factory; returns the folder."""
    make_study(workdir, model=str(tiny_model))
    (workdir / "studies").mkdir(exist_ok=True)
    os.replace(workdir / "rep.db", workdir / "studies" / "rep.db")
    study = optuna.load_study(study_name="rep", storage="sqlite:///studies/rep.db")
    add_trial(study, r=8, batch=2, seq=64, status="complete", peak=1.4, instability=0.02, model=str(tiny_model))
    for fmt in ("policy", "axolotl", "llama-factory"):
        out = run_cli("export", "rep", "--trial", "6", "--format", fmt, "-o", "out/", cwd=workdir)
        assert out.returncode == 0, out.stderr
    return workdir / "out"


def _guard(folder: Path, production: Path | None = None) -> dict[str, str]:
    """Run the guard as a user's CI does; each test's outcome by name (``passed``, ``failed``, ``skipped``) and the
    failures' messages under ``"messages"``."""
    env = {k: v for k, v in os.environ.items() if k != "SWEEPER_PRODUCTION_CONFIG"}
    if production is not None:
        env["SWEEPER_PRODUCTION_CONFIG"] = str(production)
    report = folder / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(folder / "trial6-policy_test.py"),
         "--tb=line"],
        capture_output=True, text=True, cwd=folder, env=env, timeout=120,
    )  # fmt: skip
    outcomes = {}
    for line in out.stdout.splitlines():
        for word in ("PASSED", "FAILED", "SKIPPED"):
            if "::" in line and f" {word}" in line:
                outcomes[line.split("::", 1)[1].split(" ")[0]] = word.lower()
    report.write_text(out.stdout)
    outcomes["messages"] = out.stdout
    return outcomes


def _failed(outcomes: dict[str, str]) -> list[str]:
    return sorted(name for name, what in outcomes.items() if what == "failed")


@pytest.mark.slow
def test_the_policy_guard_passes_the_measured_config_and_fails_each_step_out_of_the_envelope(exported):
    module = (exported / "trial6-policy.py").read_text()
    assert "import torch" not in module.split("class Policy")[0]  # the standard library at import
    policy = _guard(exported)
    assert _failed(policy) == [] and policy["test_the_model_loads_in_4bit"] == "skipped", policy["messages"]
    # The same trial's axolotl and LLaMA-Factory exports, as the production files they are, pass the same checks.
    for name in ("trial6-axolotl.yaml", "trial6-llama-factory.yaml"):
        assert _failed(_guard(exported, exported / name)) == [], name
    # One field at a time out of the envelope: exactly its check fails, its message saying what was measured.
    flat = json.loads(subprocess.run(
        [sys.executable, "-c", "import importlib.util, json, sys; s = importlib.util.spec_from_file_location('p', "
         f"{str(exported / 'trial6-policy.py')!r}); m = importlib.util.module_from_spec(s); sys.modules['p'] = m; "
         "s.loader.exec_module(m); print(json.dumps(m.POLICY.as_flat()))"],
        capture_output=True, text=True, check=True,
    ).stdout)  # fmt: skip
    envelope_seq = 128  # rep's largest max_seq_length that fit at batch 2 (trial 2, 2 x 128)
    edits = {
        "test_the_batch_is_the_measured_one": ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4},
                                              "per_device_train_batch_size 4 > 2: the measured envelope is batch 2 x "
                                              "128 tokens at most; batch 4 x 128 ran out of memory (3.9 GiB)"),
        "test_max_seq_length_is_within_what_fit_at_this_batch": ({"max_seq_length": 2 * envelope_seq},
                                                                 "max_seq_length 256 > 128: the longest measured to "
                                                                 "fit at batch 2"),
        "test_learning_rate_is_at_most_the_safe_rate": ({"learning_rate": 1.0}, "learning_rate 1 > "),
        "test_4bit_loading_is_on_as_measured": ({"load_in_4bit": False}, "load_in_4bit is off"),
        "test_quantization_is_as_measured[bnb_4bit_compute_dtype]": ({"bnb_4bit_compute_dtype": "float16"},
                                                                     "bnb_4bit_compute_dtype float16 != bfloat16"),
    }  # fmt: skip
    for check, (edit, said) in edits.items():
        production = exported / "production.json"
        production.write_text(json.dumps({**flat, **edit}))
        outcomes = _guard(exported, production)
        assert _failed(outcomes) == [check], (check, _failed(outcomes), outcomes["messages"][-3000:])
        assert said in outcomes["messages"], (said, outcomes["messages"][-3000:])
    # And in the real production file: the axolotl YAML with its micro_batch_size doubled (accumulation halved).
    axolotl = yaml.safe_load((exported / "trial6-axolotl.yaml").read_text())
    axolotl.update(micro_batch_size=4, gradient_accumulation_steps=axolotl["gradient_accumulation_steps"] // 2)
    (exported / "production.yaml").write_text(yaml.safe_dump(axolotl))
    assert _failed(_guard(exported, exported / "production.yaml")) == ["test_the_batch_is_the_measured_one"]
