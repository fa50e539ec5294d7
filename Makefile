# Every target installs what it needs by itself: a fresh clone needs only python3.11 and make.
SHELL := /bin/bash
PY_BASE ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PYTHONPATH := $(CURDIR)/src:$(CURDIR)
export PYTHONUNBUFFERED := 1

.PHONY: help setup test check lint diagrams check-spec check-model traces demo bench mutants replay-full clean

.DEFAULT_GOAL := help

# One line per step. sglang is installed --no-deps on purpose (its full dependency list pulls CUDA wheels);
# requirements/sglang.txt holds what its imports need, so pip's report of sglang's other declared
# requirements is expected and silenced (--no-warn-conflicts). -qq keeps pip's errors, drops its warnings.
PIP_QUIET := -qq --no-warn-conflicts
$(STAMP): pyproject.toml requirements/sglang.txt
	@command -v $(PY_BASE) >/dev/null || { echo "need $(PY_BASE) on PATH"; exit 2; }
	@test -x $(PY) || { echo "[setup] virtual environment $(VENV) ($(PY_BASE))"; $(PY_BASE) -m venv $(VENV); }
	@echo "[setup] torch 2.14.1 + torchvision 0.29.1 (sglang 0.5.23's pin)"
	@$(PIP) install $(PIP_QUIET) "torch==2.14.1" "torchvision==0.29.1"
	@echo "[setup] sglang 0.5.23 (--no-deps) and the packages its imports need"
	@$(PIP) install $(PIP_QUIET) --no-deps "sglang==0.5.23"
	@$(PIP) install $(PIP_QUIET) -r requirements/sglang.txt
	@echo "[setup] this project (editable) and its test tools"
	@$(PIP) install $(PIP_QUIET) -e ".[test]"
	@touch $(STAMP)
	@echo "[setup] done: $(VENV)"

setup: $(STAMP)  ## install everything into .venv (torch, sglang 0.5.23 --no-deps and its pinned imports, this project, test tools)

help:  ## this list: every target, one line each
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/\1\t\2/' | \
	  awk -F'\t' '{ printf "  make %-13s %s\n", $$1, $$2 }'

# The development loop: lint, the core, the mirror on MCSmall against the spec (TLC's graph too, where
# ../shared/tlc holds one of this spec), and the adapters' unit tests on in-process daemons. Leaves out what
# starts real sglang servers or replays whole suites (tests/realserver, tests/demo, the replays on daemon
# processes, MCFull/MCChunks): `make test` runs those.
CHECK_TESTS := tests/test_import_graph.py tests/test_packaging.py tests/test_adapters_dispatch.py tests/layout_sm \
  tests/mirror tests/spec/test_mirror_equals_spec.py tests/oracle \
  tests/daemon_adapter/test_requests.py tests/daemon_adapter/test_hardening.py tests/daemon_adapter/test_client.py \
  tests/engine_adapter/test_compat.py tests/engine_adapter/test_plugin.py
check: $(STAMP)  ## the fast subset for the development loop (lint, core, mirror on MCSmall, adapters' unit tests)
	$(VENV)/bin/ruff check src tools tests
	$(VENV)/bin/ruff format --check src tools tests
	$(PY) -m pytest -q -x $(CHECK_TESTS)

# Two lanes (tests/conftest.py): the tests that hold the real-server lock in one, in order; every other
# module is a unit of work for either. The suite's time by directory is printed at the end, beside CI's budget.
# A short base folder of its own per run: each xdist worker adds a level, and the daemons' Unix socket
# paths under a test's folder must stay within AF_UNIX's 107 bytes.
test: $(STAMP)  ## the full suite, real sglang servers included (what CI runs)
	$(PY) -m pytest -q --durations=25 -n 2 --dist loadscope --basetemp="$$(mktemp -d /tmp/pt-XXXXXX)" tests

lint: $(STAMP)  ## ruff check and ruff format --check over src, tools and tests
	$(VENV)/bin/ruff check src tools tests
	$(VENV)/bin/ruff format --check src tools tests

diagrams: $(STAMP)  ## the state diagrams of layout_sm's machines into docs/ (needs Graphviz; installs it with apt when missing)
	@command -v dot >/dev/null || { echo "[diagrams] installing Graphviz (dot)"; \
	  (apt-get update -qq && apt-get install -y -qq graphviz) >/dev/null || \
	  { echo "Graphviz's dot is missing: install it (apt-get install graphviz) and rerun"; exit 2; }; }
	$(PY) -m layout_sm.diagrams docs

clean:  ## remove .venv, build/ and the egg-info
	rm -rf $(VENV) build *.egg-info src/*.egg-info

# Each part of the project adds its targets in mk/<part>.mk.
-include mk/*.mk
