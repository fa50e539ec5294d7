"""The demo's bench of real servers: daemon sets, servers, status, memory, all logged to files.

A *chain* is one set of weight cache daemons (one per rank) with its own socket folder
(``SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE``): the daemons are started standalone
(``python -m daemon_adapter`` or sglang's own module) or spawned by the first server of the
chain (``--weight-cache-mode daemon``). Servers are ``python -m sglang.launch_server`` processes
started through ``realserver`` (the real-server library); their logs, and sglang's own output,
go to ``<out>/logs/``. The terminal gets one line per step from ``Lab.step``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from expert_layout_demo import memory_probe
from expert_layout_demo.real import servers

PROMPTS = (
    "The weight cache daemon keeps",
    "Experts move between slots when",
    "A restart after a rebalance",
    "Greedy decoding of a tiny model",
)
MAX_NEW_TOKENS = 12


@dataclass
class Chain:
    """One set of daemons (one per rank) and the socket folder that names them."""

    name: str
    socket_dir: str
    standalone: servers.Daemons | None = None

    @property
    def env(self) -> dict[str, str]:
        # Both of sglang's templates: each chain's sockets and ready files apart from any other's.
        return {
            servers.SOCKET_TEMPLATE_ENV: os.path.join(self.socket_dir, "wc-{device_uuid}.sock"),
            servers.READY_TEMPLATE_ENV: os.path.join(self.socket_dir, "wc-{device_uuid}.ready"),
        }

    def sockets(self) -> list[str]:
        return servers.daemon_sockets(self.env[servers.SOCKET_TEMPLATE_ENV], servers.WORLD)


@dataclass
class Lab:
    out: str
    model_dir: str
    t0: float = field(default_factory=time.monotonic)
    status_log: list[str] = field(default_factory=list)
    live: list[servers.Server] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.logs = os.path.join(self.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self._gates: dict[int, list[Any]] | None = None

    # -- terminal ---------------------------------------------------------------------------

    def step(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    # -- daemons ----------------------------------------------------------------------------

    def chain(self, name: str) -> Chain:
        chain = Chain(name, os.path.join(self.logs, "..", ".sockets", name))
        chain.socket_dir = os.path.realpath(chain.socket_dir)
        os.makedirs(chain.socket_dir, exist_ok=True)
        self.chains.append(chain)
        return chain

    def standalone_daemons(self, chain: Chain, *, layout_aware: bool, enable_eplb: bool) -> Chain:
        chain.standalone = servers.start_daemons(
            self.model_dir,
            layout_aware=layout_aware,
            enable_eplb=enable_eplb,
            env=chain.env,
            log_path=os.path.join(self.logs, f"daemons-{chain.name}.log"),
        )
        return chain

    # -- servers ----------------------------------------------------------------------------

    def server(
        self,
        name: str,
        chain: Chain | None,
        *,
        plugin: bool = True,
        weight_cache: str = "client",
        eplb: bool = True,
        init_expert_location: Sequence[Sequence[int]] | None = None,
        expect_ready: bool = True,
        env: dict[str, str] | None = None,
    ) -> servers.Server:
        extra_env = dict(chain.env if chain is not None else {})
        extra_env.update(env or {})
        server = servers.start_server(
            name,
            self.model_dir,
            plugin=plugin,
            weight_cache=weight_cache if chain is not None else "off",
            enable_eplb=eplb,
            init_expert_location=None
            if init_expert_location is None
            else json.dumps({"physical_to_logical_map": [list(r) for r in init_expert_location]}),
            env=extra_env,
            log_path=os.path.join(self.logs, f"server-{name}.log"),
            expect_ready=expect_ready,
        )
        if server.ready:
            self.live.append(server)
        return server

    def generate(self, server: servers.Server) -> list[list[int]]:
        return [server.generate(p, MAX_NEW_TOKENS) for p in PROMPTS]

    def rebalance(self, server: servers.Server, times: int, timeout: float = 120.0) -> int:
        """Send requests until sglang logged ``times`` more rebalances (EPLB's own log line)."""
        start = server.log_count(servers.REBALANCE_END)
        deadline = time.monotonic() + timeout
        i = 0
        while server.log_count(servers.REBALANCE_END) - start < times and time.monotonic() < deadline:
            server.generate(PROMPTS[i % len(PROMPTS)], MAX_NEW_TOKENS)
            i += 1
        return server.log_count(servers.REBALANCE_END) - start

    def drive(self, server: servers.Server, requests: int) -> None:
        """``requests`` generation requests: forward passes that count toward EPLB's interval."""
        for i in range(requests):
            server.generate(PROMPTS[i % len(PROMPTS)], MAX_NEW_TOKENS)

    def drive_until(self, server: servers.Server, pattern: str, times: int, timeout: float = 120.0) -> int:
        """Requests until ``pattern`` appears ``times`` more times in the server's log."""
        start = server.log_count(pattern)
        deadline = time.monotonic() + timeout
        i = 0
        while server.log_count(pattern) - start < times and time.monotonic() < deadline:
            server.generate(PROMPTS[i % len(PROMPTS)], MAX_NEW_TOKENS)
            i += 1
        return server.log_count(pattern) - start

    def kill_at(self, server: servers.Server, point: str) -> str:
        """Drive ``server`` to a protocol point and SIGKILL its process tree there."""
        what = servers.kill_at(server, point, drive=lambda: self.drive(server, 1))
        if server in self.live:
            self.live.remove(server)
        return what

    def stop(self, *stopped: servers.Server) -> None:
        for server in stopped:
            server.stop()
            if server in self.live:
                self.live.remove(server)

    # -- what the daemons say and hold ------------------------------------------------------

    def status(self, chain: Chain, label: str) -> list[dict[str, Any]]:
        """``expert-layout status`` on the chain's daemons: the table goes to the status log and
        the results, one summary line to the terminal; returns the daemons' states (with maps)."""
        cmd = [sys.executable, "-m", "daemon_adapter.status_cli", "status"]
        env = {**os.environ, **chain.env}
        table = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        text = (table.stdout + table.stderr).rstrip()
        self.status_log.append(f"## {label}\n\n$ expert-layout status   (exit {table.returncode})\n{text}\n")
        js = subprocess.run([*cmd, "--json", "--include-map"], env=env, capture_output=True, text=True, timeout=60)
        daemons = json.loads(js.stdout)["daemons"] if js.stdout.strip() else []
        states = [d.get("state") or {"phase": d.get("outcome"), "detail": d.get("detail")} for d in daemons]
        self.step(f"{label}: expert-layout status: " + "; ".join(describe(s) for s in states))
        return states

    def held(self, chain: Chain) -> list[list[int]]:
        """What the chain's daemons' memory holds, slot by slot (``memory_probe``)."""
        if self._gates is None:
            self._gates = memory_probe.checkpoint_gates(self.model_dir)
        per_rank = [memory_probe.rank_slots(path, self._gates) for path in chain.sockets()]
        return [[e for rank in per_rank for e in rank[layer]] for layer in range(len(self._gates))]

    def close(self) -> None:
        for server in list(self.live):
            server.stop()
        for chain in self.chains:
            if chain.standalone is not None:
                chain.standalone.stop()
        with open(os.path.join(self.out, "status.md"), "w") as f:
            f.write("# `expert-layout status` between the demo's steps\n\n")
            f.write(
                "\n".join("```\n" + s.strip() + "\n```\n" if not s.startswith("## ") else s for s in self.status_log)
            )


def describe(state: dict[str, Any]) -> str:
    """One daemon's state in a few words, for a progress line."""
    if state.get("version") is None and state.get("phase") in (None, "no_record"):
        return f"{state.get('phase') or 'no record'}"
    parts = [f"{state.get('phase')} v{state.get('version')}"]
    if state.get("attached"):
        parts.append(f"attached {len(state['attached'])}")
    if state.get("dirty"):
        parts.append("DIRTY")
    if state.get("pending"):
        parts.append("move pending")
    return " ".join(parts)


def same_record(states: Sequence[dict[str, Any]]) -> bool:
    return len({(s.get("version"), s.get("digest")) for s in states}) == 1 and states[0].get("digest") is not None


def record_map(states: Sequence[dict[str, Any]]) -> list[list[int]]:
    rows = states[0].get("map")
    if not rows:
        raise RuntimeError(f"the daemons' record has no map: {states[0]}")
    return [list(r) for r in rows]


def differing(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> int:
    """Prompts whose greedy outputs differ."""
    return sum(int(list(x) != list(y)) for x, y in zip(a, b, strict=True))


def first_match(text: str, pattern: str) -> str:
    found = re.search(pattern, text)
    return found.group(0).strip() if found else ""
