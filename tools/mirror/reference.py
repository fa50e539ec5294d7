"""The machines stepped by python-statemachine's own engine: the reference for ``layout_sm.declared``.

The product's ``EngineSession`` and ``DaemonMachine`` take each event from their machines' declarations
through ``layout_sm.declared``. These subclasses send the same events to python-statemachine instances
of the same classes over the same model, so that a test or the mirror can hold the two readings of one
declaration to the same steps.
"""

from __future__ import annotations

from typing import Any

from statemachine import StateMachine

from layout_sm.daemon import DaemonMachine, DaemonState
from layout_sm.declared import Declared
from layout_sm.record import LayoutRecord
from layout_sm.session import EngineSession


class ReferenceEngineSession(EngineSession):
    """``EngineSession`` whose steps run through python-statemachine's ``send``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._machines: dict[str, StateMachine] = {}
        super().__init__(*args, **kwargs)

    def _fire(self, table: Declared, event: str, **kwargs: Any) -> Any:
        return self._machine(table).send(event, **kwargs)

    def _machine(self, table: Declared) -> StateMachine:
        # A machine in a final state takes no more events: one is made anew after a restore left it.
        machine = self._machines.get(table.state_field)
        final = table.states[getattr(self.model, table.state_field)].final
        if machine is None or (machine.is_terminated and not final):
            machine = table.machine(model=self.model, state_field=table.state_field)
            self._machines[table.state_field] = machine
        return machine


class ReferenceDaemonMachine(DaemonMachine):
    """``DaemonMachine`` as python-statemachine builds it (its own ``__init__``, callbacks registered for
    this instance), so that ``send`` runs an event through python-statemachine's engine."""

    def __init__(self, record: LayoutRecord | None = None, auto_repair: bool = True) -> None:
        StateMachine.__init__(self, model=DaemonState(), state_field="phase")
        event = "loaded_with_record" if record is not None else "loaded_without_record"
        self.send(event, record=record, auto_repair=auto_repair)


__all__ = ["ReferenceDaemonMachine", "ReferenceEngineSession"]
