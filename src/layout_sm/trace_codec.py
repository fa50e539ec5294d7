"""The protocol traces' values (docs/protocol.md §11): the machines' own frozen dataclasses and enums as JSON
data and back, and a step's state as the trace writes it. Pure: the daemon and engine adapters write the
traces (``daemon_adapter.trace``, ``engine_adapter.trace``), ``tools.trace_check`` reads them.

A dataclass is written as ``{"type": name, field: value...}``, an enum as ``{"enum": name, "value": value}``,
a tuple as a list, bytes as ``{"bytes": hex}``; ``decode`` reads back only the types of the machines'
modules, and refuses a field a type does not have or one it needs and is not there.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from layout_sm import daemon_view, engine, messages, reasons, record
from layout_sm.daemon_view import DaemonView
from layout_sm.engine import EngineView, RecordStamp

TRACE_ENV = "SGLANG_EXPERT_LAYOUT_TRACE"  # the folder the daemons and engine ranks write their traces to
# The types a trace's payloads and answers are made of, by name.
_TYPES: dict[str, type] = {
    name: value
    for module in (messages, daemon_view, reasons, record, engine)
    for name, value in vars(module).items()
    if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum))
}


class TraceFormatError(ValueError):
    """A trace's value that is none of the machines' values: the line names what is wrong."""


def encode(value: Any) -> Any:
    """``value`` as JSON data (see the module docstring)."""
    if value is None or type(value) in (int, str, float, bool):  # the most of a payload: a row's ints
        return value
    if isinstance(value, (list, tuple)):
        if all(type(v) is int for v in value):  # a row
            return list(value)
        return [encode(v) for v in value]
    if isinstance(value, enum.Enum):
        return {"enum": type(value).__name__, "value": value.value}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"type": type(value).__name__, **fields}
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (frozenset, set)):
        return [encode(v) for v in sorted(value)]
    if isinstance(value, bytes):  # a reply's opaque handles
        return {"bytes": value.hex()}
    return value


def decode(data: Any) -> Any:
    """What ``encode`` wrote, as the machines' values again (lists as tuples); ``TraceFormatError`` for
    data that is no such value."""
    if isinstance(data, list):
        return tuple(decode(v) for v in data)
    if not isinstance(data, dict):
        return data
    if set(data) == {"bytes"}:
        try:
            return bytes.fromhex(data["bytes"])
        except (TypeError, ValueError) as error:
            raise TraceFormatError(f"bytes that are not hex: {error}") from None
    if "enum" in data and set(data) == {"enum", "value"}:
        cls = _TYPES.get(data["enum"])
        if cls is None or not issubclass(cls, enum.Enum):
            raise TraceFormatError(f"a trace value of unknown enum {data['enum']!r}")
        try:
            return cls(data["value"])
        except ValueError as error:
            raise TraceFormatError(str(error)) from None
    if "type" in data:
        cls = _TYPES.get(data["type"])
        if cls is None or not dataclasses.is_dataclass(cls):
            raise TraceFormatError(f"a trace payload of unknown type {data['type']!r}")
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        given = set(data) - {"type"}
        unknown = sorted(given - set(fields))
        missing = sorted(
            n for n, f in fields.items()
            if n not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )  # fmt: skip
        if unknown or missing:
            raise TraceFormatError(f"a {data['type']} with fields {unknown or ''} it has not, without {missing or ''}")
        return cls(**{k: decode(v) for k, v in data.items() if k != "type"})
    return {k: decode(v) for k, v in data.items()}


def state_after(view: DaemonView) -> dict[str, Any]:
    """The record after a daemon's step, as the trace writes it: its digest stands for its map (a map is
    thousands of numbers at scale; the start line and each commit's payload carry the rows)."""
    return view.state_wire(include_map=False)


def engine_state_after(view: EngineView) -> dict[str, Any]:
    """An engine's view after a step, as the trace writes it: digests stand for maps (the one it routes
    with, the one it moved to, and the records it found or adopted, as stamps); the start line, the
    ``attach`` and ``gather`` steps and each ``move``'s chunk rows carry the maps themselves."""
    findings = tuple(
        f if f is None or f.record is None else dataclasses.replace(f, record=RecordStamp.of_any(f.record))
        for f in view.findings
    )
    outcome = view.outcome
    if outcome is not None and outcome.record is not None:
        outcome = dataclasses.replace(outcome, record=RecordStamp.of_any(outcome.record))
    data = encode(dataclasses.replace(view, findings=findings, outcome=outcome, rows=None, moved_rows=None))
    del data["rows"], data["moved_rows"]
    return data


__all__ = ["TRACE_ENV", "TraceFormatError", "decode", "encode", "engine_state_after", "state_after"]
