"""The package at its lower bounds, and the ``hf``/``trl`` exports under the older transformers and TRL that the
production stacks pin, each in a venv of its own (``tests/fixtures/stacks/<name>.txt``: pip constraints).

The venv is built once (torch first, pinned, then this package with ``-c`` the constraints) under
``$SWEEPER_STACK_VENVS/<name>`` when that is set, and reused while its constraints are unchanged; else in a temporary
folder (about 90 s with the torch wheel cached). Needs the package registry, not the model hub."""

from __future__ import annotations

import json

import pytest
import yaml

from sweeper.export import pick_trial, write_export
from sweeper.study import snapshot
from sweeper.testing import REPO, STACKS, add_configured_trials, make_study, run_in_venv, stack_venv, tiny_space


@pytest.fixture(scope="module")
def lower_bounds(tmp_path_factory):
    return stack_venv("lower-bounds", tmp_path_factory)


@pytest.mark.network
def test_hf_and_trl_exports_train_under_the_lower_bounds(lower_bounds, tmp_path, tiny_model):
    """transformers 5.3 (before activation_checkpointing, as axolotl's 5.20 and LLaMA-Factory's 5.6) and TRL 1.14.1:
    the hf file's objects train two steps (its collator padding each micro-batch to its longest row), the trl file
    builds its SFTTrainer and trains two steps; so does the trl file of the trial with packing, on packed rows."""
    study = make_study(tmp_path, model=str(tiny_model))
    trial = pick_trial(snapshot(study), pick="knee")
    add_configured_trials(study, tiny_model, [({"packing": True}, 1.2, 0.2)])  # trial 6: the knee, packed
    hf, _ = write_export(snapshot(study), trial, "hf", tmp_path / "hf")
    [trl] = write_export(snapshot(study), trial, "trl", tmp_path / "trl")
    [packed] = write_export(snapshot(study), pick_trial(snapshot(study), number=6), "trl", tmp_path / "trl-packed")
    out = run_in_venv(
        lower_bounds,
        str(REPO / "tests" / "export" / "export_check.py"),
        str(hf),
        str(trl),
        str(tiny_model),
        "run",
        str(packed),
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    pins = dict(line.split("==") for line in (STACKS / "lower-bounds.txt").read_text().split() if "==" in line)
    assert report["versions"]["transformers"] == pins["transformers"] and report["versions"]["trl"] == pins["trl"]
    assert report["hf"]["global_step"] == 2 and report["hf"]["checkpointing"]
    assert report["hf"]["first_batch"] == [2, 25] and report["hf"]["first_batch_padding_labels"] == [-100]
    trl_out = report["trl"]
    assert trl_out["global_step"] == 2 and trl_out["finite"] and trl_out["completion_only_loss"]
    assert trl_out["adapter_dtypes"] == ["torch.float32"] and trl_out["checkpointing"] and not trl_out["packing"]
    packed_out = report["trl_packed"]
    assert packed_out["global_step"] == 2 and packed_out["finite"] and packed_out["packing"]
    assert packed_out["packing_strategy"] == "bfd" and packed_out["padding_free"]
    assert packed_out["samples_in_batch"] > 2 and packed_out["position_starts"] == packed_out["samples_in_batch"]
    assert "attention_mask" not in packed_out["batch_keys"]


@pytest.mark.network
def test_a_sweep_runs_at_the_lower_bounds(lower_bounds, tmp_path, tiny_model):
    """The package's own lower bounds (pyproject.toml): two real trials (bfloat16 and float32) and the report."""
    space = tiny_space(tiny_model, name="low", search={"bnb_4bit_compute_dtype": ["bfloat16", "float32"]})
    space["training"]["gradient_checkpointing"] = True
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    env = {"SWEEPER_CACHE": str(tmp_path / "cache")}
    run = run_in_venv(lower_bounds, "-m", "sweeper.cli", "run", "space.yaml", cwd=tmp_path, **env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "trials: complete 2" in run.stdout, run.stdout[-2000:]
    report = run_in_venv(lower_bounds, "-m", "sweeper.cli", "report", "low", "--json", cwd=tmp_path, **env)
    assert report.returncode == 0 and len(json.loads(report.stdout)["front"]) >= 1, report.stderr[-2000:]
