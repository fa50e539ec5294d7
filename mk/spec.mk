# The spec, TLC and the mirror (issue 3). Included by the main Makefile.
#   make check-spec   TLC on every model (needs Java and tla2tools.jar: TLA2TOOLS_JAR or the cached release)
#   make check-model  the mirror explorer on every model, with the spec's invariants; graphs in build/mirror/
#   make traces       edge-covering behaviours for tests/model_based/traces/ from TLC's graphs: dumped here
#                     when TLC runs here, else ../shared/tlc/<Model>.dot.gz (refused when stale)
SPEC_MODELS := MCSmall MCFull

.PHONY: check-spec check-model traces

check-spec: $(STAMP)
	$(PY) -m layout_model.check_spec --spec-dir spec $(foreach m,$(SPEC_MODELS),--model $(m))

check-model: $(STAMP)
	$(PY) -m layout_model.explore $(SPEC_MODELS) --spec-dir spec --dot-dir build/mirror

traces: $(STAMP)
	@rc=0; $(PY) -m layout_model.check_spec --spec-dir spec --dump build/tlc --no-fetch \
	  $(foreach m,$(SPEC_MODELS),--model $(m)) || rc=$$?; \
	if [ $$rc -eq 0 ]; then \
	  for m in $(SPEC_MODELS); do $(PY) -m tests.model_based.suites --model $$m --dot build/tlc/$$m.dot || exit 1; done; \
	elif [ $$rc -eq 2 ]; then \
	  echo "traces: no TLC here; deriving from TLC's graphs in ../shared/tlc/"; \
	  $(PY) -m tests.model_based.suites; \
	else \
	  echo "traces: TLC found a violation: no suite derived"; exit 1; \
	fi
