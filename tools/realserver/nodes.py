"""Nodes on one machine, as separate hosts would be: each node has its own run folder (daemon
sockets, ready files, logs, probes), its own daemons and its own server processes, and the nodes
share only TCP: the engines' ``--dist-init-addr`` and the daemons' rendezvous.

A server across the nodes is one ``python -m sglang.launch_server`` per node, ``--nnodes N
--node-rank K`` (node 0 serves HTTP); standalone daemons are one ``python -m daemon_adapter`` per
node, ``--nnodes N --node-rank K --dist-init-method`` (sglang's launcher for that node's ranks).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tools.realserver.server import (
    RealServer,
    RunDir,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
    free_port,
)


@dataclass
class Nodes:
    """``nnodes`` nodes sharing ``topology``'s ranks equally, under ``root``."""

    root: Path
    topology: Topology
    nnodes: int = 2
    runs: list[RunDir] = field(init=False)
    daemons_method: str = field(init=False)  # the standalone daemons' --dist-init-method

    def __post_init__(self) -> None:
        if self.topology.tp_size % self.nnodes:
            raise ValueError(f"{self.topology.tp_size} ranks do not split over {self.nnodes} nodes")
        self.runs = [RunDir(Path(self.root) / f"node{k}") for k in range(self.nnodes)]
        self.daemons_method = f"tcp://127.0.0.1:{free_port()}"

    @property
    def local_ranks(self) -> int:
        return self.topology.tp_size // self.nnodes

    def _node_args(self, k: int) -> tuple[str, ...]:
        return ("--nnodes", str(self.nnodes), "--node-rank", str(k))

    def daemons(self, extra_args: Mapping[int, Sequence[str]] | None = None) -> list[StandaloneDaemons]:
        """Each node's standalone layout-aware daemons (not started); ``extra_args``: by node rank."""
        return [
            StandaloneDaemons(
                run,
                self.topology,
                name=f"daemons-node{k}",
                extra_args=(
                    *self._node_args(k),
                    "--dist-init-method",
                    self.daemons_method,
                    *(extra_args or {}).get(k, ()),
                ),
                local_ranks=self.local_ranks,
            )
            for k, run in enumerate(self.runs)
        ]

    def servers(self, spec: ServerSpec) -> list[RealServer]:
        """One server across the nodes: each node's ``launch_server`` (not started); [0] serves HTTP.
        Each server has a ``--dist-init-addr`` of its own: a primary and its standby run at once."""
        engines = free_port()
        while f"tcp://127.0.0.1:{engines}" == self.daemons_method:  # never the daemons' port
            engines = free_port()
        engines_addr = f"127.0.0.1:{engines}"
        return [
            RealServer(
                run,
                self.topology,
                replace(
                    spec,
                    name=f"{spec.name}-node{k}",
                    extra_args=(*spec.extra_args, *self._node_args(k), "--dist-init-addr", engines_addr),
                ),
            )
            for k, run in enumerate(self.runs)
        ]

    def daemon_states(self, include_map: bool = False) -> list[dict[str, Any]]:
        """Every daemon's state, node by node (``expert-layout status`` on each node)."""
        return [(d.get("state") or {}) for run in self.runs for d in daemon_status(run, include_map)["daemons"]]

    def wait_states(self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float) -> list[dict[str, Any]]:
        """Every daemon's state (with its map) once ``done`` says so of them, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            states = self.daemon_states(include_map=True)
            if (len(states) == self.topology.tp_size and done(states)) or time.monotonic() > deadline:
                return states
            time.sleep(0.3)


def beliefs(servers: Sequence[RealServer]) -> dict[int, dict[str, Any]]:
    """What each rank of a server across nodes routes with (each node's probes hold its ranks')."""
    out: dict[int, dict[str, Any]] = {}
    for server in servers:
        out.update(server.beliefs())
    return out


def start_daemons(daemons: Sequence[StandaloneDaemons]) -> None:
    """Every node's daemons started, then waited for: they meet at one rendezvous."""
    for node in daemons:
        node.start()
    for node in daemons:
        node.wait_ready()


def start(servers: Sequence[RealServer]) -> None:
    """Every node's processes of a server started (node 0's ``wait_ready`` says when it serves)."""
    for server in servers:
        server.start()


def serve(servers: Sequence[RealServer]) -> None:
    """Every node's processes started, until node 0 serves."""
    start(servers)
    servers[0].wait_ready()


def stop(processes: Sequence[RealServer | StandaloneDaemons]) -> None:
    """Every node's processes of a server, or every node's daemons, asked to end."""
    for each in processes:
        each.stop()


def kill(servers: Sequence[RealServer]) -> None:
    """SIGKILL every node's process tree of the server."""
    for server in servers:
        server.kill()
