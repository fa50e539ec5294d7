"""An engine rank's protocol trace (``layout_sm.trace_codec``; the format: ``daemon_adapter.trace``).

With ``SGLANG_EXPERT_LAYOUT_TRACE`` set to a folder, each rank process of an engine appends to
``engine-<engine id>-r<rank>-<pid>.ndjson`` there: a ``start`` line (the engine id, its ranks, its own
layout and initial map, whether it started as a warm standby, its rank's daemon socket), a ``step`` line
for each machine event its ``EngineSession`` took (the event, its arguments, its result and the view
after: every rank logs every rank's answers as gathered; each rank's own are its daemon's replies), a
``routes`` line after each install and each move (the digest of the map sglang's model runner routes
with, read back from its metadata: what the session believes is checked against what sglang does), and a
``rebalance_end`` line when an EPLB rebalance ends. A rank's steps run on one thread (its scheduler's),
so its lines need no lock.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from layout_sm.engine import EngineView
from layout_sm.record import DigestCache
from layout_sm.session import EngineSession
from layout_sm.trace_codec import TRACE_ENV, encode, engine_state_after


class EngineTrace:
    """One engine rank's trace file; ``step`` is one of its session's observers."""

    def __init__(self, directory: Path, engine_id: str, rank: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"engine-{engine_id or 'unattached'}-r{rank}-{os.getpid()}.ndjson"
        # Owner-only, as the daemon's socket: the payloads hold the engine's session tokens.
        descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = open(descriptor, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives as long as the process)
        self._seq = 0
        self._routed = DigestCache()

    def _line(self, kind: str, **fields: Any) -> None:
        self._seq += 1
        line = {"seq": self._seq, "t_ns": time.monotonic_ns(), "kind": kind, **fields}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def start(self, session: EngineSession, rank: int, socket: str, standby: bool, initial_rows: Any = None) -> None:
        view = session.view()
        self._line(
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
        self._line("step", event=event, arguments=encode(dict(arguments)), result=encode(result), after=after)

    def routes(self, rows: Any) -> None:
        """The map sglang routes with, as its digest: a cache of this trace's own hashes the rows that changed."""
        self._line("routes", digest=self._routed.digest(rows))

    def rebalance_end(self) -> None:
        self._line("rebalance_end")


def trace_engine(
    session: EngineSession,
    rank: int,
    socket_path: str | None,
    standby: bool = False,
    initial_rows: Callable[[], Any] | None = None,
) -> EngineTrace | None:
    """With ``SGLANG_EXPERT_LAYOUT_TRACE`` set, write this rank's trace of ``session`` from now on (one of
    its observers); ``initial_rows``: reads the engine's own initial map, the one each move changes when
    nothing was adopted (read only when tracing: a startup without it does not copy the map)."""
    folder = os.environ.get(TRACE_ENV, "").strip()
    if not folder:
        return None
    trace = EngineTrace(Path(folder), session.view().engine_id, rank)
    trace.start(session, rank, socket_path or "", standby, None if initial_rows is None else initial_rows())
    session.observers.append(trace.step)
    return trace


__all__ = ["EngineTrace", "trace_engine"]
