# `make bench`: the expert-layout protocol's costs, each as a ratio to a floor measured
# in the same run, with the absolute numbers beside it; results and the machine in bench-results/.
# The last part starts real sglang servers (ready time with/without the plugin, EPLB rebalance wall
# time with/without the protocol): a few minutes on 2 cores.
#   make bench BENCH_ARGS="-n 500"              more repetitions per figure
#   make bench BENCH_ARGS="--real-repeats 5"    five servers per side for each real figure (the ready time takes 5 at least)
#   make bench BENCH_ARGS=--no-real             skip the real-server part
# Included by the main Makefile (PY, STAMP and PYTHONPATH=src come from it).
BENCH_ARGS ?=

bench: $(STAMP)  ## the protocol's costs against floors measured in the same run, real servers included (BENCH_ARGS=--no-real skips them)
	$(PY) -m tools.bench --out bench-results $(BENCH_ARGS)
