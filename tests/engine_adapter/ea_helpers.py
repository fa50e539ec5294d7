"""Test-process helpers: a pair of real daemon processes, and a bare protocol client that plays
"another engine" (attach, begin, commit over the socket; no sglang import)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tools.harness import daemon_proc, toy_moe
from tools.harness.toy_moe import ToyMoEConfig

from layout_sm.messages import begin_request, commit_request, query_request


@dataclass
class Daemons:
    """One real layout-aware daemon per rank (or sglang's plain one, or absent)."""

    procs: list[daemon_proc.DaemonProcess | None]
    paths: list[str]
    cfg: ToyMoEConfig

    @classmethod
    def start(
        cls,
        root: str,
        configs: Sequence[dict[str, Any]],
        *,
        cfg: ToyMoEConfig | None = None,
        maps: Sequence[Any] = ("trivial", "trivial"),
        plain: Sequence[bool] = (False, False),
        absent: Sequence[bool] = (False, False),
        tensors: bool = True,
    ) -> Daemons:
        cfg = cfg or ToyMoEConfig()
        os.makedirs(root, exist_ok=True)
        procs: list[daemon_proc.DaemonProcess | None] = []
        paths = []
        for rank, config in enumerate(configs):
            path = os.path.join(root, f"rank{rank}.sock")
            paths.append(path)
            if absent[rank]:
                procs.append(None)
                continue
            layout = toy_moe.trivial_map(cfg) if maps[rank] == "trivial" else maps[rank]
            state = toy_moe.rank_state(cfg, rank, layout or toy_moe.trivial_map(cfg)) if tensors else None
            procs.append(
                daemon_proc.start_daemon(
                    path,
                    physical_to_logical_map=layout,
                    num_logical=cfg.num_logical if layout is not None else None,
                    tensors=state,
                    config=config,
                    plain_sglang=plain[rank],
                    log_path=os.path.join(root, f"rank{rank}.log"),
                )
            )
        return cls(procs, paths, cfg)

    @property
    def sockets(self) -> tuple[str, ...]:
        return tuple(self.paths)

    def query(self, rank: int, include_map: bool = False) -> dict[str, Any]:
        return daemon_proc.request(self.paths[rank], query_request(include_map=include_map))

    def kill(self) -> None:
        for proc in self.procs:
            if proc is not None:
                proc.kill()

    def log(self, rank: int) -> str:
        with open(os.path.join(os.path.dirname(self.paths[rank]), f"rank{rank}.log")) as f:
            return f.read()


class OtherEngine:
    """Another engine on the same daemons, speaking the protocol with bare sockets."""

    def __init__(self, paths: Sequence[str], engine_id: str = "engine-A") -> None:
        self.engine_id = engine_id
        self.conns = []
        self.sessions = []
        for path in paths:
            conn, reply = daemon_proc.attach(path, engine_id)
            assert reply["status"] == "ok", reply
            self.conns.append(conn)
            self.sessions.append(reply["session"])
        self.paths = list(paths)

    def begin(self, layers: Sequence[int], base_version: int = 0) -> list[dict[str, Any]]:
        return [
            daemon_proc.request(p, begin_request(self.engine_id, s, base_version, layers))
            for p, s in zip(self.paths, self.sessions, strict=True)
        ]

    def commit(self, layers: Sequence[int], rows: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        return [
            daemon_proc.request(p, commit_request(self.engine_id, s, layers, rows))
            for p, s in zip(self.paths, self.sessions, strict=True)
        ]

    def move(self, layers: Sequence[int], rows: Sequence[Sequence[int]], base_version: int = 0) -> None:
        """A whole move (begin then commit) on every daemon; the weights are not touched. It waits until
        this engine is alone on each daemon: an engine that just stopped counts as attached until the
        daemon's watcher sees its EOF, and a begin beside it is busy, as the protocol says."""
        self.wait_alone()
        assert all(r["status"] == "ok" for r in self.begin(layers, base_version))
        assert all(r["status"] == "ok" for r in self.commit(layers, rows))

    def wait_alone(self, timeout: float = 10.0) -> None:
        """Until no other engine is attached to any of this engine's daemons."""
        deadline = time.monotonic() + timeout
        for path in self.paths:
            while set(daemon_proc.request(path, query_request())["attached"]) - {self.engine_id}:
                assert time.monotonic() < deadline, f"{path} still counts another engine attached"
                time.sleep(0.01)

    def detach(self, timeout: float = 10.0) -> None:
        """Close the attachments and wait until every daemon has noticed (its watcher sees EOF)."""
        for conn in self.conns:
            conn.close()
        self.conns = []
        deadline = time.monotonic() + timeout
        for path in self.paths:
            while self.engine_id in daemon_proc.request(path, query_request())["attached"]:
                assert time.monotonic() < deadline, f"{path} still counts {self.engine_id} attached"
                time.sleep(0.01)


def rotated_map(cfg: ToyMoEConfig, shift: int = 1) -> list[list[int]]:
    """A valid non-initial layout: every slot's expert id shifted by ``shift`` (mod N)."""
    return [[(e + shift) % cfg.num_logical for e in row] for row in toy_moe.trivial_map(cfg)]
