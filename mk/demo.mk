# `make demo` (issue 7): the upstream GPU cases of the expert-layout protocol, reproduced on CPU
# with real daemon processes, real 2-rank engine processes over gloo and sglang's real EPLB code.
#   make demo                       every case; table + picture in demo-results/ (< 5 min on 2 cores)
#   make demo DEMO_ARGS=--quick     the reduced run the CI test uses
# Included by the main Makefile (PY, PIP, VENV, STAMP and PYTHONPATH=src come from it).
DEMO_STAMP := $(VENV)/.demo-installed
DEMO_ARGS ?=

# matplotlib draws the picture only; python-dateutil stays below 3 because sglang 0.5.23 pins it.
$(DEMO_STAMP): $(STAMP) mk/demo.mk
	@echo "[setup] matplotlib for the demo's picture"
	$(PIP) install -q "matplotlib==3.11.2" "python-dateutil<3"
	@touch $@

demo: $(DEMO_STAMP)
	$(PY) -m expert_layout_demo --out demo-results $(DEMO_ARGS)
