# `make chaos`: seeded fault schedules, every trace checked against the protocol after each one:
# 500 on the in-process harness (real daemon processes, rank processes over gloo running sglang's own
# code, SIGKILLs inside protocol steps), then 5 on real sglang servers (a server SIGKILLed at a stop
# point, the next one checked against the daemons' memory and a disk reference). Results in
# chaos-results/. The real servers run under /tmp/realserver.lock, as every real-server command does.
#   make chaos CHAOS_ARGS="--schedules 50 --real 0"                  a short harness run
#   make chaos CHAOS_ARGS="--seed 7 --schedules 1 --real 0 --keep"  replay one seed, keeping its traces and logs
# Included by the main Makefile.
CHAOS_ARGS ?=

.PHONY: chaos

chaos: $(STAMP)  ## seeded fault schedules on the harness and on real servers, every trace validated (chaos-results/)
	flock /tmp/realserver.lock $(PY) -m tools.chaos --out chaos-results $(CHAOS_ARGS)
