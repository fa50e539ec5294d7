# `make demo`: the upstream GPU cases of the expert-layout protocol on real sglang servers
# (`python -m sglang.launch_server`, TP2/EP2, a tiny Qwen3-MoE built under build/), on CPU through the
# test-only CPU bridge; results table, `expert-layout status` runs, picture and sglang's logs in
# demo-results/ (within 10 minutes and 16 GB on 2 cores, both measured and reported).
#   make demo                 every case on real servers
#   make demo-harness         the same cases on the in-process harness (rank processes over gloo, no HTTP)
#   make demo-harness DEMO_ARGS=--quick   the reduced harness run the CI test uses
#   make demo-cluster         the two-node cases on real servers (tests/realserver/test_two_nodes.py), a node lost and rejoined included
# Included by the main Makefile (PY, PIP, VENV, STAMP and PYTHONPATH=src come from it).
DEMO_STAMP := $(VENV)/.demo-installed
DEMO_ARGS ?=

.PHONY: demo-harness demo-cluster

# matplotlib draws the picture only; python-dateutil stays below 3 because sglang 0.5.23 pins it.
$(DEMO_STAMP): $(STAMP) mk/demo.mk
	@echo "[setup] matplotlib for the demo's picture"
	@$(PIP) install $(PIP_QUIET) "matplotlib==3.11.2" "python-dateutil<3"
	@touch $@

demo: $(DEMO_STAMP)  ## the main job: the bug, then the protocol preventing it, on real sglang servers (CPU); results in demo-results/
	$(PY) -m tools.demo.real --out demo-results $(DEMO_ARGS)

demo-harness: $(DEMO_STAMP)  ## the same cases on the in-process harness (rank processes over gloo, no HTTP), in a few minutes
	$(PY) -m tools.demo.harness --out demo-results/harness $(DEMO_ARGS)

demo-cluster: $(DEMO_STAMP)  ## the protocol across two nodes on real sglang servers (a node lost and rejoined included); results in demo-results/cluster/
	$(PY) -m tools.demo.cluster --out demo-results/cluster $(DEMO_ARGS)
