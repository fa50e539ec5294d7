"""The engine machines' model, its state: the engine's view, and the state fields the machines
read from it and write into it (docs/protocol.md §5, §6, §10)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from layout_sm.engine import (
    EngineLayout,
    EngineView,
    RankFinding,
)
from layout_sm.frozen import copied_with
from layout_sm.reasons import Reason, Reply
from layout_sm.record import DigestCache


def _put(values: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*values[:i], value, *values[i + 1 :])


def _evolve(view: EngineView, changes: dict[str, Any]) -> EngineView:
    return copied_with(view, changes)  # EngineView has no field to check or derive


def _reason_of(reply: object) -> Reason:
    """The reason code of a daemon's reply (``unreadable`` for a reply without one: sglang's own)."""
    try:
        return Reply.from_wire(reply).reason
    except ValueError:
        return Reason.UNREADABLE


def _ranks_where(findings: Sequence[RankFinding], kind: str) -> list[RankFinding]:
    return [f for f in findings if f.kind == kind]


def _ranks_true(flags: Sequence[bool]) -> frozenset[int]:
    return frozenset(rank for rank, flag in enumerate(flags) if flag)


def _listing(findings: Sequence[RankFinding]) -> str:
    return "; ".join(f"rank {f.rank}: {f.detail}" for f in findings)


class _ViewField:
    """A machine's state field (``model.<name>`` for python-statemachine) kept in the engine's view:
    read from it, and written into it only when the value changes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, state: EngineModel | None, owner: type | None = None) -> Any:
        return self if state is None else getattr(state.view, self.name)

    def __set__(self, state: EngineModel, value: str) -> None:
        if value != getattr(state.view, self.name):
            state.view = _evolve(state.view, {self.name: value})


class EngineModel:
    """What the engine machines' model keeps: the one place the session's protocol state is kept
    (``view``). The guards and actions are the rules' (``StartupRules``, ``RebalanceRules``,
    ``StandbyRules``), gathered in ``layout_sm.engine_machines.EngineState``.

    ``phase`` and ``rebalance`` are the machines' state fields, read from the view and written
    into it when a transition enters its target. Guards read the view, the engine's own layout
    and the event's arguments; actions replace the view and return the step's ``Step``.
    """

    __slots__ = ("digests", "layout", "view")

    def __init__(self, view: EngineView, layout: EngineLayout | None) -> None:
        self.view = view
        self.layout = layout  # None only for an engine that never attached
        # The moved map's digest hashes again only the rows that changed: not state, a cache.
        self.digests = DigestCache()

    phase = _ViewField()
    rebalance = _ViewField()

    @property
    def role(self) -> str:
        return self.view.role

    @role.setter
    def role(self, value: str) -> None:
        if value != self.view.role:
            self.view = _evolve(self.view, {"role": value})

    def _set(self, **changes: Any) -> None:
        self.view = _evolve(self.view, changes)
