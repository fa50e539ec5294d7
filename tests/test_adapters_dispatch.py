"""Adapters only dispatch (docs/protocol.md §2): no protocol decision in their sources.

An adapter hands ``layout_sm`` what arrived and does what the machine gives back; comparing a claim
state, a phase, a role or a reply status itself, or writing a reply itself, is a protocol decision
outside the core. The scan reads every module of ``src/engine_adapter`` and ``src/daemon_adapter``
(``ast``) and fails, naming file:line, on:

- a comparison (``==``, ``!=``, ``in``, ``is``, ... or a ``match`` case) one of whose sides holds a
  protocol value: a string of the spec's, a reply status (``Status.*``), or a phase constant of
  ``layout_sm`` (``CLEAN``, ``REPAIRING``, ...);
- a comparison of a machine's state: one side reads a ``phase``, ``role``, ``rebalance``,
  ``rebalance_phase``, ``claims``, ``kind`` or ``status`` attribute;
- a reply written by hand: a dict literal with a ``"status"`` key.

Dispatching on what a machine returned (``step.go is Go.PROCEED``, ``ready.send is not None``) decides
nothing: the machine decided.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ADAPTERS = ("engine_adapter", "daemon_adapter")

# The protocol's values as the wire and the views spell them (spec/LayoutProtocol.tla's strings).
CLAIM_STATES = {"notified", "parked", "granted", "taken", "dirty", "release"}
PHASES = {"clean", "pending", "dirty", "repairing", "no_record", "run", "load", "parked"}
ROLES = {"primary", "warming", "promoted"}
STATUSES = {"ok", "busy", "refused", "layout_refused"}
PROTOCOL_VALUES = frozenset(CLAIM_STATES | PHASES | ROLES | STATUSES)
# ``Status.OK``, ``Status.BUSY.value``, ...: the reply statuses of ``layout_sm.reasons``.
STATUS_ENUM = "Status"
# The daemon's phases as ``layout_sm.daemon_view`` names them.
PHASE_CONSTANTS = frozenset({"LOADING", "NO_RECORD", "CLEAN", "PENDING", "DIRTY", "REPAIRING"})
# A machine's state, as its view or session reads it.
STATE_ATTRIBUTES = frozenset({"phase", "role", "rebalance", "rebalance_phase", "claims", "kind", "status"})

# Comparisons not fixed yet, each (path under src, the comparison as ``ast.unparse`` writes it) with
# why it is still here. Each entry is a defect to remove; none may be added.
ALLOWED: set[tuple[str, str]] = set()


def _protocol_values(node: ast.AST) -> list[str]:
    """The protocol values ``node`` holds: string constants (in tuples and sets too), ``Status`` members,
    phase constants, and a machine's state read off an attribute."""
    if isinstance(node, ast.Constant):
        return [repr(node.value)] if isinstance(node.value, str) and node.value in PROTOCOL_VALUES else []
    if isinstance(node, ast.Attribute) and _base_name(node) == STATUS_ENUM:
        return [ast.unparse(node)]  # the whole ``Status.OK.value``, once
    if isinstance(node, ast.Name) and node.id in PHASE_CONSTANTS:
        return [node.id]
    if isinstance(node, ast.Attribute) and node.attr in PHASE_CONSTANTS:
        return [ast.unparse(node)]
    if isinstance(node, ast.Attribute) and node.attr in STATE_ATTRIBUTES:
        return [ast.unparse(node)]
    return [value for child in ast.iter_child_nodes(node) for value in _protocol_values(child)]


def _base_name(node: ast.Attribute) -> str | None:
    base: ast.AST = node
    while isinstance(base, ast.Attribute):
        base = base.value
    return base.id if isinstance(base, ast.Name) else None


def comparisons(source: str) -> list[tuple[int, str, list[str]]]:
    """Each comparison in ``source`` against a protocol value or a machine's state, and each reply
    written by hand: (line, the code, what it holds)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            values = [v for side in (node.left, *node.comparators) for v in _protocol_values(side)]
            if values:
                out.append((node.lineno, ast.unparse(node), values))
        elif isinstance(node, ast.match_case):
            values = _protocol_values(node.pattern)
            if values:
                out.append((node.pattern.lineno, f"case {ast.unparse(node.pattern)}", values))
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "status" in keys:
                out.append((node.lineno, ast.unparse(node), ["a reply written by hand"]))
    return sorted(out)


def violations() -> list[str]:
    found = []
    for package in ADAPTERS:
        for path in sorted((SRC / package).rglob("*.py")):
            relative = path.relative_to(SRC).as_posix()
            for line, text, values in comparisons(path.read_text()):
                if (relative, text) not in ALLOWED:
                    found.append(f"src/{relative}:{line}: {text} (compares {', '.join(values)})")
    return found


def test_adapters_compare_no_protocol_value() -> None:
    found = violations()
    assert not found, (
        "an adapter decides on a protocol value (docs/protocol.md §2): make it a guard or an event of the "
        "session or of a machine, and dispatch on the Step it returns:\n" + "\n".join(found)
    )


def test_the_scan_sees_what_adapters_must_not_write() -> None:
    """Each kind of decision, written once: the scan names every one."""
    source = """
if session.view().claims[rank] == "parked":
    pass
if reply.get("status") in ("ok", "busy"):
    pass
if parsed.status is Status.BUSY or reply["status"] != Status.OK.value:
    pass
match phase:
    case "repairing":
        pass
if step.go is Go.PROCEED and mode != "off" and kind == "daemon":
    pass
if machine.phase == REPAIRING:
    pass
if view.phase is daemon_view.DIRTY:
    pass
if session.role == wanted or finding.kind != expected:
    pass
reply = {"status": "refused", "message": why}
if ready.send is not None and ready.done.go is Go.STOP:
    pass
"""
    found = [(line, values) for line, _, values in comparisons(source)]
    assert found == [
        (2, ["session.view().claims", "'parked'"]),
        (4, ["'ok'", "'busy'"]),
        (6, ["parsed.status", "Status.BUSY"]),
        (6, ["Status.OK.value"]),
        (9, ["'repairing'"]),
        (13, ["machine.phase", "REPAIRING"]),
        (15, ["view.phase", "daemon_view.DIRTY"]),
        (17, ["finding.kind"]),
        (17, ["session.role"]),
        (19, ["a reply written by hand"]),
    ], found
