# Every target installs what it needs into .venv first, so a fresh clone needs only python3.11.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo-out

.PHONY: install demo test bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch 2.13.0 first, alone, from TORCH_INDEX when set. Empty (the default): pip's configured
# index, where on Linux `torch==2.13.0` from PyPI is the CUDA build (with its multi-GB CUDA
# libraries), unless pip is configured with a local CPU wheel. A CPU-only machine:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e ".[test,lint]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh $(DEMO_DIR)

# One pytest worker per core (pytest-xdist), a test file at a time: a file's module-scoped
# fixture (a multi-process launch, real solves) then runs once, and tests that read what an
# earlier test of their file saw stay in order. (xdist's loadgroup marks are a no-op under
# pytest 9.2.)
# The slowest files go first (tests/conftest.py's SLOWEST_FIRST; xdist's own reorder off).
test: $(STAMP)
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder

bench: $(STAMP)
	$(PY) -m bench

# mypy reads its settings from pyproject.toml: strict on solvers/, autoplan/cost and
# autoplan/plan, the default elsewhere.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache .ruff_cache .mypy_cache
