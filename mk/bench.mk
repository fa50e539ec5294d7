# `make bench` (issue 7): the expert-layout protocol's costs, each as a ratio to a floor measured in
# the same run, with the absolute numbers beside it; results and the machine in bench-results/.
#   make bench BENCH_ARGS="-n 500"   more repetitions per figure
# Included by the main Makefile (PY, STAMP and PYTHONPATH=src come from it).
BENCH_ARGS ?=

bench: $(STAMP)
	$(PY) -m expert_layout_demo.bench --out bench-results $(BENCH_ARGS)
