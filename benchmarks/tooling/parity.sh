#!/usr/bin/env bash
# Parity of a refactor: the same space run by an earlier commit and by the working tree, then the trial lines, the
# front, `sweep report --json` and every export compared. What may differ is printed; measured peaks (a CPU's RSS
# moves by about 1 MB between runs), timings, paths, timestamps and the files' own checksums are expected to.
#
#   benchmarks/tooling/parity.sh BASE_COMMIT [OUT_DIR]      # about 4 minutes on 2 cores, in .venv
#
# The space: 6 trials of the tests' tiny Llama (sweeper.testing), r x lora_alpha_ratio x compute dtype, at a learning
# rate where lora_alpha_ratio 256 moves the instability.
set -euo pipefail
BASE=${1:?usage: benchmarks/tooling/parity.sh BASE_COMMIT [OUT_DIR]}
OUT=${2:-$(mktemp -d /tmp/sweeper-parity.XXXXXX)}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=$REPO/.venv/bin/python
mkdir -p "$OUT"
git -C "$REPO" worktree add -q --detach "$OUT/base-code" "$BASE"
trap 'git -C "$REPO" worktree remove --force "$OUT/base-code"' EXIT

run() {  # run CODE_ROOT DIR
  local code=$1 dir=$2
  mkdir -p "$dir" && cd "$dir"
  PYTHONPATH=$code $PY - "$OUT/model" <<'EOF'
import sys
from pathlib import Path
from sweeper.testing import build_tiny_model, tiny_space, write_space
model = Path(sys.argv[1])
if not (model / "config.json").exists():
    build_tiny_model(model)
search = {"r": [4, 8, 16], "lora_alpha_ratio": [1, 256], "bnb_4bit_compute_dtype": ["bfloat16", "float32"]}
write_space(Path("."), tiny_space(model, name="par", n_trials=6, search=search, training={"learning_rate": 0.002}))
EOF
  export PYTHONPATH=$code
  $PY -m sweeper.cli run space.yaml > run.txt 2>&1 || true
  $PY -m sweeper.cli report par > report.txt 2>&1 || true
  $PY -m sweeper.cli report par --json > report.json 2>&1 || true
  for f in hf trl axolotl llama-factory json; do
    $PY -m sweeper.cli export par --pick knee --format "$f" > "export-$f.txt" 2>&1 || true
  done
  unset PYTHONPATH
}

run "$OUT/base-code" "$OUT/base"
run "$REPO" "$OUT/head"
normalize() {
  sed -E 's/[0-9]+\.[0-9]+ s\b/T s/g; s/ETA [0-9]+ s/ETA T/; s/[0-9]+ s per trial/T per trial/; s/ +T s/ T s/g' \
    | sed -E 's/done in [0-9]+ s/done in T s/; s/[0-9]\.[0-9]{2} GiB/M GiB/g' \
    | sed -E 's/"([a-z_]*(gib|error|error_raw)|ratio|slope|intercept|[a-z0-9]+\/[a-z]+)": -?[0-9][0-9.e+-]*/"\1": N/g; s/x[0-9]\.[0-9]{2}/xR/g; s/ [0-9]+% / P% /g' \
    | sed -E 's/(peak[_ a-z]*[": ]+)[0-9.]+/\1M/g; s/[0-9]\.[0-9]{3} GiB/M GiB/g; s/  0\.[0-9]{3}  /  M  /g' \
    | sed -E "s#$OUT/(base|head)#OUT#g; s/[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:]{8}/DATE/g; s/sha256[\"_: ]+[0-9a-f]{64}/sha256 H/g"
}
status=0
cd "$OUT"
for f in run.txt report.txt report.json export-hf.txt export-trl.txt export-axolotl.txt export-llama-factory.txt \
  export-json.txt $(cd base && find studies/par/exports -type f | sort); do
  if ! diff <(normalize < "base/$f") <(normalize < "head/$f") > "diff.txt"; then
    echo "DIFFERS $f"; head -20 diff.txt; status=1
  else
    echo "same    $f"
  fi
done
exit $status
