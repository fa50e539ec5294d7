# `make chaos`: seeded fault schedules, every trace checked against the protocol after each one:
# 500 on the in-process harness (real daemon processes, rank processes over gloo running sglang's own
# code, SIGKILLs inside protocol steps and daemon reloads, repairs and rejoins), then 5 on real sglang
# servers (a server SIGKILLed at a stop point; a fresh server, a warm standby's takeover, or a standby
# killed inside it; the one that serves checked against the daemons' memory and a disk reference).
# Results in chaos-results/. The real servers run under /tmp/realserver.lock, as every real-server
# command does.
#   make chaos CHAOS_ARGS="--schedules 50 --real 0"                  a short harness run
#   make chaos CHAOS_ARGS="--seed 7 --schedules 1 --real 0 --keep"  replay one seed, keeping its traces and logs
#   make chaos CHAOS_ARGS="--schedules 100 --real 0 --tlc"          TLC on every schedule's traces too
# Included by the main Makefile.
CHAOS_ARGS ?=

.PHONY: chaos

chaos: $(STAMP)  ## seeded fault schedules on the harness and on real servers, every trace validated (chaos-results/)
	flock /tmp/realserver.lock $(PY) -m tools.chaos --out chaos-results $(CHAOS_ARGS)
