"""The protocol traces of daemons and engine ranks: one NDJSON line per step their machines take, when asked.

With ``TRACE_ENV`` set to a folder, each daemon appends to ``daemon-<socket name>-<pid>.ndjson``
there (a daemon started again writes a new file):

- ``start``: the record it loaded (the initial map and the number of logical experts, or none),
  whether it repairs by itself, and its socket's path (what its engines' ranks name);
- ``step``: each event its ``DaemonMachine`` took (``DaemonMachine.observer``): the event, its
  payload as the machine got it, the answer, and the record after (``expert_layout_query``'s state:
  phase, version, digest, pending move, attachments, parked standbys);
- ``fetch_served``: sglang's ``fetch_state`` served its handles, with the ``seq`` of the layout
  check that let it (the step of event ``fetch``, in this thread), or none;
- ``notice_sent``: the notice written to a parked standby (``engine``), which a step's answer must
  have named (``notified``): a notice the machine did not decide tells a standby the primary role is
  free while it is not.

Each rank process of an engine appends to ``engine-<engine id>-r<rank>-<pid>.ndjson`` (``EngineTrace``):

- ``start``: the engine id, its ranks, its own layout and initial map, whether it started as a warm
  standby, and the path of its rank's daemon socket;
- ``step``: each event its ``EngineSession`` took (``EngineSession.observer``): the event, its
  arguments (what every rank found and every daemon answered, as gathered; a move's, the rows of the
  chunk's layers), the result, and the view after; every rank logs every rank's answers, each rank's
  own are its daemon's replies;
- ``rebalance_end``: one EPLB rebalance ended (sglang's generator ran out, or the protocol stopped it);
- ``truth``, written by tests: the logical expert each of this rank's slots held in its daemon's memory,
  read slot by slot between ``read_ns`` and ``done_ns`` (the spec's ``truth``).

Every line has ``seq`` (its order in the file) and ``t_ns`` (``time.monotonic_ns()``: one machine's
clock orders the processes of one machine). Payloads are the machine's own frozen dataclasses,
written as ``{"type": name, field: value...}`` (``encode``) and read back by ``decode``:
``tools.trace_check`` replays a trace on a fresh ``DaemonMachine`` or ``EngineSession``, matches each
answer an engine rank took from its daemon with that daemon's step, and reports the first line that
it does not explain. Off by default: without ``TRACE_ENV`` no observer is set and nothing is written.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from layout_sm import daemon_view, engine, messages, reasons, record
from layout_sm.daemon_view import DaemonView
from layout_sm.engine import EngineView, RecordStamp
from layout_sm.session import EngineSession

TRACE_ENV = "SGLANG_EXPERT_LAYOUT_TRACE"
# The types a trace's payloads and answers are made of, by name.
_TYPES: dict[str, type] = {
    name: value
    for module in (messages, daemon_view, reasons, record, engine)
    for name, value in vars(module).items()
    if isinstance(value, type) and (dataclasses.is_dataclass(value) or issubclass(value, enum.Enum))
}


def trace_dir() -> Path | None:
    """The folder traces go to (``TRACE_ENV``), or None: tracing off."""
    value = os.environ.get(TRACE_ENV, "").strip()
    return Path(value) if value else None


def encode(value: Any) -> Any:
    """``value`` as JSON data: a dataclass as ``{"type": name, field: value...}``, an enum as
    ``{"enum": name, "value": value}``, a tuple as a list."""
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
    """What ``encode`` wrote, as the machine's values again (lists as tuples)."""
    if isinstance(data, list):
        return tuple(decode(v) for v in data)
    if not isinstance(data, dict):
        return data
    if set(data) == {"bytes"}:
        return bytes.fromhex(data["bytes"])
    if "enum" in data and set(data) == {"enum", "value"}:
        return _TYPES[data["enum"]](data["value"])
    if "type" in data:
        cls = _TYPES.get(data["type"])
        if cls is None:
            raise ValueError(f"a trace payload of unknown type {data['type']!r}")
        return cls(**{k: decode(v) for k, v in data.items() if k != "type"})
    return {k: decode(v) for k, v in data.items()}


def state_after(view: DaemonView) -> dict[str, Any]:
    """The record after a step, as the trace writes it: its digest stands for its map (a map is
    thousands of numbers at scale; the start line and each commit's payload carry the rows)."""
    return view.state_wire(include_map=False)


class TraceFile:
    """One process's trace file, its lines numbered in the order written; one lock keeps each line
    whole and in order across the process's threads."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}-{os.getpid()}.ndjson"
        # Owner-only, as the daemon's socket: the payloads hold the engines' session tokens.
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = open(descriptor, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
        self._lock = threading.Lock()
        self._seq = 0

    def _write(self, kind: str, **fields: Any) -> int:
        with self._lock:
            self._seq += 1
            line = {"seq": self._seq, "t_ns": time.monotonic_ns(), "kind": kind, **fields}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            return self._seq


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


class DaemonTrace(TraceFile):
    """One daemon's trace file; ``step`` is the machine's observer (it runs under the daemon's layout
    lock), ``fetch_served`` runs in sglang's handler."""

    def __init__(self, directory: Path, name: str) -> None:
        super().__init__(directory, f"daemon-{name}")
        self._last_check = threading.local()  # the seq of this thread's last fetch check

    def start(self, rows: Any, num_logical: int | None, auto_repair: bool, socket: str = "") -> None:
        self._write("start", rows=encode(rows), num_logical=num_logical, auto_repair=auto_repair, socket=socket)

    def step(self, event: str, payload: Any, answer: Any, view: DaemonView) -> None:
        answer_data = answer.to_wire() if isinstance(answer, reasons.Reply) else encode(answer)
        seq = self._write("step", event=event, payload=encode(payload), answer=answer_data, after=state_after(view))
        if event == "fetch":
            self._last_check.seq = seq

    def notice_sent(self, engine_id: str) -> None:
        self._write("notice_sent", engine=engine_id)

    def fetch_served(self) -> None:
        """sglang's handler served a fetch: the check it acted on is this thread's last."""
        self._write("fetch_served", check_seq=getattr(self._last_check, "seq", None))
        self._last_check.seq = None


class EngineTrace(TraceFile):
    """One engine rank's trace file; ``step`` is its session's observer."""

    def __init__(self, directory: Path, engine_id: str, rank: int) -> None:
        super().__init__(directory, f"engine-{engine_id or 'unattached'}-r{rank}")

    def start(self, session: EngineSession, rank: int, socket: str, standby: bool, initial_rows: Any = None) -> None:
        view = session.view()
        self._write(
            "start",
            engine_id=view.engine_id,
            num_ranks=view.num_ranks,
            rank=rank,
            layout=encode(session.layout),
            standby=standby,
            socket=socket,
            initial_rows=encode(initial_rows),
        )

    def step(self, event: str, arguments: Mapping[str, Any], result: Any, view: EngineView) -> None:
        if event == "move":  # sglang moved the chunk's layers only: their rows stand for the whole map
            rows = arguments["rows"]
            arguments = {"chunk_rows": {str(layer): list(rows[layer]) for layer in view.chunk}}
        after = engine_state_after(view)
        self._write("step", event=event, arguments=encode(dict(arguments)), result=encode(result), after=after)

    def rebalance_end(self) -> None:
        self._write("rebalance_end")

    def truth(self, read_ns: int, first_slot: int, slots: Any) -> None:
        """What a test read from the daemon's memory (``[L][slots]`` logical experts from ``first_slot``),
        having started to read at ``read_ns``."""
        self._write("truth", read_ns=read_ns, done_ns=time.monotonic_ns(), first_slot=first_slot, slots=encode(slots))


def trace_engine(
    session: EngineSession,
    rank: int,
    socket_path: str | None,
    standby: bool = False,
    initial_rows: Callable[[], Any] | None = None,
) -> EngineTrace | None:
    """With ``TRACE_ENV`` set, write this rank's trace of ``session`` from now on (its observer);
    ``initial_rows``: reads the engine's own initial map, the one each move changes when nothing was
    adopted (read only when tracing: a startup without it does not copy the map)."""
    traces = trace_dir()
    if traces is None:
        return None
    trace = EngineTrace(traces, session.view().engine_id, rank)
    trace.start(session, rank, socket_path or "", standby, None if initial_rows is None else initial_rows())
    session.observer = trace.step
    return trace
