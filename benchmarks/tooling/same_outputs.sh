#!/usr/bin/env bash
# Whether a change that should change no output changed none: `sweep report` (terminal, --json, HTML) and `sweep export`
# (every format) of one study, from the code at REV and from the working tree, compared byte for byte once the times,
# the hashes that cover them and the output folders are masked.
#
#   benchmarks/tooling/same_outputs.sh REV STUDIES_DIR [STUDY]      # e.g. HEAD~3 /tmp/demo/studies demo
#
# STUDIES_DIR is a `studies/` folder (the demo's, after `make demo`); it is copied, never written. Prints one line per
# output, `same` or `DIFF` (with the first lines of the diff), and exits 1 when any differs.
set -u
[ $# -ge 2 ] || { echo "usage: $0 REV STUDIES_DIR [STUDY]" >&2; exit 2; }
REV=$1 STUDIES=$(cd "$2" && pwd) STUDY=${3:-demo}
cd "$(dirname "$0")/../.."
REPO=$PWD
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
WORK=$(mktemp -d)
trap 'git -C "$REPO" worktree remove --force "$WORK/rev" >/dev/null 2>&1; rm -rf "$WORK"' EXIT
git worktree add -q --detach "$WORK/rev" "$REV" || exit 2
# The venv's editable install points at this checkout; the REV side drops that finder and imports from its worktree.
cat > "$WORK/at_rev.py" <<PY
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower() and "editable" not in type(f).__name__.lower()]
sys.path.insert(0, "$WORK/rev")
import sweeper
assert sweeper.__file__.startswith("$WORK/rev"), sweeper.__file__
from sweeper.cli import main
sys.argv = ["sweep", *sys.argv[1:]]
sys.exit(main())
PY
outputs() {  # $1: side folder, then the command that runs sweep
  local side=$1; shift
  mkdir -p "$side" && cp -r "$STUDIES" "$side/studies" && cd "$side" || exit 2
  "$@" report "$STUDY" > report.txt 2>&1
  "$@" report "$STUDY" --json > report.json 2>&1
  "$@" report "$STUDY" --html report.html > report_html.txt 2>&1
  for format in hf trl axolotl llama-factory json policy; do
    "$@" export "$STUDY" --format "$format" -o "export-$format" > "export-$format.txt" 2>&1
  done
  cd "$REPO"
}
outputs "$WORK/a" "$PYTHON" "$WORK/at_rev.py"
outputs "$WORK/b" "$PYTHON" -c "import sys; from sweeper.cli import main; sys.argv[0] = 'sweep'; sys.exit(main())"
mask() { sed -E 's/20[0-9]{2}-[0-9]{2}-[0-9]{2}[ T][0-9:.]+/TIME/g; s/(sha256[": ]+)[0-9a-f]{64}/\1HASH/g' "$1" | sed "s#$WORK/[ab]#OUT#g"; }
status=0
for path in $(cd "$WORK/a" && find . -type f ! -path "./studies/*" | sort); do
  if [ ! -f "$WORK/b/$path" ]; then echo "DIFF $path (missing after)"; status=1; continue; fi
  if diff -q <(mask "$WORK/a/$path") <(mask "$WORK/b/$path") > /dev/null; then
    echo "same $path"
  else
    echo "DIFF $path"; diff <(mask "$WORK/a/$path") <(mask "$WORK/b/$path") | head -6; status=1
  fi
done
exit $status
