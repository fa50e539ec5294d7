# `make chaos`: seeded fault schedules, every trace checked against the protocol after each one:
# 500 on the in-process harness (real daemon processes, rank processes over gloo running sglang's own
# code, SIGKILLs inside protocol steps and daemon reloads, repairs and rejoins, a commit's reply lost,
# its request lost or its rows refused), then 5 on real sglang servers (a server SIGKILLed at a stop
# point; a fresh server, a warm standby's takeover, or a standby killed inside it; the one that serves
# checked against the daemons' memory and a disk reference). A restart of the daemons, or a rejoin
# refused, that the schedule did not cause fails it. Every schedule's traces are checked by the Python
# checker and by the independent oracle (tools.oracle, the spec without layout_sm); TLC checks a
# seeded one in ten schedules and every failing one where its jar is found (TLA2TOOLS_JAR; the
# summary says when it is not).
# Results in chaos-results/. The real servers run under /tmp/realserver.lock, as every real-server
# command does.
#   make chaos CHAOS_ARGS="--schedules 50 --real 0"                  a short harness run
#   make chaos CHAOS_ARGS="--seed 7 --schedules 1 --real 0 --keep"  replay one seed, keeping its traces and logs
#   make chaos CHAOS_ARGS="--schedules 100 --real 0 --tlc"          TLC on every schedule's traces
#   make chaos CHAOS_ARGS="--schedules 100 --real 0 --no-tlc"       no TLC, only the Python checkers
# Included by the main Makefile.
CHAOS_ARGS ?=

.PHONY: chaos

chaos: $(STAMP)  ## seeded fault schedules on the harness and on real servers, every trace validated (chaos-results/)
	flock /tmp/realserver.lock $(PY) -m tools.chaos --out chaos-results $(CHAOS_ARGS)
