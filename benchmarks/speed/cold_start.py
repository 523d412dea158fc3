"""Where a cold trial process's start goes: each import of the trial's stack timed in a fresh process, and whether
the CUDA driver was initialized after it (the question of a zygote on GPU machines: docs/trial.md, "Cold starts").

    python benchmarks/speed/cold_start.py [--runs 3] [--json OUT.json]

Each run is a new ``python`` process that imports, in the trial process's order, torch; transformers and its model
code; datasets; transformers' ``Trainer``; peft; bitsandbytes; then (on CUDA) creates the context with a first
allocation. After each stage it records the seconds it took, whether bitsandbytes is imported, whether torch
initialized CUDA (``torch.cuda.is_initialized()``) and whether the driver was (``cuDeviceGetCount`` answers
``CUDA_ERROR_NOT_INITIALIZED`` until ``cuInit``; asked only where ``libcuda.so.1`` is already loaded, so the question
loads nothing). A process may fork children that use CUDA only while the driver is not initialized. Prints the median
and range over the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _common puts this checkout on sys.path
import _common  # noqa: F401

STAGES = """
import ctypes, json, os, sys, time

def driver_initialized():
    try:
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return None  # not loaded: nothing initialized it
    count = ctypes.c_int()
    return lib.cuDeviceGetCount(ctypes.byref(count)) != 3  # 3: CUDA_ERROR_NOT_INITIALIZED

def stage(name, fn, out):
    start = time.monotonic()
    fn()
    torch = sys.modules.get("torch")
    out.append({
        "stage": name,
        "seconds": round(time.monotonic() - start, 3),
        "bitsandbytes_imported": "bitsandbytes" in sys.modules,
        "torch_cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
        "driver_initialized": driver_initialized(),
    })

def models():
    import transformers.modeling_utils
    from transformers import LlamaForCausalLM

def trainer():
    from transformers import Trainer

def context():
    import torch
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")

out = []
stage("import torch", lambda: __import__("torch"), out)
stage("import transformers, its model code", models, out)
stage("import datasets", lambda: __import__("datasets"), out)
stage("from transformers import Trainer", trainer, out)
stage("import peft", lambda: __import__("peft"), out)
stage("import bitsandbytes", lambda: __import__("bitsandbytes"), out)
stage("CUDA context (first allocation)", context, out)
print(json.dumps(out))
"""


def one_run() -> list[dict]:
    """One fresh process's stages (its last stdout line)."""
    done = subprocess.run([sys.executable, "-c", STAGES], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = [one_run() for _ in range(args.runs)]
    summary = []
    for i, first in enumerate(runs[0]):
        seconds = [run[i]["seconds"] for run in runs]
        summary.append({**first, "seconds": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds)})
        print(
            f"{first['stage']:<38} median {statistics.median(seconds):6.2f} s ({min(seconds):.2f}-{max(seconds):.2f})"
            f"  bitsandbytes {'in' if first['bitsandbytes_imported'] else 'not in'}"
            f"  torch CUDA init {first['torch_cuda_initialized']}  driver init {first['driver_initialized']}"
        )
    totals = [sum(s["seconds"] for s in run) for run in runs]
    print(
        f"total: median {statistics.median(totals):.2f} s ({min(totals):.2f}-{max(totals):.2f}) over {args.runs} runs"
    )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "totals_s": totals}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
