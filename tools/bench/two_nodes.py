"""Two nodes for the scaling bench: node 1's rank processes in a network namespace of their own.

Node 0's ranks stay in this machine's namespace, node 1's join ``ns`` (``ip netns``), and the two
share one veth link, the only path between them: inside a node gloo's traffic stays on loopback,
across the nodes it crosses the link, as it crosses the NIC between two hosts. A veth link has no
wire, so the time a real network adds per all-gather step is not in these figures (the results say
so). Making the namespace needs root and ``ip``; without them the ranks are split in two groups
on loopback alone, and the results name that placement.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import uuid
from dataclasses import dataclass

_CLONE_NEWNET = 0x40000000
_SUBNET = "10.213.{}.{}"


@dataclass(frozen=True)
class NodePlacement:
    """Where a rank process runs: its namespace (None: this machine's) and gloo's interface and address."""

    netns: str | None
    ifname: str
    address: str


@dataclass
class TwoNodeLink:
    """A namespace and a veth pair; ``placement(k)`` for node k. ``close`` removes both."""

    name: str
    host_if: str
    peer_if: str
    subnet: int

    @classmethod
    def create(cls) -> TwoNodeLink:
        """The link, or ``RuntimeError`` with what failed (not root, no ``ip``, no namespaces)."""
        tag = uuid.uuid4().hex[:6]
        link = cls(f"elbench-{tag}", f"elb{tag}a", f"elb{tag}b", os.getpid() % 250 + 1)
        host, peer = link.addresses()
        steps = [
            ["ip", "netns", "add", link.name],
            ["ip", "link", "add", link.host_if, "type", "veth", "peer", "name", link.peer_if],
            ["ip", "link", "set", link.peer_if, "netns", link.name],
            ["ip", "addr", "add", f"{host}/24", "dev", link.host_if],
            ["ip", "link", "set", link.host_if, "up"],
            ["ip", "-n", link.name, "addr", "add", f"{peer}/24", "dev", link.peer_if],
            ["ip", "-n", link.name, "link", "set", link.peer_if, "up"],
            ["ip", "-n", link.name, "link", "set", "lo", "up"],
        ]
        for cmd in steps:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired) as error:
                link.close()
                raise RuntimeError(f"{' '.join(cmd)}: {error}") from error
            if done.returncode:
                link.close()
                raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        return link

    def addresses(self) -> tuple[str, str]:
        return _SUBNET.format(self.subnet, 1), _SUBNET.format(self.subnet, 2)

    def placement(self, node: int) -> NodePlacement:
        host, peer = self.addresses()
        return NodePlacement(None, self.host_if, host) if node == 0 else NodePlacement(self.name, self.peer_if, peer)

    def close(self) -> None:
        """Deleting the namespace deletes the veth pair with it."""
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)


def enter(placement: NodePlacement) -> None:
    """Run this process as one of its node's: join the namespace (before any thread starts: setns
    applies to the calling thread) and make gloo use the node's interface."""
    if placement.netns is not None:
        fd = os.open(f"/var/run/netns/{placement.netns}", os.O_RDONLY)
        try:
            if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {placement.netns}")
        finally:
            os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = placement.ifname


__all__ = ["NodePlacement", "TwoNodeLink", "enter"]
