# Every target creates or updates .venv from pyproject.toml + requirements.lock first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export MPLBACKEND ?= Agg
export NO_MKDOCS_2_WARNING ?= 1

.PHONY: demo test lint docs bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c requirements.lock --upgrade pip
	$(PY) -m pip install --quiet -c requirements.lock --build-constraint requirements.lock -e '.[test,docs]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m lineax_seq demo

lint: $(STAMP)
	$(VENV)/bin/ruff check lineax_seq tests benchmarks tutorials
	$(VENV)/bin/ruff format --check lineax_seq tests benchmarks tutorials
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(VENV)/bin/pyright

test: lint
	$(PY) -m pytest -n 2 --dist loadfile -q
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site

docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

# ssm_torch.py's competitor: PyTorch's CPU build (not a dependency of the library),
# unless a PyTorch that sees a GPU is installed, which is kept (ssm_torch.py compares on
# the device JAX runs on, and skips itself, exit 0, when PyTorch cannot run there).
bench: $(STAMP)
	$(PY) -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
	$(PY) benchmarks/ssm.py
	$(PY) benchmarks/ssm_torch.py
	$(PY) benchmarks/data.py
	$(PY) benchmarks/koopman.py
	$(PY) benchmarks/bst.py
	$(PY) benchmarks/bst_decode.py
	$(PY) benchmarks/bigs.py

clean:
	rm -rf $(VENV) site .pytest_cache
