# Every target installs what it needs by itself: a fresh clone needs only python3.11 and make.
SHELL := /bin/bash
PY_BASE ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)/src:$(CURDIR)
export PYTHONUNBUFFERED := 1

.PHONY: setup test lint diagrams check-spec check-model traces demo bench mutants replay-full clean

$(STAMP): pyproject.toml requirements/sglang.txt
	@command -v $(PY_BASE) >/dev/null || { echo "need $(PY_BASE) on PATH"; exit 2; }
	@test -x $(PY) || $(PY_BASE) -m venv $(VENV)
	@echo "[setup] torch 2.14.1 + torchvision 0.29.1 (sglang 0.5.23's pin)"
	$(PIP) install -q "torch==2.14.1" "torchvision==0.29.1"
	@echo "[setup] sglang 0.5.23 (--no-deps) and the packages its imports need"
	$(PIP) install -q --no-deps "sglang==0.5.23"
	$(PIP) install -q -r requirements/sglang.txt
	@echo "[setup] this project (editable) and its test tools"
	$(PIP) install -q -e ".[test]"
	@touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q --durations=25 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check src tools tests
	$(VENV)/bin/ruff format --check src tools tests

diagrams: $(STAMP)
	@command -v dot >/dev/null || { echo "[diagrams] installing Graphviz (dot)"; \
	  (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null || \
	  { echo "Graphviz's dot is missing: install it (apt-get install graphviz) and rerun"; exit 2; }; }
	$(PY) -m layout_sm.diagrams docs

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

# Each part of the project adds its targets in mk/<part>.mk.
-include mk/*.mk
