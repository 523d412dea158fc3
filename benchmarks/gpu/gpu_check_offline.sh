#!/usr/bin/env bash
# The GPU check on a GPU machine with no network (how the first one ran, benchmarks/gpu/results/gpu-2026-12-04):
#
#   benchmarks/gpu/gpu_check_offline.sh WHEELS STAND_IN OUT_DIR
#
# WHEELS: a folder of the wheels the machine's Python lacks (for that Python's version and platform; on a machine
#         with torch and transformers already, these were bitsandbytes, optuna, alembic, sqlalchemy, mako, colorlog,
#         gguf, peft, datasets, dill, multiprocess, optuna-dashboard: 52 MB). Made where pip works, e.g.
#         pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#           --platform manylinux_2_17_x86_64 --platform any -d WHEELS bitsandbytes==0.50.2 optuna==5.1.0 ...
# STAND_IN: the built-in model's config and tokenizer without weights, made where the model is
#         (python benchmarks/gpu/stand_in_model.py strip ~/.cache/sweeper/models/smollm2-135m-instruct-float16 STAND_IN);
#         the model file itself (94 MB) often cannot travel.
# The wheels go to a private folder on PYTHONPATH (the machine's own packages are left as they are), the stand-in
# gets random weights, and benchmarks/gpu/gpu_check.sh runs with the sweep on it.
set -u
cd "$(dirname "$0")/../.."
[ $# -eq 3 ] || { echo "usage: $0 WHEELS STAND_IN OUT_DIR" >&2; exit 2; }
WHEELS=$1 STAND_IN=$2 OUT_DIR=$3
SITE=$(mktemp -d)
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
  || { echo "$0: the wheels in $WHEELS did not install" >&2; exit 1; }
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
"$PYTHON" benchmarks/gpu/stand_in_model.py build "$STAND_IN" "$SITE/stand-in" 2>&1 | tail -1
GPU_CHECK_MODEL="$SITE/stand-in" PYTHON="$PYTHON" bash benchmarks/gpu/gpu_check.sh "$OUT_DIR"
