"""Render each protocol machine as a picture with python-statemachine's own diagram output.

The pictures come from the classes themselves, so they cannot drift from the code.
Usage: ``python -m layout_sm.diagrams OUT_DIR`` (needs Graphviz's ``dot``; ``make diagrams``
installs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from statemachine import StateMachine
from statemachine.contrib.diagram import DotGraphMachine

from layout_sm.daemon import DaemonMachine
from layout_sm.engine import EngineView
from layout_sm.engine_machines import EngineState, RebalanceMachine, StandbyMachine, StartupMachine


def machines() -> dict[str, StateMachine | type[StateMachine]]:
    """Each machine, keyed by the picture's file stem: the engine's as instances in their initial phase; the
    daemon's as its class (its instances skip python-statemachine's ``__init__``: ``layout_sm.daemon``), which
    python-statemachine draws from the same declarations."""
    return {
        "daemon_machine": DaemonMachine,
        "startup_machine": StartupMachine(model=EngineState(EngineView.fresh("", 1), None), state_field="phase"),
        "rebalance_machine": RebalanceMachine(
            model=EngineState(EngineView.fresh("", 1), None), state_field="rebalance"
        ),
        "standby_machine": StandbyMachine(model=EngineState(EngineView.fresh("", 1), None), state_field="role"),
    }


def render(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, machine in machines().items():
        graph = DotGraphMachine(machine)()
        for fmt in ("png", "svg"):
            path = out_dir / f"{stem}.{fmt}"
            path.write_bytes(graph.create(format=fmt))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out_dir = Path(args[0] if args else "docs")
    for path in render(out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
