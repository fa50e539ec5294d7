"""The mutant harness of `make mutants` (see `run.py` and docs/mutants.md)."""
