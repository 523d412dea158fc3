"""The package's shape: the sweep side never imports torch (it starts in well under a second), and the contracts of
``[tool.importlinter]`` in pyproject.toml hold (the layers, the process boundary, no cycles, private modules)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "peft", "bitsandbytes", "datasets")


@pytest.mark.parametrize(
    "module",
    [
        "sweeper",
        "sweeper.cli",
        "sweeper.study",
        "sweeper.report",
        "sweeper.export",
        "sweeper.space",
        "sweeper.trial",
        "sweeper.estimate",
        "sweeper.audit",
        "sweeper.stability",
    ],
)
def test_the_sweep_side_imports_no_torch(module):
    code = (
        f"import sys, time; t = time.perf_counter(); import {module}; "
        f"print(__import__('json').dumps([time.perf_counter() - t, [m for m in {HEAVY!r} if m in sys.modules]]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    seconds, heavy = json.loads(out.stdout)
    assert heavy == [], f"import {module} loaded {heavy}"
    assert seconds < 5, seconds  # generous: a torch import alone takes several seconds here


def test_sweep_help_does_not_import_torch():
    code = (
        "import sys, runpy; sys.argv = ['sweep', '--help']\n"
        "try:\n    runpy.run_module('sweeper.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', [m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert "HEAVY []" in out.stdout, out.stdout[-500:] + out.stderr[-500:]


@pytest.mark.skipif(
    shutil.which("lint-imports", path=str(Path(sys.executable).parent)) is None,
    reason="import-linter is not installed (the 'test' extra installs it)",
)
def test_architecture_contracts_hold():
    out = subprocess.run([str(Path(sys.executable).parent / "lint-imports")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "0 broken" in out.stdout
