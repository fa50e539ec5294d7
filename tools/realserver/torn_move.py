"""A torn expert move on real layout-aware daemons, driven by hand, and its repair (docs/protocol.md §4).

The caller plays the engine on every rank: it attaches with the daemon's client, maps the daemons'
expert tensors through ``fetch_state`` with sglang's client transport (as an engine does), moves a
layer (memory, then commit), and tears a second move of it: begun, the layer's routed experts
overwritten, the attach connections closed mid-move (EOF). Used by
``tests/daemon_adapter/test_repair_real.py`` and ``make bench``'s repair row; a server killed mid-move
does the same (``tests/realserver``, the demo), at the cost of a server start.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from daemon_adapter import client
from layout_sm.messages import begin_request, commit_request, fetch_layout_field, query_request
from tools import with_project_path
from tools.realserver.server import SOCKET_TEMPLATE_ENV, StandaloneDaemons, daemon_status

ENGINE_ID = "torn-move-engine"
EXPERT_KINDS = ("w13_weight", "w2_weight")
GARBAGE = 7.0


class MappedAttachment:
    """One rank's engine on its daemon: the attach connection and a mapping of every layer's experts."""

    def __init__(self, socket_path: str, num_layers: int, engine_id: str = ENGINE_ID) -> None:
        import torch
        from sglang.srt.weight_cache.transport import get_client_transport_backend

        torch.multiprocessing.set_sharing_strategy("file_system")  # standalone daemons export so
        self.socket_path = socket_path
        self.engine_id = engine_id
        config = client.request(socket_path, {"type": "query_config"})["config"]
        self.conn, reply = client.attach(socket_path, engine_id)
        assert reply["status"] == "ok", reply
        self.session: str = reply["session"]
        self.record: dict[str, Any] = reply["record"]
        claim = fetch_layout_field(engine_id, self.session, self.record["version"], self.record["digest"])
        fetched = client.request(
            socket_path, {"type": "fetch_state", "config": config, "expert_layout": claim}, timeout=60.0
        )
        assert fetched["status"] == "ok", fetched
        transport = get_client_transport_backend(fetched["transport_backend"])
        self.experts = {
            (layer, kind): transport.import_tensor(fetched["entries"][f"model.layers.{layer}.mlp.experts.{kind}"])
            for layer in range(num_layers)
            for kind in EXPERT_KINDS
        }

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        reply = client.request(self.socket_path, message)
        assert reply["status"] == "ok", reply
        return reply


def attach_all(daemons: StandaloneDaemons) -> list[MappedAttachment]:
    num_layers = len(states(daemons)[0]["map"])
    return [MappedAttachment(daemons.run.socket_path(rank), num_layers) for rank in range(daemons.topology.tp_size)]


def move_layer(engines: list[MappedAttachment], layer: int, base_version: int, new_row: list[int]) -> None:
    """A real move of ``layer`` on every rank: memory (slot p takes a replica of expert new_row[p],
    which any slot of the old row holding it has), then commit."""
    old_row = engines[0].record["map"][layer] if base_version == engines[0].record["version"] else None
    assert old_row is not None, "move_layer moves from the version the engines attached at"
    for engine in engines:
        engine.ask(begin_request(engine.engine_id, engine.session, base_version, [layer]))
    local = engines[0].experts[(layer, EXPERT_KINDS[0])].shape[0]
    for kind in EXPERT_KINDS:
        old = [engine.experts[(layer, kind)][s].clone() for engine in engines for s in range(local)]
        for slot, expert in enumerate(new_row):
            engines[slot // local].experts[(layer, kind)][slot % local].copy_(old[old_row.index(expert)])
    for engine in engines:
        engine.ask(commit_request(engine.engine_id, engine.session, [layer], [new_row]))


def tear_move(engines: list[MappedAttachment], layer: int, base_version: int) -> None:
    """The mover killed mid-move: begun on every rank, the layer's experts overwritten, EOF."""
    for engine in engines:
        engine.ask(begin_request(engine.engine_id, engine.session, base_version, [layer]))
        for kind in EXPERT_KINDS:
            engine.experts[(layer, kind)].fill_(GARBAGE)
        engine.conn.close()


def states(daemons: StandaloneDaemons) -> list[dict[str, Any]]:
    return [d.get("state") or {} for d in daemon_status(daemons.run, include_map=True)["daemons"]]


def queried_states(sockets: list[str]) -> list[dict[str, Any]]:
    """Each daemon's state from one ``expert_layout_query`` on its socket, in this process: what
    ``expert-layout status`` asks, without the CLI's interpreter start (a poll of it costs ~0.5 s)."""
    return [client.request(path, query_request(include_map=True)) for path in sockets]


def wait_phase(
    daemons: StandaloneDaemons, phase: str, timeout_s: float = 30.0, poll_s: float = 0.2, detached: bool = False
) -> list[dict[str, Any]]:
    """Every daemon's state once all are in ``phase`` (``detached``: and with nothing attached);
    AssertionError after ``timeout_s``."""
    sockets = [daemons.run.socket_path(rank) for rank in range(daemons.topology.tp_size)]
    deadline = time.monotonic() + timeout_s
    while True:
        found = queried_states(sockets)
        if all(s.get("phase") == phase and not (detached and s.get("attached")) for s in found):
            return found
        assert time.monotonic() < deadline, f"daemons not {phase}: {found}"
        time.sleep(poll_s)


def run_repair_cli(daemons: StandaloneDaemons) -> tuple[subprocess.CompletedProcess[str], float]:
    """``expert-layout repair --json`` as an operator runs it, on the run's sockets; and its wall time."""
    env = with_project_path(dict(os.environ))
    env[SOCKET_TEMPLATE_ENV] = daemons.run.socket_template
    argv = [sys.executable, "-m", "daemon_adapter.status_cli", "repair", "--json"]
    for rank in range(daemons.local_ranks):  # this node's daemons
        argv += ["--socket", daemons.run.socket_path(rank)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return done, time.monotonic() - started


@dataclass(frozen=True)
class LoggedRepair:
    """The end of one daemon's repair as it logged it (``ok(repaired): layers [0] reloaded ... in S s
    (R of C checkpoint bytes)``)."""

    layers: list[int]
    seconds: float
    bytes_read: int
    checkpoint_bytes: int


REPAIRED_LINE = re.compile(
    r"ok\(repaired\): layers \[([0-9, ]+)\] reloaded from the checkpoint in ([0-9.]+) s \((\d+) of (\d+) checkpoint"
)


def logged_repairs(log_text: str) -> list[LoggedRepair]:
    return [
        LoggedRepair([int(x) for x in layers.split(",")], float(sec), int(read), int(whole))
        for layers, sec, read, whole in REPAIRED_LINE.findall(log_text)
    ]
