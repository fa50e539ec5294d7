# Trace replay. Included by the main Makefile.
#   make replay-full   every behaviour of every committed suite (tests/model_based/traces/) against
#                      real daemon processes (`make test` runs the whole MCSmall suite on in-process
#                      serve loops and a sample of both suites on daemon processes)
#   make suites        rebuild the suites from TLC's graphs in ../shared/tlc/ (<Model>.dot.gz; refused when
#                      stale); `make traces` (mk/spec.mk) does the same after running TLC where it can
.PHONY: replay-full suites

replay-full: $(STAMP)  ## every behaviour of every committed TLC suite against real daemon processes
	REPLAY_FULL=1 $(PY) -m pytest -q -p no:cacheprovider --timeout=0 -s \
	  tests/model_based/test_replay_adapters.py tests/model_based/test_replay_mirror.py

suites: $(STAMP)  ## rebuild the trace suites from TLC's graphs in ../shared/tlc/
	$(PY) -m tests.model_based.suites
