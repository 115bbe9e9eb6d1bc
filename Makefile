# constraints.txt pins what was tested together (pip freeze); without it the resolver backtracks for
# tens of minutes over litert-torch's and brevitas' version ranges.
# trickle: the two ways in are `make demo` (install everything, run the main job on
# embedded defaults) and `make test` (install what the tests need, lint, run them).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: venv demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	# the CPU build of torch, before anything that depends on torch
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0

venv: $(PY)

demo: $(PY)
	$(PIP) -e ".[all]"
	$(VENV)/bin/trickle demo --out runs/demo

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: $(PY)
	$(PIP) -e ".[all,dev]"
	$(MAKE) lint
	$(VENV)/bin/pytest -q

bench: $(PY)
	$(VENV)/bin/trickle bench simulator

clean:
	rm -rf $(VENV) runs build *.egg-info
	$(MAKE) -C firmware clean
