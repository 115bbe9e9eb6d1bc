# constraints.txt pins what was tested together (pip freeze); without it the resolver backtracks for
# tens of minutes over litert-torch's and brevitas' version ranges.
# trickle: the two ways in are `make demo` (install everything, run the main job on
# embedded defaults) and `make test` (install what the tests need, lint, run them).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: venv demo test test-fast test-edge test-docs docs docs-pictures lint bench clean native

# the exact engine's hot path, compiled with mypyc (3-4x faster, byte-identical results); without a C
# compiler and Python headers the build is skipped and the same modules run as Python
NATIVE_SRC := simulator/capacitor.py simulator/node.py

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	# the CPU build of torch, before anything that depends on torch
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0

venv: $(PY)

demo: $(PY)
	$(PIP) -e ".[all]"
	$(MAKE) native
	$(VENV)/bin/trickle demo --out runs/demo

lint: $(PY)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

test: $(PY)
	$(PIP) -e ".[all,dev]"
	$(MAKE) native
	$(MAKE) lint
	$(VENV)/bin/pytest -q
	$(MAKE) test-edge

# the documentation site (docs/, mkdocs.yml) into site/: strict, so a warning, a broken link or a
# missing reference fails it; `make test` builds it too (tests/docs/test_site.py)
docs: $(PY)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet
	@echo "the site is in site/ (open site/index.html, or serve it: $(VENV)/bin/mkdocs serve)"

# the docs tier: the site's strict build and every tutorial run as written (tests/docs)
test-docs: $(PY)
	$(VENV)/bin/pytest -q tests/docs

# the site's pictures, drawn by the project's own code (docs/pictures.py); the dashboard's come from
# its browser test
docs-pictures: $(PY)
	$(PY) docs/pictures.py
	TRICKLE_SCREENSHOTS=docs/images $(VENV)/bin/pytest -q -p no:cacheprovider tests/server/api/test_dashboard.py

# the tests that need no model training, server, broker, database, firmware build or browser (markers
# are applied in tests/conftest.py): the loop to run while working, well under 90 s
FAST := not (slow or needs_torch or needs_broker or needs_postgres or needs_qemu or browser)
test-fast: $(PY)
	$(VENV)/bin/pytest -q -m "$(FAST)"

# the edge tier's tests on the edge tier's install alone (trickle[edge,dev-edge]: no torch, no server)
EDGE_VENV ?= .venv-edge
test-edge:
	test -x $(EDGE_VENV)/bin/python || $(PYTHON) -m venv $(EDGE_VENV)
	$(EDGE_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[edge,dev-edge]"
	$(EDGE_VENV)/bin/python -c "import importlib.util as u, sys; sys.exit('torch is installed' if u.find_spec('torch') else 0)"
	$(EDGE_VENV)/bin/pytest -q -p no:cacheprovider tests/edge

bench: $(PY)
	$(MAKE) native
	$(VENV)/bin/trickle bench simulator

native: build/native.stamp

build/native.stamp: $(NATIVE_SRC)
	@mkdir -p build
	@if [ -x $(VENV)/bin/mypyc ] && $(PY) -c "from setuptools import setup; from mypyc.build import mypycify; \
		setup(name='trickle-native', ext_modules=mypycify('$(NATIVE_SRC)'.split(), group_name='simulator._native'), \
		script_args=['build_ext', '--inplace'])" >build/mypyc.log 2>&1; then \
		echo "simulator core compiled with mypyc"; \
	else \
		rm -f simulator/*.so; \
		echo "simulator core not compiled (no mypyc, C compiler or Python headers; see build/mypyc.log): it runs as Python"; \
	fi
	@touch $@

clean:
	rm -rf $(VENV) runs build site *.egg-info simulator/*.so
	$(MAKE) -C firmware clean
