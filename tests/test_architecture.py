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
        "sweeper.sweep",
        "sweeper.study",
        "sweeper.report",
        "sweeper.export",
        "sweeper.space",
        "sweeper.trial",
        "sweeper.devices",
        "sweeper.memory",
        "sweeper.checkpoint",
        "sweeper.audit",
        "sweeper.stability",
        "sweeper.benchmarking",
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


def test_lazy_package_faces_keep_their_names():
    code = (
        "import sys, json, sweeper, sweeper.trial\n"
        "before = [m for m in ('sweeper.trial._launch', 'sweeper.space') if m in sys.modules]\n"
        "from sweeper import TrialConfig, run_trial, TrialResult\n"
        "from sweeper.trial import TrialProcess, TrialStatus\n"
        "names = sorted(set(sweeper.__all__) - set(dir(sweeper))) + sorted(set(sweeper.trial.__all__) - "
        "set(dir(sweeper.trial)))\n"
        "print(json.dumps([before, names, 'sweeper.trial._launch' in sys.modules, TrialConfig.__name__]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    before, missing, launched, name = json.loads(out.stdout)
    assert before == [] and missing == [] and launched and name == "TrialConfig"
    with pytest.raises(AttributeError):
        import sweeper

        _ = sweeper.no_such_name


@pytest.mark.slow
def test_the_trial_process_never_loads_the_sweeps_side(tiny_model, tmp_path):
    """A real warm trial process (one trial of the tiny Llama) reports the sweeper modules it loaded: every module
    of the trial's own side, never ``sweeper.trial._launch`` (the import-linter contract covers import statements;
    this covers what a package's ``__init__`` pulls in at run time)."""
    import os

    from sweeper.testing import tiny_trial_config
    from sweeper.trial import TrialProcess

    process = TrialProcess({**os.environ, "SWEEPER_DEBUG_MODULES": "1"})
    try:
        result = process.run(tiny_trial_config(tiny_model, max_steps=1), tmp_path, model_path=str(tiny_model))
    finally:
        process.close()
    assert result.status == "complete", result.reason
    lines = [ln for ln in (tmp_path / "worker.log").read_text().splitlines() if "sweeper: modules loaded: " in ln]
    assert len(lines) == 1, (tmp_path / "worker.log").read_text()[-2000:]
    loaded = json.loads(lines[0].split("sweeper: modules loaded: ", 1)[1])
    # (the worker itself runs as __main__)
    assert {"sweeper.trial._child.recipe", "sweeper.trial._child.outcome", "sweeper.trial._result"} <= set(loaded)
    assert "sweeper.trial._launch" not in loaded, loaded


#: Every package's face is held small: each exports only what another package of sweeper imports, at most 25 names
#: (the stability science at most 32: the constants and functions of its six measures, each read by one or two
#: packages, would otherwise be imported from its private modules; issue 54 added the critical rate's three).
SMALL_FACES = (
    "sweeper.audit",
    "sweeper.data",
    "sweeper.devices",
    "sweeper.export",
    "sweeper.memory",
    "sweeper.report",
    "sweeper.space",
    "sweeper.stability",
    "sweeper.storage",
    "sweeper.study",
    "sweeper.sweep",
    "sweeper.trial",
)
MAX_FACE = 25
#: Over the 25, with its reason, to be brought down (issue 56's note): the stability science's six measures. (The study
#: and the storage, at 28 and 33 before issue 69, each took its readers' and writers' several calls in one: the
#: storage opens a study for writing or finds one for reading, the study records a repeat and chooses a run's setup.)
MAX_FACE_BY_PACKAGE = {"sweeper.stability": 32}


def _face_users(package: str) -> dict[str, set[str]]:
    """Each name of ``package``'s ``__all__`` with the modules of sweeper outside it that import it from the face."""
    import ast
    import importlib

    face = importlib.import_module(package)
    inside = package.replace(".", "/") + "/"
    users: dict[str, set[str]] = {name: set() for name in face.__all__}
    for path in (REPO / "sweeper").rglob("*.py"):
        relative = path.relative_to(REPO).as_posix()
        if relative.startswith(inside):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == package:
                for alias in node.names:
                    users.setdefault(alias.name, set()).add(relative)
    return users


@pytest.mark.parametrize("package", SMALL_FACES)
def test_a_small_face_exports_only_what_other_packages_use(package):
    users = _face_users(package)
    unused = sorted(name for name, where in users.items() if not where)
    assert unused == [], f"{package} exports names no other package imports (import them from their module): {unused}"
    assert len(users) <= MAX_FACE_BY_PACKAGE.get(package, MAX_FACE), (
        f"{package} exports {len(users)} names: "
        + "; ".join(f"{name}: {', '.join(sorted(where))}" for name, where in sorted(users.items()))
    )


def test_every_package_face_is_held_small():
    """A new package comes under the face test: every subpackage of sweeper is in SMALL_FACES, but the CLI (its face
    is ``main``) and the test helpers (``sweeper.testing``, imported by tests only)."""
    packages = {
        f"sweeper.{p.parent.name}" for p in (REPO / "sweeper").glob("*/__init__.py") if p.parent.name != "__pycache__"
    }
    assert packages - {"sweeper.cli", "sweeper.testing"} == set(SMALL_FACES)


def test_the_tests_mirror_the_package():
    """Each package of sweeper has its tests in ``tests/<package>/`` and each folder of tests is a package's (the
    test helpers, ``sweeper.testing``, are tested through the tests that use them); a test of a package's behaviour
    lives beside the others of that package, where a maintainer of it looks."""
    packages = {p.parent.name for p in (REPO / "sweeper").glob("*/__init__.py")} - {"testing"}
    folders = {p.name for p in (REPO / "tests").iterdir() if p.is_dir() and p.name not in ("fixtures", "__pycache__")}
    assert folders - packages == set(), f"tests/ folders that are no package of sweeper: {sorted(folders - packages)}"
    assert packages - folders == set(), f"packages of sweeper without a tests/ folder: {sorted(packages - folders)}"
    assert all(any(f.glob("test_*.py")) for f in (REPO / "tests" / name for name in folders))


def test_the_readme_stays_a_readme():
    """The README is the product's contract and its front door: at most 15,000 bytes (what a new user reads before
    trying it); what is longer belongs in docs/, which it links. Every link to a file of the repository resolves."""
    import re

    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 15_000, f"README.md is {len(text.encode()):,} bytes: move detail to docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (REPO / target).exists(), f"README.md links {target}, which is not in the repository"


def private_sweeper_imports(path: Path) -> list[str]:
    """``file:line: name`` for each import in ``path`` (a Python file, or a shell script's embedded Python) of a
    private module of sweeper (a dotted part that starts with ``_``: ``sweeper.memory._model``) or of a private name
    from one (``from sweeper.memory import _model``); dunders (``sweeper.__file__``) are not private."""
    import ast
    import re

    def private(dotted: str) -> bool:
        return any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in dotted.split("."))

    text = path.read_text()
    found = []
    if path.suffix == ".sh":  # the Python a shell script runs (python -c, heredocs): read as text
        for n, line in enumerate(text.splitlines(), 1):
            for m in re.finditer(r"\bfrom\s+(sweeper[\w.]*)\s+import\s+([\w, ()]+)|\bimport\s+(sweeper[\w.]*)", line):
                module = m.group(1) or m.group(3)
                names = [f"{module}.{a.strip()}" for a in (m.group(2) or "").strip("() ").split(",") if a.strip()]
                for dotted in [module] if private(module) else names:
                    if private(dotted):
                        found.append(f"{path}:{n}: {dotted}")
        return found
    for node in ast.walk(ast.parse(text, str(path))):
        dotted = []
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # a private module once; else each private name imported from a public one
            private_module = private(node.module)
            dotted = [node.module] if private_module else [f"{node.module}.{alias.name}" for alias in node.names]
        for name in dotted:
            if name.split(".")[0] == "sweeper" and private(name):
                found.append(f"{path}:{node.lineno}: {name}")
    return found


def test_the_benchmarks_import_only_public_names_of_sweeper():
    """Issue 69: 11 benchmark scripts made 20 imports of private modules, outside the import contracts and mypy, so a
    refactor broke them silently. A benchmark reaches sweeper through a package face or the benchmarks' door,
    :mod:`sweeper.benchmarking` (which the ``private_modules`` contract lets reach the private modules it names)."""
    files = sorted(p for p in (REPO / "benchmarks").rglob("*") if p.suffix in (".py", ".sh"))
    assert len(files) > 25  # the scan sees the scripts
    found = [use for path in files for use in private_sweeper_imports(path)]
    assert found == [], "benchmarks import private names of sweeper (use sweeper.benchmarking):\n" + "\n".join(found)


def test_a_private_import_in_a_benchmark_is_caught(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(
        "import sweeper\nfrom sweeper.memory import ModelShape\nfrom sweeper.benchmarking import estimate_memory\n"
        "from sweeper.memory._model import MemorySettings\nfrom sweeper.memory import _model as m\n"
        "def f():\n    import sweeper.trial._child.memory\nprint(sweeper.__file__)\n"
    )
    shell = tmp_path / "bad.sh"
    shell.write_text('python -c "from sweeper.cli import main; from sweeper.study._snapshot import stored_trials"\n')
    assert [use.split(": ", 1)[1] for use in private_sweeper_imports(script)] == [
        "sweeper.memory._model",
        "sweeper.memory._model",
        "sweeper.trial._child.memory",
    ]
    assert [use.split(": ", 1)[1] for use in private_sweeper_imports(shell)] == [
        "sweeper.study._snapshot",
    ]
    assert private_sweeper_imports(script)[0].startswith(f"{script}:4: ")


def test_the_benchmarks_door_keeps_its_names_and_imports_nothing_behind_it():
    """Every name of :mod:`sweeper.benchmarking` resolves (a move behind it fails here, not in a night's benchmark),
    and importing it loads no module behind it."""
    code = (
        "import sys, json, sweeper.benchmarking as door\n"
        "before = sorted(m for m in sys.modules if m.startswith('sweeper.') and m not in ('sweeper._lazy', "
        "'sweeper.benchmarking'))\n"
        "missing = [n for n in door.__all__ if getattr(door, n, None) is None]\n"
        "print(json.dumps([before, missing, sorted(set(door.__all__) - set(dir(door)))]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    before, missing, undirred = json.loads(out.stdout)
    assert before == [] and missing == [] and undirred == []
