# cmasd: `make demo` sets everything up and runs the main job; `make test` runs the tests.
# Both create and use the virtual environment .venv themselves.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A bare torch requirement pulls a multi-GB CUDA build; install this release first.
TORCH_VERSION ?= 2.13.0
# pip 24.1 and newer reject the metadata of omegaconf 2.0.x, which stock fairseq 0.12.2
# (on Python 3.10) needs through hydra-core 1.0.7; ve-fairseq (Python >= 3.11) does not.
PIP_FOR_PYTHON := import sys; print("pip<24.1" if sys.version_info < (3, 11) else "pip")

.PHONY: setup test demo clean-venv

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "$$($(PY) -c '$(PIP_FOR_PYTHON)')"
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[test,ct2]'
	touch $@

test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 tests

demo:
	@bash data-prep/demo.sh --plan
	$(MAKE) --no-print-directory setup
	bash data-prep/demo.sh

clean-venv:
	rm -rf $(VENV)
