# Mutants. Included by the main Makefile.
#   make mutants   runs tests/model_based against each named mutant of tests/model_based/mutants/catalog.py
#                  (applied at import time in a subprocess, never by editing sources), prints the table
#                  mutant -> killing tests and writes it to results/mutants.md. MUTANTS=a,b runs some only.
#                  Bounded: each mutant run has MUTANT_TIMEOUT seconds (a timeout counts as killed,
#                  and the table says so).
MUTANTS ?=
MUTANT_TIMEOUT ?= 600

.PHONY: mutants

mutants: $(STAMP)  ## break each protocol rule on purpose and list the tests that fail (results/mutants.md)
	$(PY) -m tests.model_based.mutants.run --timeout $(MUTANT_TIMEOUT) --doc results/mutants.md \
	  $(if $(MUTANTS),--only $(MUTANTS))
