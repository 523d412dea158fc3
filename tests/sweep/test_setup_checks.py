"""Setup errors that would fail every trial the same way are found once, before the first trial: ``sweep run`` and
``sweep trial`` exit 2 with one line (file, key, fix). No trial runs in these tests."""

import json
import shutil

import pytest

from sweeper.checkpoint import module_names, safetensors_names, unmatched_targets
from sweeper.memory import nothing_fits
from sweeper.space import load_space
from sweeper.sweep import check_setup
from sweeper.testing import run_cli, tiny_space, write_space


def _one_line(out) -> str:
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr and "[ 1/" not in out.stdout  # refused before any trial
    return lines[0]


def test_module_names_come_from_the_safetensors_header(tiny_model):
    names = safetensors_names(tiny_model / "model.safetensors")
    assert "model.layers.0.self_attn.q_proj.weight" in names
    modules = module_names(str(tiny_model))
    assert "model.layers.1.mlp.down_proj" in modules and "lm_head" in modules
    # peft's rule for a list: the name, or a suffix after a dot
    assert unmatched_targets(["q_proj", "self_attn.v_proj", "v_projj", "proj", "lm_head"], modules) == [
        "v_projj",
        "proj",
    ]


def test_sharded_index_is_read_and_a_missing_shard_is_refused(tiny_model, tmp_path):
    model = tmp_path / "sharded"
    shutil.copytree(tiny_model, model)
    names = safetensors_names(model / "model.safetensors")
    (model / "model.safetensors").rename(model / "model-00001-of-00002.safetensors")
    weight_map = dict.fromkeys(names, "model-00001-of-00002.safetensors")
    weight_map["model.layers.9.self_attn.q_proj.weight"] = "model-00002-of-00002.safetensors"
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert "model.layers.9.self_attn.q_proj" in module_names(str(model))
    space = load_space(write_space(tmp_path, tiny_space(model)))
    [problem] = check_setup(space, str(model))
    assert "model.name_or_path: 1 of 2 weight shards are missing (model-00002-of-00002.safetensors)" in problem


@pytest.mark.parametrize("command", ["run", "trial"])
def test_a_target_module_that_matches_nothing_is_refused_before_the_first_trial(tiny_model, workdir, command):
    space = write_space(workdir, tiny_space(tiny_model, training={"target_modules": ["q_proj", "v_projj"]}))
    line = _one_line(run_cli(command, str(space), cwd=workdir))
    assert line.startswith(f"{space}: training.target_modules: 'v_projj' matches no module of {tiny_model}")
    assert "the model's modules: down_proj, embed_tokens, gate_proj," in line and "fix the name" in line
    assert not (workdir / "studies" / "t" / "trials").exists()


def test_a_model_folder_without_weights_is_refused_once(tiny_model, workdir):
    folder = workdir / "no-weights"
    folder.mkdir()
    for f in tiny_model.glob("*.json"):
        shutil.copy(f, folder / f.name)
    space = write_space(workdir, tiny_space(folder))
    line = _one_line(run_cli("run", str(space), cwd=workdir))
    assert line.startswith(f"{folder}: model.name_or_path: no weights in this folder")
    assert "give the folder that save_pretrained wrote with its weights" in line


def test_a_corrupt_safetensors_file_is_refused_once(tiny_model, workdir):
    folder = workdir / "corrupt"
    shutil.copytree(tiny_model, folder)
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)  # a header length far beyond the file
    space = write_space(workdir, tiny_space(folder))
    line = _one_line(run_cli("run", str(space), cwd=workdir))
    assert line.startswith(f"{folder / 'model.safetensors'}: model.name_or_path: not a readable safetensors file")
    assert "copy or download the file again" in line


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="flash-attn may be installed on a GPU machine")
def test_flash_attention_without_the_package_is_refused_once(tiny_model, workdir):
    space = tiny_space(tiny_model)
    space["model"]["attn_implementation"] = "flash_attention_2"
    path = write_space(workdir, space)
    line = _one_line(run_cli("trial", str(path), cwd=workdir))
    assert line == (
        f"{path}: model.attn_implementation: flash_attention_2 needs the flash-attn package, which is not installed "
        "here; install it (pip install flash-attn, on a CUDA machine) or use sdpa"
    )


def test_flash_attention_with_packing_above_batch_1_is_refused(tiny_model, workdir):
    # transformers 5.25 reads packed position ids for flash attention only at batch 1: at batch 2 each packed row's
    # samples would attend to each other (issue 55). Refused before anything else about flash attention is asked;
    # packing at batch 1, and sdpa at any batch, are not.
    from sweeper.sweep._setup_checks import check_attention

    space = tiny_space(tiny_model, search={"per_device_train_batch_size": [1, 2]})
    space["model"]["attn_implementation"] = "flash_attention_2"
    space["training"]["packing"] = True
    path = write_space(workdir, space)
    line = _one_line(run_cli("trial", str(path), cwd=workdir))
    assert line.startswith(f"{path}: model.attn_implementation: flash_attention_2 with packing: true ") and (
        "at batch 2 each row's samples would attend to each other" in line
    ), line
    assert check_attention(load_space(path)) == [line]
    space["search"] = {"r": [4, 8]}
    space["training"]["per_device_train_batch_size"] = 1
    assert "with packing" not in " ".join(check_attention(load_space(write_space(workdir, space))))
    space["model"]["attn_implementation"] = "sdpa"
    space["search"] = {"per_device_train_batch_size": [1, 2]}
    del space["training"]["per_device_train_batch_size"]
    assert check_attention(load_space(write_space(workdir, space))) == []


def test_a_checkpoint_with_its_own_quantization_config_names_what_it_forces(tiny_model, workdir):
    model = workdir / "prequantized"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "bitsandbytes",
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    (model / "config.json").write_text(json.dumps(config))
    searched = tiny_space(model, search={"bnb_4bit_quant_type": ["nf4", "fp4"]})
    line = _one_line(run_cli("run", str(write_space(workdir, searched)), cwd=workdir))
    assert line.startswith(f"{model / 'config.json'}: quantization_config: the checkpoint is already 4-bit")
    assert "force bnb_4bit_quant_type=nf4, bnb_4bit_use_double_quant=true, bnb_4bit_compute_dtype=bfloat16" in line
    assert "the searched bnb_4bit_quant_type cannot take effect" in line
    # the same values, fixed: nothing is overridden, nothing to refuse
    same = tiny_space(
        model,
        training={
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16",
        },
    )
    assert check_setup(load_space(write_space(workdir, same, "same.yaml")), str(model)) == []
    # another method: no 4-bit key can take effect
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (model / "config.json").write_text(json.dumps(config))
    [problem] = check_setup(load_space(write_space(workdir, same, "same.yaml")), str(model))
    assert "already quantized (quant_method=gptq, bits=4)" in problem and "cannot take effect" in problem


@pytest.mark.slow
def test_nothing_predicted_to_fit_is_one_line_whose_advice_holds(tiny_model, workdir):
    """Runs the smallest configuration twice (about 40 s): once for the advice (measured, two uncapped steps), once
    at the cap the advice names. The advice of the model alone (0.48 GiB here) ran out of memory at that cap: on the
    CPU the trial process's own resident memory is 0.51 GiB while loading the tiny model."""
    import json
    import re

    space = tiny_space(
        tiny_model,
        search={"per_device_train_batch_size": [4, 8], "max_seq_length": [512, 1024]},
        training={"memory_limit_gib": 0.3, "optim": "adamw_torch", "gradient_checkpointing": False},
    )
    del space["training"]["max_seq_length"]
    path = write_space(workdir, space)
    out = run_cli("run", str(path), cwd=workdir)
    line = _one_line(out)
    assert "measuring the smallest configuration once" in out.stdout
    assert line.startswith(f"{path}: training.memory_limit_gib: no configuration of the space is predicted to fit 0.3")
    assert "the smallest predicted peak is" in line and "per_device_train_batch_size=4 max_seq_length=512" in line
    assert "measured here, it peaked at" in line
    # loading alone exceeds 0.3 GiB on the CPU: no single setting brings it under
    cap = re.search(r"raise memory_limit_gib to ([0-9.]+) or more", line)
    assert cap is not None, line
    # the refused run leaves no study behind: no database, no study folder (sweep report would list an empty one)
    assert not (workdir / "studies" / "t.db").exists() and not (workdir / "studies" / "t").exists()
    # following the advice: the smallest configuration fits
    sets = ["per_device_train_batch_size=4", "max_seq_length=512", f"memory_limit_gib={cap.group(1)}", "max_steps=2"]
    followed = run_cli("trial", str(path), *[a for s in sets for a in ("--set", s)], "--json", cwd=workdir)
    assert followed.returncode == 0, followed.stderr
    result = json.loads(followed.stdout)
    assert result["status"] == "complete", result["reason"]


def test_a_hopeless_cap_is_refused_from_the_model_without_measuring(tiny_model, workdir):
    """At max_seq_length 1048576 the smallest configuration was predicted at hundreds of GiB: it was "measured"
    uncapped (38 s, with a false reason: "the cap is within the CPU memory model's error") and the measurement failed
    without a word (issue 48). Now nothing runs: the line says why, and the advice is the model's. Packed (rows of
    max_seq_length: padded, the data's short rows would set the step, and it would fit), at batch 1 (the data packs
    into one row of that length: a batch of 2 is refused for that first, issue 55). A packed row holds at most the
    data's tokens (issue 55): the whole built-in corpus in one row, 232,236 tokens, is predicted at 3.2 GiB with
    sdpa (measurable: it would be measured once for the advice) and at 2,414 GiB with eager attention's scores."""
    import time

    space = tiny_space(
        tiny_model,
        search={"r": [4, 8]},
        training={
            "memory_limit_gib": 2.5, "max_seq_length": 1048576, "gradient_checkpointing": False, "packing": True,
            "per_device_train_batch_size": 1,
        },
    )  # fmt: skip
    space["model"]["attn_implementation"] = "eager"
    path = write_space(workdir, space)
    start = time.monotonic()
    out = run_cli("run", str(path), cwd=workdir)
    line = _one_line(out)
    assert time.monotonic() - start < 30  # no trial process was started to measure it
    assert "within the CPU memory model's error" not in out.stdout, out.stdout
    assert "not measured, the advice below is the memory model's" in out.stdout, out.stdout
    assert "no configuration of the space is predicted to fit 2.5" in line and "measured here" not in line
    assert not (workdir / "studies" / "t.db").exists()


@pytest.mark.slow
def test_a_fit_under_a_larger_cap_does_not_hide_that_nothing_fits_the_new_one(tiny_model, workdir):
    """Resumed with a smaller memory_limit_gib, a study whose trial fit the old cap still gets the one line; a run
    that starts nothing leaves sweep_starts (the seed offset of later runs) as it was; a resume under another cap
    says which trials were measured under which."""
    import optuna

    space = tiny_space(tiny_model, n_trials=1, search={"per_device_train_batch_size": [4, 8]})
    path = write_space(workdir, space)
    first = run_cli("run", str(path), cwd=workdir)
    assert first.returncode == 0, first.stderr
    line = _one_line(run_cli("run", str(path), "--n-trials", "2", "--set", "memory_limit_gib=0.3", cwd=workdir))
    assert "no configuration of the space is predicted to fit 0.3" in line
    again = run_cli("run", str(path), cwd=workdir)  # n_trials 1: already there
    assert again.returncode == 0 and "nothing to run" in again.stdout
    larger = run_cli("run", str(path), "--n-trials", "2", "--set", "memory_limit_gib=3", cwd=workdir)
    assert larger.returncode == 0, larger.stderr
    assert "note    memory_limit_gib is 3 now; 1 trial was measured under memory_limit_gib 4" in larger.stdout
    study = optuna.load_study(study_name=space["study"]["name"], storage="sqlite:///studies/t.db")
    assert study.user_attrs["sweep_starts"] == 2  # the refused run and the one with nothing to run did not count
    # report and export compare the trials of the current cap; the other cap's trial stays in the tables
    import json

    report = json.loads(run_cli("report", "t", "--json", cwd=workdir).stdout)
    assert {f["number"] for f in report["front"]} <= {1} and len(report["trials"]) == 2
    assert "memory_limit_gib 4 (now 3)" in report["other_setups"]


def test_nothing_fits_names_the_cheapest_setting(tiny_model, tmp_path):
    space = load_space(
        write_space(
            tmp_path,
            tiny_space(
                tiny_model,
                search={"per_device_train_batch_size": [4, 8]},
                training={"memory_limit_gib": 1.0, "gradient_checkpointing": False, "max_seq_length": 512},
            ),
        )
    )

    def predict(config):  # a made-up model: checkpointing halves the peak, batch adds
        return (0.6 + 0.2 * config.per_device_train_batch_size) * (0.5 if config.gradient_checkpointing else 1)

    line = nothing_fits(space, predict)
    assert "the smallest predicted peak is 1.40 GiB (per_device_train_batch_size=4 max_seq_length=512)" in line
    assert "the cheapest setting to change: gradient_checkpointing: true (0.70 GiB)" in line
    assert nothing_fits(space, predict, known_fit=True) is None
    assert nothing_fits(space, lambda c: 0.5) is None
    # Checkpointing on gives 1.05 GiB, within the margin of the 1.0 cap only: no advice; the cap named fits the peak.
    line = nothing_fits(space, lambda c: 1.05 if c.gradient_checkpointing else 1.5)
    assert "the cheapest setting to change" not in line and "raise memory_limit_gib to 1.50 or more" in line


@pytest.mark.slow
def test_on_the_cpu_a_cap_the_model_alone_would_pass_is_measured_before_any_trial(tiny_model, workdir):
    """Runs the smallest configuration once (about 15 s). A cap at the memory model's own prediction passes its
    preflight (within the 10% margin), but the CPU trial process's resident memory is larger than the model's constant:
    every trial ran out of memory (issue 30: 0.66 GiB predicted, 1.1 measured on the built-in model). Now the cap is
    checked against one measured step first, and the run is refused with one line instead of running trials that
    cannot fit; at a cap that fits, the measurement is the preflight's correction until a trial completes."""
    import optuna

    from sweeper.memory import memory_predictor, smallest_predicted

    space = tiny_space(
        tiny_model,
        n_trials=1,
        search={"per_device_train_batch_size": [1, 2]},
        training={"max_seq_length": 64, "max_steps": 2},
    )
    path = write_space(workdir, space)
    loaded = load_space(path)
    raw = memory_predictor(str(tiny_model), loaded.model.name_or_path, loaded.model.attn_implementation, "cpu")
    predicted, _ = smallest_predicted(loaded, raw)
    cap = f"memory_limit_gib={predicted:.3f}"  # the model alone says the smallest configuration fits
    out = run_cli("run", str(path), "--set", cap, cwd=workdir)
    line = _one_line(out)
    assert "the cap is within the CPU memory model's error" in out.stdout, out.stdout
    assert "no configuration of the space is predicted to fit" in line and "measured here, it peaked at" in line
    assert "--device cpu" in line  # the estimate it names is the CPU's
    # at a cap that fits but is within the model's CPU error, the measurement is stored and the preflight applies it
    done = run_cli("run", str(path), "--set", f"memory_limit_gib={1.8 * predicted:.3f}", cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "the preflight adds the difference until a trial completes" in done.stdout, done.stdout
    study = optuna.load_study(study_name=space["study"]["name"], storage="sqlite:///studies/t.db")
    [trial] = study.trials
    assert trial.user_attrs["status"] == "complete"
    assert trial.user_attrs["corrected_peak_gib"] > trial.user_attrs["predicted_peak_gib"]
