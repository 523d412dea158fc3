"""Shared fixtures: a tiny Llama built once per session, a working folder per test, and the marks by cost. The
helpers the tests share live in :mod:`sweeper.testing`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# datasets.load_dataset of a local file sends the hub a request counting the load (increase_load_count); without a
# network its name lookup sometimes waits out the resolver's 5 s timeout (seen in the fast suite, once a session). Set
# before datasets is imported (it reads the variable at import), for this process and the sweeps and trial processes
# the tests start.
os.environ.setdefault("HF_UPDATE_DOWNLOAD_COUNTS", "0")

# build_tiny_model for the fixtures below; REPO and write_space for tests/test_old_study.py, kept as it was written.
from sweeper.testing import REPO, build_tiny_model, write_space  # noqa: F401

#: Marks of tests that cost more than a real trial; each is also ``slow``, so that ``-m "not slow"`` is the fast suite.
_COSTLY = ("browser", "postgres", "network", "demo")


def pytest_collection_modifyitems(config, items):
    """Mark ``browser``, ``postgres``, ``network`` and ``demo`` tests ``slow`` as well; run the demo and then the
    ``network`` tests first (the sort is stable: the rest keep their order); skip the tests marked ``gpu``
    where no CUDA device is visible (CI, this project's CPU machines): they run in ``benchmarks/gpu/gpu_check.sh`` on a
    GPU. Whether CUDA is visible is asked of the driver without importing torch."""
    from sweeper.devices import cuda_visible

    for item in items:
        if any(mark in item.keywords for mark in _COSTLY):
            item.add_marker(pytest.mark.slow)
    # The longest first (the demo, then the export stacks' venv builds), so that `make test`'s two workers
    # (pytest-xdist, whole files to a worker) do not end with one of them alone on a five-minute test.
    items.sort(key=lambda item: 0 if "demo" in item.keywords else 1 if "network" in item.keywords else 2)
    if cuda_visible():
        return
    skip = pytest.mark.skip(reason="needs CUDA (run benchmarks/gpu/gpu_check.sh on a GPU)")
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


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """An empty working directory (studies/ is written here) with a private model cache."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    return tmp_path
