# The spec, TLC and the mirror. Included by the main Makefile.
#   make check-spec   TLC on every model and every witness of spec/Scenarios.tla (needs Java and
#                     tla2tools.jar: TLA2TOOLS_JAR); exit 2, saying what was not checked, without them
#   make witnesses    the witnesses again, their -dumpTrace json written to tests/model_based/witnesses/
#   make spec-mutants each named rule of the spec broken in a temporary copy, TLC on the small models;
#                     the table goes to results/spec-mutants.md (SPEC_MUTANTS=a,b runs some only)
#   make check-model  the mirror explorer on every model, with the spec's invariants; graphs in build/mirror/
#   make check-traces TLC (spec/TraceLayoutProtocol.tla) and the Python checker on a run's traces:
#                     TRACES=folder... (the demo's by default); exit 2, saying so, without TLC
#   make traces       edge-covering behaviours for tests/model_based/traces/ from TLC's graphs: dumped here
#                     when TLC runs here, else ../shared/tlc/<Model>.dot.gz (refused when stale)
SPEC_MODELS := MCSmall MCFull MCChunks MCRepair MCRepairFails MCStandby MCTwoStandbys MCStandbyRepair MCRejoin
TRACE_MODELS := MCSmall MCFull MCStandby MCRejoin  # the models with committed suites (tests/model_based/suites.py)
SPEC_MUTANTS ?=

TRACES ?= demo-results/logs

.PHONY: check-spec check-model check-traces traces witnesses spec-mutants

check-spec: $(STAMP)  ## TLC on every model and witness (needs Java and TLA2TOOLS_JAR; says what is missing otherwise)
	$(PY) -m tools.mirror.check_spec --spec-dir spec $(foreach m,$(SPEC_MODELS),--model $(m)) \
	  --witnesses --traces build/witnesses

check-traces: $(STAMP)  ## TLC and the Python checker on a run's traces, same verdict (TRACES=folder...; needs TLC)
	$(PY) -m tools.mirror.trace_tla $(TRACES)

witnesses: $(STAMP)  ## TLC's witnesses again, their traces written to tests/model_based/witnesses/
	$(PY) -m tools.mirror.check_spec --spec-dir spec --no-models --witnesses --traces build/witnesses
	$(PY) -m tests.model_based.witness_traces --from build/witnesses

spec-mutants: $(STAMP)  ## break each rule of the spec and run TLC on it (results/spec-mutants.md; needs TLC)
	$(PY) -m tools.mirror.spec_mutants --spec-dir spec --doc results/spec-mutants.md \
	  $(if $(SPEC_MUTANTS),--only $(SPEC_MUTANTS))

check-model: $(STAMP)  ## the mirror (layout_sm composed) explored on every model with the spec's invariants; graphs in build/mirror/
	$(PY) -m tools.mirror.explore $(SPEC_MODELS) --spec-dir spec --dot-dir build/mirror

traces: $(STAMP)  ## edge-covering behaviours from TLC's graphs for tests/model_based/traces/
	@rc=0; $(PY) -m tools.mirror.check_spec --spec-dir spec --dump build/tlc \
	  $(foreach m,$(TRACE_MODELS),--model $(m)) || rc=$$?; \
	if [ $$rc -eq 0 ]; then \
	  for m in $(TRACE_MODELS); do $(PY) -m tests.model_based.suites --model $$m --dot build/tlc/$$m.dot || exit 1; done; \
	elif [ $$rc -eq 2 ]; then \
	  echo "traces: no TLC here; deriving from TLC's graphs in ../shared/tlc/"; \
	  $(PY) -m tests.model_based.suites; \
	else \
	  echo "traces: TLC found a violation: no suite derived"; exit 1; \
	fi
