"""Nodes on one machine, as separate hosts would be: each node has its own run folder (daemon
sockets, ready files, logs, probes), its own daemons and its own server processes, and the nodes
share only TCP: the engines' ``--dist-init-addr`` and the daemons' rendezvous.

A server across the nodes is one ``python -m sglang.launch_server`` per node, ``--nnodes N
--node-rank K`` (node 0 serves HTTP); standalone daemons are one ``python -m daemon_adapter`` per
node, ``--nnodes N --node-rank K --dist-init-method`` (sglang's launcher for that node's ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
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


def _free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@dataclass
class Nodes:
    """``nnodes`` nodes sharing ``topology``'s ranks equally, under ``root``."""

    root: Path
    topology: Topology
    nnodes: int = 2
    runs: list[RunDir] = field(init=False)
    engines_addr: str = field(init=False)  # the engines' --dist-init-addr
    daemons_method: str = field(init=False)  # the standalone daemons' --dist-init-method

    def __post_init__(self) -> None:
        if self.topology.tp_size % self.nnodes:
            raise ValueError(f"{self.topology.tp_size} ranks do not split over {self.nnodes} nodes")
        self.runs = [RunDir(Path(self.root) / f"node{k}") for k in range(self.nnodes)]
        engines, daemons = _free_ports(2)
        self.engines_addr = f"127.0.0.1:{engines}"
        self.daemons_method = f"tcp://127.0.0.1:{daemons}"

    @property
    def local_ranks(self) -> int:
        return self.topology.tp_size // self.nnodes

    def _node_args(self, k: int) -> tuple[str, ...]:
        return ("--nnodes", str(self.nnodes), "--node-rank", str(k))

    def daemons(self) -> list[StandaloneDaemons]:
        """Each node's standalone layout-aware daemons (not started)."""
        return [
            StandaloneDaemons(
                run,
                self.topology,
                name=f"daemons-node{k}",
                extra_args=(*self._node_args(k), "--dist-init-method", self.daemons_method),
                local_ranks=self.local_ranks,
            )
            for k, run in enumerate(self.runs)
        ]

    def servers(self, spec: ServerSpec) -> list[RealServer]:
        """One server across the nodes: each node's ``launch_server`` (not started); [0] serves HTTP."""
        return [
            RealServer(
                run,
                self.topology,
                replace(
                    spec,
                    name=f"{spec.name}-node{k}",
                    extra_args=(*spec.extra_args, *self._node_args(k), "--dist-init-addr", self.engines_addr),
                ),
            )
            for k, run in enumerate(self.runs)
        ]

    def daemon_states(self, include_map: bool = False) -> list[dict[str, Any]]:
        """Every daemon's state, node by node (``expert-layout status`` on each node)."""
        return [(d.get("state") or {}) for run in self.runs for d in daemon_status(run, include_map)["daemons"]]


def beliefs(servers: Sequence[RealServer]) -> dict[int, dict[str, Any]]:
    """What each rank of a server across nodes routes with (each node's probes hold its ranks')."""
    out: dict[int, dict[str, Any]] = {}
    for server in servers:
        out.update(server.beliefs())
    return out


def stop(servers: Sequence[RealServer]) -> None:
    for server in servers:
        server.stop()
