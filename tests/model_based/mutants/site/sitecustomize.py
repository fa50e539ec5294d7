"""Loaded at interpreter start when this folder is on PYTHONPATH (only `make mutants` puts it there)."""

import os

if os.environ.get("LAYOUT_MUTANT"):
    from tests.model_based.mutants.hook import install

    install()
