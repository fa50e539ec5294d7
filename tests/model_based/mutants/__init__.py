"""The mutant harness of `make mutants` (see `run.py` and results/mutants.md)."""
