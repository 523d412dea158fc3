"""Shared fixtures: a tiny Llama built once per session, space files written into a temporary folder, and a way
to run the ``sweep`` command there as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from sweeper.testing import build_tiny_model

REPO = Path(__file__).resolve().parents[1]


#: Marks of tests that cost more than a real trial; each is also ``slow``, so that ``-m "not slow"`` is the fast suite.
_COSTLY = ("browser", "postgres", "network")


def pytest_collection_modifyitems(config, items):
    """Mark ``browser``, ``postgres`` and ``network`` tests ``slow`` as well; skip the tests marked ``gpu`` where no
    CUDA device is visible (CI, this project's CPU machines): they run in ``benchmarks/gpu_check.sh`` on a GPU.
    Whether CUDA is visible is asked of the driver without importing torch."""
    from sweeper.trial import cuda_visible

    for item in items:
        if any(mark in item.keywords for mark in _COSTLY):
            item.add_marker(pytest.mark.slow)
    if cuda_visible():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run benchmarks/gpu_check.sh on a GPU)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path, monkeypatch):
    """Every test runs in its own empty working directory, so that the ``studies/`` folder which in-process code
    writes (trial folders, ``study.json``, exports) is the test's own, never the checkout's or another test's."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer Llama (hidden 64) and its BPE tokenizer, saved as a checkpoint directory."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def tiny_model_extra_token(tmp_path_factory) -> Path:
    """The tiny Llama with a tokenizer that has one token more than the model has embedding rows: ``<|tool|>``."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama-extra"), added_tokens=("<|tool|>",))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` as JSON lines and return ``path``."""
    import json

    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty working directory (studies/ is written here) with a private model cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    return tmp_path


def tiny_space(
    model: Path,
    *,
    name: str = "t",
    search: dict | None = None,
    training: dict | None = None,
    n_trials: int = 2,
    max_samples: int = 32,
) -> dict:
    """A space on the tiny model that trains in about a second per trial."""
    return {
        "study": {"name": name, "n_trials": n_trials, "seed": 0},
        "model": {"name_or_path": str(model)},
        "dataset": {"path": "builtin:pydoc-topics", "max_samples": max_samples},
        "training": {
            "max_steps": 3,
            "memory_limit_gib": 4,
            "trial_timeout": "3m",
            "max_seq_length": 64,
            "optim": "adamw_torch",
            **(training or {}),
        },
        "search": search if search is not None else {"r": [4, 8]},
    }


def data_nan_space(model: Path) -> dict:
    """Two trials on the tiny model, max_seq_length 16 or 64 at batch 1: at 16 tokens the built-in samples' question
    fills the row, no reply token is left and every step's loss is 0/0 (a NaN caused by the data)."""
    space = tiny_space(
        model, search={"max_seq_length": [16, 64]}, training={"per_device_train_batch_size": 1}, n_trials=2
    )
    space["study"]["sampler"] = "random"
    del space["training"]["max_seq_length"]
    return space


def write_space(folder: Path, space: dict, name: str = "space.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def sweep(*args: str, cwd: Path, timeout: float = 600, **popen) -> subprocess.CompletedProcess:
    """Run ``sweep ARGS`` in ``cwd`` as a subprocess (``python -m sweeper.cli``) and capture its output."""
    popen.setdefault("env", {**os.environ})
    return subprocess.run(
        [sys.executable, "-m", "sweeper.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, **popen
    )
