"""A frozen view with some fields changed, for the views a step changes many times."""

from __future__ import annotations

from typing import Any, TypeVar

View = TypeVar("View")


def copied_with(view: View, changes: dict[str, Any]) -> View:
    """``view`` with ``changes``: its fields copied, where ``dataclasses.replace`` would run
    ``__init__`` again. A chunk changes the engine's and the daemons' views a dozen times, and
    ``replace`` was most of the session's time per chunk in ``make bench`` (the 1-rank chunk's
    row). The caller normalizes what its ``__post_init__`` would (``DaemonView.evolve``)."""
    new = object.__new__(type(view))
    new.__dict__.update(view.__dict__)
    new.__dict__.update(changes)
    return new
