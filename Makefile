# cmasd: `make demo` sets everything up and runs the main job; `make test` runs the tests.
# Both create and use the virtual environment .venv themselves.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A bare torch requirement pulls a multi-GB CUDA build; install this release first.
TORCH_VERSION ?= 2.13.0

.PHONY: setup test demo clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

test: setup
	$(PY) -m pytest -q tests

demo: setup
	bash data-prep/demo.sh

clean-venv:
	rm -rf $(VENV)
