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

# glibc's malloc hands freed blocks above its mmap threshold back to the kernel and maps
# them anew (zeroed pages) for the next batch. With the threshold at its largest (32 MiB)
# and no trimming, the tests' training and decoding stay in the heap: fairseq-train of the
# tiny verifier took 8-12% less wall time, system time 3.1 -> 0.9 s (docs/results/tests.md).
# The tests' own processes inherit it.
TEST_MALLOC := MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296

test: setup
	$(TEST_MALLOC) $(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 tests

demo:
	@bash data-prep/demo.sh --plan
	$(MAKE) --no-print-directory setup
	bash data-prep/demo.sh

clean-venv:
	rm -rf $(VENV)
