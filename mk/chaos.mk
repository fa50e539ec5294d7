# `make chaos`: seeded fault schedules on the in-process harness (real daemon processes, rank processes
# over gloo with sglang's own code), SIGKILLs inside protocol steps, every trace checked against the
# protocol after each schedule; results in chaos-results/. Included by the main Makefile.
#   make chaos CHAOS_ARGS="--seed 7 --schedules 1 --keep"   replay one seed, keeping its traces and logs
CHAOS_ARGS ?=

.PHONY: chaos

chaos: $(STAMP)  ## seeded fault schedules (SIGKILLs inside begin, move, commit, startup), every trace validated
	$(PY) -m tools.chaos --out chaos-results $(CHAOS_ARGS)
