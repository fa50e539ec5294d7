"""The protocol traces of daemons and engine ranks: one NDJSON line per step their machines take, when asked.

With ``TRACE_ENV`` set to a folder, each daemon appends to ``daemon-<socket name>-<pid>.ndjson``
there (a daemon started again writes a new file):

- ``start``: the record it loaded (its map, version and number of logical experts, or none), what
  it made of its durable copy (``layout_sm.durable.CopyRead.kind``, or none: the copy is off),
  whether it repairs by itself, and its socket's path (what its engines' ranks name);
- ``persist``: its writer put a copy of the record in place (``daemon_adapter.durable``), and the
  record after (the record the copy holds);
- ``step``: each event its ``DaemonMachine`` took (``DaemonMachine.observer``): the event, its
  payload as the machine got it, the answer, and the record after (``expert_layout_query``'s state:
  phase, version, digest, pending move, attachments, parked standbys);
- ``fetch_served``: sglang's ``fetch_state`` served its handles, with the ``seq`` of the layout
  check that let it (the step of event ``fetch``, in this thread), or none;
- ``notice_sent``: the notice written to a parked standby (``engine``), which a step's answer must
  have named (``notified``): a notice the machine did not decide tells a standby the primary role is
  free while it is not.

Each rank process of an engine appends to ``engine-<engine id>-r<rank>-<pid>.ndjson``
(``engine_adapter.trace.EngineTrace``):

- ``start``: the engine id, its ranks, its own layout and initial map, whether it started as a warm
  standby, and the path of its rank's daemon socket;
- ``step``: each event its ``EngineSession`` took (``EngineSession.observer``): the event, its
  arguments (what every rank found and every daemon answered, as gathered; a move's, the rows of the
  chunk's layers), the result, and the view after; every rank logs every rank's answers, each rank's
  own are its daemon's replies;
- ``rebalance_end``: one EPLB rebalance ended (sglang's generator ran out, or the protocol stopped it);
- ``truth``, written by the tooling's memory probes (``tools.demo.memory_probe.ProbeTrace``), in files of
  their own: the logical expert each slot of a daemon's memory held, read slot by slot between ``read_ns``
  and ``done_ns`` (the spec's ``truth``).

Every line has ``seq`` (its order in the file) and ``t_ns`` (``time.monotonic_ns()``: one machine's
clock orders the processes of one machine). Payloads are the machine's own frozen dataclasses,
written and read back by ``layout_sm.trace_codec``:
``tools.trace_check`` replays a trace on a fresh ``DaemonMachine`` or ``EngineSession``, matches each
answer an engine rank took from its daemon with that daemon's step, and reports the first line that
it does not explain. Off by default: without ``TRACE_ENV`` no observer is set and nothing is written.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from layout_sm import reasons
from layout_sm.daemon_view import DaemonView
from layout_sm.trace_codec import TRACE_ENV, encode, state_after


def trace_dir() -> Path | None:
    """The folder traces go to (``TRACE_ENV``), or None: tracing off."""
    value = os.environ.get(TRACE_ENV, "").strip()
    return Path(value) if value else None


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


class DaemonTrace(TraceFile):
    """One daemon's trace file; ``step`` is the machine's observer (it runs under the daemon's layout
    lock), ``fetch_served`` runs in sglang's handler."""

    def __init__(self, directory: Path, name: str) -> None:
        super().__init__(directory, f"daemon-{name}")
        self._last_check = threading.local()  # the seq of this thread's last fetch check

    def start(
        self,
        rows: Any,
        num_logical: int | None,
        auto_repair: bool,
        socket: str = "",
        version: int = 0,
        copy: str | None = None,
    ) -> None:
        self._write(
            "start",
            rows=encode(rows),
            num_logical=num_logical,
            auto_repair=auto_repair,
            socket=socket,
            version=version,
            copy=copy,
        )

    def persisted(self, view: DaemonView) -> None:
        """The writer put a copy of the record in place (under the daemon's lock): the spec's ``Persist``."""
        self._write("persist", after=state_after(view))

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


__all__ = ["TRACE_ENV", "DaemonTrace", "TraceFile", "trace_dir"]
