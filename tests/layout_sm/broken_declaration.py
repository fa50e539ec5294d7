"""A declaration of the daemon machine broken on purpose, for the tests that must see it fail."""

from __future__ import annotations

import pytest

from layout_sm.daemon import DaemonMachine, DaemonView
from layout_sm.declared import Declared


def without_guard(monkeypatch: pytest.MonkeyPatch, event: str, source: str, conjunct: str) -> None:
    """Drop ``conjunct`` from the guards declared on ``event``'s accepting transition out of the
    phase ``source`` (undone with ``monkeypatch``), and make the machine read its declarations again:
    what the diagram draws, the runner runs."""
    state = next(s for s in DaemonMachine.states if s.value == source)
    transition = next(t for t in state.transitions if event in {str(e) for e in t.events} and list(t.cond))
    dropped = [spec for spec in transition.cond if str(spec.func) == conjunct]
    assert len(dropped) == 1, f"{conjunct!r} is not one of {event}'s guards"
    specs = transition.cond.list  # the transition's callbacks, guards and actions alike
    monkeypatch.setattr(specs, "items", [spec for spec in specs.items if spec is not dropped[0]])
    table = Declared(DaemonMachine, DaemonView, "phase")  # read again, from the broken declaration
    monkeypatch.setattr(DaemonMachine, "declared", classmethod(lambda cls: table))
