"""Adapters only dispatch (docs/protocol.md §2): no comparison against a protocol value in their sources.

An adapter hands ``layout_sm`` what arrived and does what the step it gets back says; comparing a
claim state, a phase, a role or a reply status itself is a protocol decision outside the core. The
scan reads every module of ``src/engine_adapter`` and ``src/daemon_adapter`` (``ast``) and fails on a
comparison (``==``, ``!=``, ``in``, ``is``, ... or a ``match`` case) one of whose sides holds such a
value, naming file:line. Dispatching on a step (``step.go is Go.PROCEED``) compares no protocol value.
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

# Comparisons not fixed yet, each (path under src, the comparison as ``ast.unparse`` writes it) with
# why it is still here. Each entry is a defect to remove; none may be added.
ALLOWED = {
    # Metrics labels (not this check's owner's file): which begins were busy or refused, from the replies.
    ("engine_adapter/metrics.py", "own_finding_kind == 'dirty'"),
    ("engine_adapter/metrics.py", "r.get('status') == 'busy'"),
    ("engine_adapter/metrics.py", "own.get('status') in ('ok', 'busy')"),
}


def _protocol_values(node: ast.AST) -> list[str]:
    """The protocol values ``node`` holds: string constants (in tuples and sets too) and ``Status`` members."""
    if isinstance(node, ast.Constant):
        return [repr(node.value)] if isinstance(node.value, str) and node.value in PROTOCOL_VALUES else []
    if isinstance(node, ast.Attribute) and _base_name(node) == STATUS_ENUM:
        return [ast.unparse(node)]  # the whole ``Status.OK.value``, once
    return [value for child in ast.iter_child_nodes(node) for value in _protocol_values(child)]


def _base_name(node: ast.Attribute) -> str | None:
    base: ast.AST = node
    while isinstance(base, ast.Attribute):
        base = base.value
    return base.id if isinstance(base, ast.Name) else None


def comparisons(source: str) -> list[tuple[int, str, list[str]]]:
    """Each comparison in ``source`` against a protocol value: (line, the comparison, the values)."""
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
"""
    assert [(line, values) for line, _, values in comparisons(source)] == [
        (2, ["'parked'"]),
        (4, ["'ok'", "'busy'"]),
        (6, ["Status.BUSY"]),
        (6, ["Status.OK.value"]),
        (9, ["'repairing'"]),
    ]
