"""The production stacks' venvs for the export tests: ``tests/fixtures/stacks/<name>.txt`` (pip constraints, with
``# pip install:`` and ``# pip uninstall:`` lines) built with pip and uv from the package registry, and running a
script in one."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sweeper.testing._paths import REPO

STACKS = REPO / "tests" / "fixtures" / "stacks"


def _installer(python: Path, args: list[str]) -> list[str]:
    """The command that installs ``args`` into ``python``'s venv: uv's ``pip install`` where uv is installed (a test
    dependency: the axolotl stack's packages in 10 s against pip's 44, both without a cache, on this project's
    machine) and the line does not need pip's ``--ignore-requires-python`` (uv has no such switch); pip otherwise.
    torch is never resolved by uv: pip chooses its wheel (:func:`_torch_wheel`), where uv would resolve the CUDA
    build on PyPI."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None or "--ignore-requires-python" in args:
        return [str(python), "-m", "pip", "--disable-pip-version-check", "install", "--quiet", "--no-compile", *args]
    return [uv, "pip", "install", "--quiet", "--python", str(python), *args]


def _torch_wheel(pin: str, folder: Path) -> Path:
    """torch's wheel for ``pin`` (``torch==2.13.0``) as pip chooses it (its configuration may name the machine's own
    CPU build, which uv does not read), downloaded into ``folder`` once: each venv then installs that file (by uv:
    linked from its cache in about 3 s, where pip took about 20 s a venv)."""
    wheels = folder / f"torch-wheel-{hashlib.sha256(pin.encode()).hexdigest()[:8]}"
    if not any(wheels.glob("torch-*.whl")):
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        subprocess.run([*pip, "download", "--quiet", "--no-deps", "--dest", str(wheels), pin], check=True, timeout=900)
    [wheel] = wheels.glob("torch-*.whl")
    return wheel


def stack_venv(name: str, tmp_path_factory: Any) -> Path:
    """The venv of ``tests/fixtures/stacks/<name>.txt``, built or reused; its python.

    torch is installed first, pinned (its wheel as pip chooses it, :func:`_torch_wheel`); then each ``# pip install:
    ARGS`` line of the file in order, as ``pip install -c FILE ARGS`` (without such lines: this package and TRL), by
    uv where it can (:func:`_installer`); then the packages of ``# pip uninstall: NAMES`` lines are removed. Nothing
    is byte-compiled at install (what is imported compiles on first use). The file's hash is the venv's stamp, so a
    changed recipe or pin rebuilds it.

    Without ``$SWEEPER_STACK_VENVS``, the venvs of one test run are kept in its base temporary folder's parent, which
    the pytest-xdist workers of the run share: the first test module (of any worker) to ask builds one, under a file
    lock, and every other module of the run reuses it (two modules of the export tests each use both stacks)."""
    constraints = STACKS / f"{name}.txt"
    stamp = hashlib.sha256(constraints.read_bytes()).hexdigest()[:16]
    root = os.environ.get("SWEEPER_STACK_VENVS")
    if root is None:
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
        root = str(shared / "stack-venvs")
    Path(root).mkdir(parents=True, exist_ok=True)
    with open(Path(root) / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and reuse it
        return _build(name, Path(root), stamp)


def _build(name: str, root: Path, stamp: str) -> Path:
    """The venv ``root/name`` of ``tests/fixtures/stacks/<name>.txt`` (:func:`stack_venv`), built unless its stamp
    says it is."""
    constraints = STACKS / f"{name}.txt"
    text = constraints.read_text()
    venv = root / name
    python = venv / "bin" / "python"
    if (venv / ".stamp").is_file() and (venv / ".stamp").read_text() == stamp:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pins = {line.split("==")[0]: line for line in text.split() if "==" in line}
    steps: dict[str, list[list[str]]] = {"install": [], "uninstall": []}
    for line in text.splitlines():
        for kind, found in steps.items():
            if line.startswith(f"# pip {kind}:"):
                found.append(line.split(":", 1)[1].split())
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    with open(root / "torch-wheel.lock", "w") as lock:  # the stacks share one download of the wheel
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = _torch_wheel(pins["torch"], root)
    subprocess.run(_installer(python, [str(wheel)]), check=True, timeout=900)
    for args in steps["install"] or [["-e", str(REPO), "trl"]]:
        subprocess.run(_installer(python, ["-c", str(constraints), *args]), check=True, timeout=900)
    for names in steps["uninstall"]:
        subprocess.run([*pip, "uninstall", "--quiet", "--yes", *names], check=True, timeout=300)
    (venv / ".stamp").write_text(stamp)
    return python


def run_in_venv(python: Path, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` in ``cwd`` with one thread, no PYTHONPATH and ``env`` added; its output captured (600 s
    at most).

    Python may write its bytecode there (``PYTHONDONTWRITEBYTECODE`` removed, as this project's machines set it):
    the venv is installed without it, and without a cache every process compiled what it imported again (importing
    axolotl's config validator with transformers, peft and TRL: 18-23 s a process against 7.7 s)."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return subprocess.run(
        [str(python), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": "", **env},
    )
