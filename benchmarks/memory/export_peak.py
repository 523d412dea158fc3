"""The exported run's peak against the trial's (issue 57): does the run a user starts from ``sweep export`` peak where
the trial said?

    .venv/bin/python benchmarks/memory/export_peak.py [--repeats 2] [--out FILE] [--runs hf trl axolotl ...]

1. A one-trial study of the demo's trial #2 configuration (``search_spaces/demo.yaml`` with every searched key fixed,
   the seed searched instead:
   r 16, ``lora_alpha/r`` 0.25, double quant, fp4, batch 2 x 64, float32 compute, checkpointing, paged AdamW 8-bit,
   SmolLM2-135M-Instruct, 12 steps), run by ``sweep run`` (``--repeats`` studies: the trial's own noise).
2. Its ``hf`` and ``trl`` exports (``sweep export``), each trained in its real tool as the file says
   (transformers ``Trainer`` with ``adapt_model`` and ``make_data_collator``; TRL's ``SFTTrainer`` from
   ``build_trainer``) on the trial's own samples (``sweeper.data.load_samples``; hf tokenized as the trial tokenizes,
   TRL given the chat rows), for ``--steps`` optimizer steps at the export's ``gradient_accumulation_steps``, in a
   process of its own with one thread (``--repeats`` times each); and the ``trl`` file once more with transformers'
   own loss over the full logits (``Trainer.compute_loss``, what the trial computes) in place of TRL's
   (``trl-full-logits``), to tell TRL's loss kernel from the rest of TRL.
   The ``axolotl`` and ``llama-factory`` files are trained by the tools themselves, each in its stack's venv
   (``tests/fixtures/stacks/axolotl-train.txt``, ``llama-factory.txt``; built under ``$SWEEPER_STACK_VENVS`` or a
   temporary folder): ``axolotl train FILE`` (``axolotl.cli.train.do_cli``) and ``llamafactory-cli train FILE``
   (``llamafactory.train.tuner.run_exp``), the file as written but for the local model, ``max_steps`` and where
   the output goes (:data:`TOOL_OVERRIDES`). LLaMA-Factory cannot express the float32 trial on a GPU (the export
   refuses it); on the CPU, with neither ``bf16`` nor ``fp16``, it computes in float32 (its ``infer_optim_dtype``),
   and torch's CPU autocast fails in its bfloat16 (``Unexpected floating ScalarType in at::autocast::prioritize``):
   so it runs the file the export writes for this trial in bfloat16 with ``bf16: false``, the trial's float32.
3. Each measured as the trial measures on the CPU: the resident set's high-water mark (``VmHWM``), reset once the
   model is loaded and adapted (``/proc/self/clear_refs``, after handing glibc's free heap back with ``malloc_trim``
   as the trial does when a phase starts), read after training; in the tools' own runs, at the start and end of
   ``transformers.Trainer.train``, which both tools' trainers run (:data:`TOOL_CHILD`). No cap (the trial's cap decides
   whether a step fits, not how much it holds).

Printed: each run's peak in GiB, each format's median and range against the trials', and the difference. The trial's
stated noise between runs on the CPU is about 0.1 GiB (``sweep run``'s memory line).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
from _common import REPO, SWEEP, cpu_counting_source

#: The demo's trial #2 (README), every key the demo searches fixed at its value.
FIXED = {
    "r": [16],
    "lora_alpha_ratio": [0.25],
    "bnb_4bit_use_double_quant": [True],
    "bnb_4bit_quant_type": ["fp4"],
    "per_device_train_batch_size": [2],
    "max_seq_length": [64],
}

#: The CPU counting both children share, the trial's own (``_common.cpu_counting_source``: the product's
#: ``reset_cpu_peak``, ``peak_memory_gib`` and ``process_memory_gib`` as text, for a tool's venv that has no sweeper):
#: ``restart_cpu_peak()`` hands what loading freed back to the system (glibc's ``malloc_trim``, as the trial does when a
#: phase starts) and resets the resident set's high-water mark; ``status("VmHWM:")`` reads it, in GiB.
CPU_COUNTING = cpu_counting_source() + "from pathlib import Path\n"

#: The child that trains one export and prints its peak (argv: format, export file, model path, the trial's dataset
#: as JSON, steps, device). On the CPU the trial's counting (the resident set's high-water mark, reset after
#: loading); on CUDA the trial's too (``torch.cuda.max_memory_reserved``, its peak statistics reset after loading).
CHILD = (
    CPU_COUNTING
    + r"""
import dataclasses, json, runpy, sys

fmt, py, model_path, dataset, steps, device = sys.argv[1:7]
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from sweeper.data import load_samples, load_tokenizer, tokenize_samples
from sweeper.space import DatasetSpec

samples = load_samples(DatasetSpec(**json.loads(dataset)))
ns = runpy.run_path(py)
bnb = ns["bnb_config"]
placed = {"device_map": {"": 0}} if device == "cuda" else {}
model = AutoModelForCausalLM.from_pretrained(model_path, quantization_config=bnb, dtype=bnb.bnb_4bit_compute_dtype,
                                             **placed)
short = dict(max_steps=int(steps), use_cpu=device == "cpu", report_to="none", save_strategy="no", disable_tqdm=True,
             output_dir=str(Path(py).parent / f"run-{fmt}"))
if fmt == "hf":
    from transformers import Trainer
    tokenizer = load_tokenizer(model_path)
    rows = [{"input_ids": t.input_ids, "labels": t.labels}
            for t in tokenize_samples(samples, tokenizer, ns["MAX_SEQ_LENGTH"]) if t.input_ids]
    trainer = Trainer(model=ns["adapt_model"](model), args=dataclasses.replace(ns["training_args"], **short),
                      train_dataset=rows, data_collator=ns["make_data_collator"](tokenizer))
else:
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    rows = [{"messages": [dict(m) for m in s.messages]} for s in samples if s.messages]
    trainer = ns["build_trainer"](model, tokenizer, rows, **short)
    if fmt == "trl-full-logits":  # TRL's trainer, the trial's loss: transformers' own over the full logits
        import types
        from transformers import Trainer
        trainer.compute_loss = types.MethodType(Trainer.compute_loss, trainer)
if device == "cuda":
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_reserved() / 2**30
    trainer.train()
    peak = torch.cuda.max_memory_reserved() / 2**30
else:
    restart_cpu_peak()  # the peak from here on: the trial's counting after loading
    start = status("VmRSS:")
    trainer.train()
    peak = status("VmHWM:")
print(json.dumps({"peak_memory_gib": peak, "start_gib": start, "steps": trainer.state.global_step}))
"""
)


class Target(NamedTuple):
    """The trial whose exports are run: its study (in ``folder``), its number, its measured peak (GiB), the model
    folder its trials loaded and its dataset (the :class:`sweeper.space.DatasetSpec` as a dict)."""

    folder: Path
    study: str
    trial: int
    peak_memory_gib: float
    model_path: str
    dataset: dict


def target_of(folder: Path, name: str, number: int | None) -> Target:
    """The trial ``number`` of the study ``name`` stored in ``folder`` (``studies/``), or, with None, its complete
    trial with the most tokens a step (``per_device_train_batch_size x max_seq_length``: where the logits, and so the
    loss kernel, weigh most)."""
    import dataclasses

    from sweeper.study import load_existing_study, snapshot

    here = os.getcwd()
    os.chdir(folder)
    try:
        study = snapshot(load_existing_study(name)[0])
    finally:
        os.chdir(here)
    named = [t for t in study.trials if number is None or t.number == number]
    done = [t for t in named if t.status == "complete" and t.config is not None and t.values is not None]
    if not done:
        ended = "; ".join(f"trial {t.number} ended {t.status}: {t.result.reason}" for t in named)
        raise RuntimeError(f"{name}: no complete trial{'' if number is None else f' {number}'} to export ({ended})")
    trial = max(done, key=lambda t: (t.config.per_device_train_batch_size * t.config.max_seq_length, -t.number))
    model = study.model_path or trial.config.model.name_or_path
    dataset = dataclasses.asdict(trial.config.dataset)
    return Target(folder, name, trial.number, float(trial.values[0]), model, dataset)


def one_trial_study(folder: Path, name: str) -> Target:
    """``sweep run`` of the fixed space in ``folder``; its one trial."""
    space = yaml.safe_load((REPO / "search_spaces" / "demo.yaml").read_text())
    space["study"] = {"name": name, "n_trials": 1, "sampler": "random", "seed": 92}
    training = space["training"]
    for key, [value] in FIXED.items():  # fixed: a space must search something, so the seed is (memory does not see it)
        training[key] = value
    space["search"] = {"seed": [0, 1]}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*SWEEP, "run", str(path)], cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return target_of(folder, name, 0)  # raises, with the trial's status and reason, where it did not complete


#: The child that trains a tool's file in the tool's venv and prints its peak (argv: tool, file). The peak is reset
#: where ``transformers.Trainer.train`` begins (the model loaded and adapted, the data prepared), as in :data:`CHILD`.
TOOL_CHILD = (
    CPU_COUNTING
    + r"""
import collections, json, sys
import transformers

train = transformers.Trainer.train

def measured(self, *args, **kwargs):
    restart_cpu_peak()
    start = status("VmRSS:")
    frozen = collections.Counter()  # the frozen weights outside the 4-bit layers: elements by dtype
    for p in self.model.parameters():
        if not p.requires_grad and p.dtype.is_floating_point and type(p).__name__ != "Params4bit":
            frozen[str(p.dtype).removeprefix("torch.")] += p.numel()
    out = train(self, *args, **kwargs)
    print("PEAK " + json.dumps({"peak_memory_gib": status("VmHWM:"), "start_gib": start, "frozen": frozen,
                                "steps": self.state.global_step, "trainer": type(self).__name__}), flush=True)
    return out

transformers.Trainer.train = measured
if __name__ == "__main__":
    tool, path = sys.argv[1:3]
    if tool == "axolotl":
        from axolotl.cli.train import do_cli
        do_cli(config=path)
    else:
        sys.path.insert(0, TOOL_CHECK)  # the tests' stand-in for torchaudio, which LLaMA-Factory imports, unused
        from tool_check import _torchaudio_stand_in
        _torchaudio_stand_in()
        import yaml
        from llamafactory.train.tuner import run_exp
        run_exp(yaml.safe_load(Path(path).read_text()))
"""
)

#: What the benchmark changes in a tool's file (``{model}``: the local checkpoint the trial loaded; ``{out}``: a
#: folder of the run's): the model, a short run, nothing saved or reported, one process for the data. LLaMA-Factory
#: on the CPU also needs ``use_cpu`` and ``bf16: false`` (see the module's docstring), and ``upcast_layernorm:
#: false``: without autocast its float32 final norm feeds a float16 ``lm_head`` ("expected m1 and m2 to have the
#: same dtype"), where on a GPU autocast casts; the norms are 0.03 M elements here.
TOOL_OVERRIDES = {
    "axolotl": {"base_model": "{model}", "max_steps": None, "output_dir": "{out}/run",
                "dataset_prepared_path": "{out}/prepared", "save_strategy": "no", "dataset_num_proc": 1},
    "llama-factory": {"model_name_or_path": "{model}", "max_steps": None, "output_dir": "{out}/run",
                      "report_to": "none", "save_strategy": "no", "overwrite_output_dir": True,
                      "preprocessing_num_workers": 1, "use_cpu": True, "bf16": False, "upcast_layernorm": False},
}  # fmt: skip

#: Each tool's stack venv (``tests/fixtures/stacks/<name>.txt``).
TOOL_STACKS = {"axolotl": "axolotl-train", "llama-factory": "llama-factory"}


def tool_file(target: Target, tool: str, out: Path) -> Path:
    """Export the target trial as ``tool``'s file into ``out``. The ``llama-factory`` file is the one the export
    writes for this trial computed in bfloat16 (it refuses float32, see the module's docstring)."""
    if tool == "axolotl":
        subprocess.run([*SWEEP, "export", target.study, "--trial", str(target.trial), "--format", tool, "-o",
                        f"{out}/"], cwd=target.folder, check=True, capture_output=True)  # fmt: skip
        [path] = out.glob("*.yaml")
        return path
    import dataclasses

    from sweeper.benchmarking import export_data, render, settings_of
    from sweeper.study import load_existing_study, snapshot

    here = os.getcwd()
    os.chdir(target.folder)
    try:
        study = snapshot(load_existing_study(target.study)[0])
        [trial] = [t for t in study.trials if t.number == target.trial]
        assert trial.config is not None
        s = settings_of(study, trial)
        s = dataclasses.replace(
            s,
            quantization=dataclasses.replace(s.quantization, bnb_4bit_compute_dtype="bfloat16"),
            training=dataclasses.replace(s.training, bf16=True),
        )
        path = out / f"trial{trial.number}-llama-factory.yaml"
        files = render(s, tool, export_data(trial.config, study.model_path, path))
    finally:
        os.chdir(here)
    for key, text in files.items():  # the YAML (".yaml"), and the rows and their registry (their own paths)
        target = path if key == ".yaml" else Path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return path


def tool_run(target: Target, tool: str, steps: int, venvs: Path) -> tuple[float, float]:
    """Train ``tool``'s export of the target trial in the tool's own venv, on the CPU; its peak and its resident set
    when training began, in GiB."""
    from sweeper.testing import run_in_venv, stack_venv

    os.environ.setdefault("SWEEPER_STACK_VENVS", str(venvs))  # where stack_venv builds (its pytest factory unused)
    python = stack_venv(TOOL_STACKS[tool], None)
    out = target.folder / f"export-{tool}"
    path = tool_file(target, tool, out)
    fills = {"model": target.model_path, "out": str(out)}
    config = yaml.safe_load(path.read_text())
    for key, value in TOOL_OVERRIDES[tool].items():
        config[key] = steps if value is None else value.format(**fills) if isinstance(value, str) else value
    run = out / "run.yaml"
    run.write_text(yaml.safe_dump(config))
    child = out / "child.py"
    child.write_text(TOOL_CHILD.replace("TOOL_CHECK", repr(str(REPO / "tests" / "export"))))
    env = {"HF_HUB_OFFLINE": "1", "AXOLOTL_DO_NOT_TRACK": "1", "WANDB_MODE": "disabled"}
    done = run_in_venv(python, str(child), tool, str(run), cwd=out, **env)
    peaks = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
    if done.returncode != 0 or not peaks:
        raise RuntimeError(f"{tool}: {done.stderr[-3000:]}")
    measured = json.loads(peaks[-1].removeprefix("PEAK "))
    print(f"  {tool}: frozen weights outside the 4-bit layers (elements by dtype) {measured['frozen']}", flush=True)
    return float(measured["peak_memory_gib"]), float(measured["start_gib"])


def export_run(target: Target, label: str, steps: int, device: str) -> tuple[float, float]:
    """Export the target trial as ``label``'s format (``trl-full-logits``: the ``trl`` file with the trial's loss)
    and train it in a process of its own on ``device``; its peak and its memory when training began, in GiB."""
    fmt = "trl" if label.startswith("trl") else label
    out = target.folder / f"export-{label}"
    subprocess.run([*SWEEP, "export", target.study, "--trial", str(target.trial), "--format", fmt, "-o", f"{out}/"],
                   cwd=target.folder, check=True, capture_output=True)  # fmt: skip
    [py] = sorted(out.glob("*.py"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    child = [sys.executable, "-c", CHILD, label, str(py), target.model_path, json.dumps(target.dataset), str(steps)]
    done = subprocess.run([*child, device], cwd=target.folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{label}: {done.stderr[-3000:]}")
    run = json.loads(done.stdout.strip().splitlines()[-1])
    return float(run["peak_memory_gib"]), float(run["start_gib"])


#: The runs compared with the trial: each export as written, and the ``trl`` file with transformers' own loss over
#: the full logits (what the trial computes) in place of TRL's, to tell TRL's loss kernel from the rest of TRL.
RUNS = ("hf", "trl", "trl-full-logits", "axolotl", "llama-factory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps of each export's run")
    parser.add_argument("--out")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--study", help="an existing study in this folder's studies/ (the GPU check's sweep) "
                        "instead of a one-trial study of the demo's configuration")  # fmt: skip
    parser.add_argument("--trial", type=int, help="with --study: the trial (default: its complete trial with the "
                        "most tokens a step)")  # fmt: skip
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda with --study, else cpu")
    parser.add_argument("--json", help="write the peaks and starts here as well")
    args = parser.parse_args()
    peaks: dict[str, list[float]] = {"trial": [], **{run: [] for run in args.runs}}
    starts: dict[str, list[float]] = {run: [] for run in args.runs}
    device = args.device or ("cuda" if args.study else "cpu")
    if device == "cuda" and set(args.runs) & set(TOOL_STACKS):
        parser.error("--runs axolotl and llama-factory train on the CPU only here (their stacks' venvs)")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            if args.study:  # an existing study: its trial measured once, its exports run --repeats times
                target = target_of(Path.cwd(), args.study, args.trial)
            else:
                folder = Path(tmp) / f"r{i}"
                folder.mkdir()
                target = one_trial_study(folder, f"peak{i}")
            peaks["trial"].append(target.peak_memory_gib)
            print(f"  trial {target.trial} of {target.study}: {target.peak_memory_gib:.3f} GiB", flush=True)
            for run in args.runs:
                if run in TOOL_STACKS:
                    venvs = Path(os.environ.get("SWEEPER_STACK_VENVS") or Path(tmp) / "venvs")
                    peak, start = tool_run(target, run, args.steps, venvs)
                else:
                    peak, start = export_run(target, run, args.steps, device)
                peaks[run].append(peak)
                starts[run].append(start)
                print(f"  {run} {i}: {peak:.3f} GiB ({start:.3f} held when training began)", flush=True)
    trial_median = statistics.median(peaks["trial"])
    lines = [
        f"# benchmarks/memory/export_peak.py, {args.repeats} repeats, {args.steps} steps an export run; GiB, "
        + ("cuda_max_reserved" if device == "cuda" else "cpu_peak_rss")
    ]
    for label, values in peaks.items():
        med = statistics.median(values)
        diff = "" if label == "trial" else f"  {med - trial_median:+.3f} against the trial"
        start = f"; resident at its start {statistics.median(starts[label]):.3f}" if label in starts else ""
        lines.append(f"{label:<16} {med:.3f} ({min(values):.3f}-{max(values):.3f}){diff}{start}")
    text = "\n".join(lines)
    print(text)
    figures = json.dumps({"peaks": peaks, "starts": starts, "device": device})
    if args.out:
        Path(args.out).write_text(text + "\n" + figures + "\n")
    if args.json:
        Path(args.json).write_text(figures + "\n")


if __name__ == "__main__":
    main()
