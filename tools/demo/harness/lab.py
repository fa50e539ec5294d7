"""The demo's cases, run with real processes: daemons (one per rank) and 2-rank engines over gloo.

Every case follows docs/protocol.md §4-§6 and reads its evidence from the real parts: the daemons'
records through ``expert_layout_query``, each engine's map from its ``ExpertLocationMetadata``,
and what each slot holds from the shared memory itself (``toy_moe.ExpertIdentifier``).

Daemon pairs (forked from one forkserver, cheap):
  P0 plain sglang daemons (an older daemon): case 0 and matrix M1;
  P1 layout-aware daemons: cases 1, 2, matrix M2b, then 3a and 3b (which leaves them dirty);
  P3 layout-aware daemons: matrix M2a (an older engine before any move);
  P4 layout-aware daemons without --enable-eplb: matrix M3.
Engine pools (``EngineRanks``, 2 rank processes each, reused across engine incarnations):
  ``pool_a`` and ``pool_c`` (the warm standby needs two engines alive at once; case 3 SIGKILLs
  both), and ``pool_f`` for the engines after case 3.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from layout_sm.messages import query_request
from tools.demo.harness import rank_scripts
from tools.demo.results import Results
from tools.harness import toy_moe
from tools.harness.daemon_proc import DaemonProcess, rank_cache_config, request, start_daemon
from tools.harness.engine_ranks import RANK_LOG_DIR_ENV, EngineRanks, EngineSpec, write_model_dir

WORLD = 2
# A pool's rank processes each import sglang (4-7 s of CPU alone); generous for a loaded machine.
START_TIMEOUT_S = 600.0
# sglang's torch_ipc with a fresh handle set per fetch: serves CPU tensors to any number of engines.
CPU_TRANSPORT = "tools.harness.cpu_transport:CpuShmTransportBackend"


class DemoError(RuntimeError):
    """A step of the demo could not run (not an outcome: a broken setup)."""


@dataclass
class Options:
    quick: bool = False
    outdir: str = "demo-results"
    rebalances: int = 3
    num_tokens: int = 64
    picture: bool = True
    timeout: float = 180.0
    keep_workdir: bool = False  # keep the sockets' folder for a post-mortem (logs are in <outdir>/logs)


@dataclass
class Engine:
    """One engine incarnation in a pool: its label and what each rank reported at start."""

    label: str
    pool: EngineRanks
    started: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.get("started") for s in self.started)

    @property
    def loaded(self) -> bool:
        return self.ok and all(s.get("source") == "daemon" for s in self.started)

    def error(self) -> str:
        for s in self.started:
            if not s.get("started"):
                return str(s.get("error"))
            if s.get("load_error"):
                return str(s.get("load_error"))
        return ""


class Demo:
    def __init__(self, options: Options) -> None:
        self.opt = options
        self.cfg = toy_moe.ToyMoEConfig()
        self.tokens = toy_moe.prompts(self.cfg, options.num_tokens)
        self.t0 = time.monotonic()
        self.workdir = tempfile.mkdtemp(prefix="expert-layout-demo-")
        # sglang's and the plugin's logs (engine ranks and daemons) go to files, not the terminal.
        self.logs = os.path.abspath(os.path.join(options.outdir, "logs"))
        os.makedirs(self.logs, exist_ok=True)
        os.environ[RANK_LOG_DIR_ENV] = self.logs
        self.model_dir = write_model_dir(self.cfg, self.workdir)
        self.results = Results()
        self.pairs: dict[str, list[DaemonProcess]] = {}
        self.pool_a = self._pool()
        self.pool_c = self._pool()
        # Case 3 SIGKILLs the rank processes of pool_a and then of pool_c; the engines after it run
        # in pool_f, started with the others, so no restart (seconds of sglang imports) is waited for.
        self.pool_f = self._pool()
        self.pools = (self.pool_a, self.pool_c, self.pool_f)
        # Rank processes import sglang for seconds: start the pools now, in the background, one after
        # the other (all at once would starve each other of the 2 cores past their start timeout).
        self._executor = concurrent.futures.ThreadPoolExecutor(1)
        self._warming: dict[int, concurrent.futures.Future[Any]] = {}
        for pool in self.pools:
            self.warm(pool)
        self.picture: dict[str, Any] = {}
        self.phase = 0  # each rebalance uses the next phase's statistics, so each one moves experts

    # -- plumbing -------------------------------------------------------------------------

    def step(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def _pool(self) -> EngineRanks:
        # One model directory for every pool, so the CacheConfig each engine sends matches the
        # daemons' whichever pool it runs in.
        return EngineRanks(WORLD, start_timeout=START_TIMEOUT_S, workdir=self.workdir)

    def warm(self, pool: EngineRanks) -> None:
        """Start ``pool``'s rank processes in the background (``run`` waits for it)."""
        self._warming[id(pool)] = self._executor.submit(pool.run, rank_scripts.stop, timeout=self.opt.timeout)

    def _daemon_config(self, rank: int) -> dict[str, Any]:
        return rank_cache_config(self.model_dir, rank, WORLD)

    def start_pair(self, name: str, kind: str) -> None:
        """Start two daemons (not waiting): ``protocol``, ``plain`` (older daemon) or ``no_record``."""
        initial = toy_moe.trivial_map(self.cfg)
        pair = []
        for rank in range(WORLD):
            pair.append(
                start_daemon(
                    os.path.join(self.workdir, f"{name}-rank{rank}.sock"),
                    physical_to_logical_map=initial if kind == "protocol" else None,
                    num_logical=self.cfg.num_logical if kind == "protocol" else None,
                    tensors=toy_moe.rank_state(self.cfg, rank, initial),
                    config=self._daemon_config(rank),
                    plain_sglang=kind == "plain",
                    transport_backend=CPU_TRANSPORT,
                    log_path=os.path.join(self.logs, f"daemon-{name}-rank{rank}.log"),
                    wait=False,
                )
            )
        self.pairs[name] = pair

    def pair(self, name: str) -> list[DaemonProcess]:
        for daemon in self.pairs[name]:
            daemon.wait_ready()
        return self.pairs[name]

    def spec(self, pair: str | None, **kwargs: Any) -> EngineSpec:
        sockets = (None,) * WORLD if pair is None else tuple(d.socket_path for d in self.pair(pair))
        return EngineSpec(sockets=sockets, cfg=self.cfg, **kwargs)

    def run(self, pool: EngineRanks, script: Callable[..., Any], *args: Any) -> list[Any]:
        warming = self._warming.pop(id(pool), None)
        if warming is not None:
            warming.result()
        results = pool.run(script, *args, timeout=self.opt.timeout)
        bad = [r for r in results if not r.ok]
        if bad:
            raise DemoError(f"{script.__name__} failed: " + "; ".join(f"rank {r.rank}: {r.error}" for r in bad))
        return [r.value for r in results]

    def query(self, pair: str) -> list[dict[str, Any]]:
        return [request(d.socket_path, query_request(include_map=True)) for d in self.pairs[pair]]

    def start_engine(self, label: str, pool: EngineRanks, spec: EngineSpec, load: bool = True) -> Engine:
        engine = Engine(label, pool, self.run(pool, rank_scripts.start, spec, load))
        return engine

    def forward(self, engine: Engine) -> list[int]:
        outs = self.run(engine.pool, rank_scripts.forward, self.tokens)
        if any(o != outs[0] for o in outs):
            raise DemoError(f"engine {engine.label}: ranks disagree on their outputs")
        return outs[0]

    def report(self, engine: Engine) -> dict[str, Any]:
        reps = self.run(engine.pool, rank_scripts.report)
        believed = reps[0]["map"]
        held = toy_moe.join_rank_slots([r["slots"] for r in reps]) if all(r["slots"] for r in reps) else []
        return {
            "believed": believed,
            "maps_agree": all(r["map"] == believed for r in reps),
            "held": held,
            "wrong": toy_moe.count_mismatches(believed, held) if held else None,
            "slots": len(believed) * len(believed[0]) if believed else 0,
            "l2p": [r["logical_to_all_physical"] for r in reps],
            "experts_sha256": [r["experts_sha256"] for r in reps],
        }

    def rebalance(self, engine: Engine) -> list[dict[str, Any]]:
        outs = self.run(engine.pool, rank_scripts.rebalance, self.phase)
        self.phase += 1
        return outs

    def stop(self, engine: Engine) -> None:
        self.run(engine.pool, rank_scripts.stop)

    def kill_at(self, engine: Engine, chunks_done: int, pending: bool) -> float:
        """Drive ``engine``'s rebalance to a kill point, SIGKILL its rank processes there."""
        marker_dir = tempfile.mkdtemp(prefix="kill-", dir=self.workdir)
        what = "pending" if pending else "between"
        pids = list(engine.pool.pids)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(
                engine.pool.run,
                rank_scripts.rebalance_until,
                self.phase,
                chunks_done,
                marker_dir,
                pending,
                timeout=self.opt.timeout,
            )
            self.phase += 1
            deadline = time.monotonic() + self.opt.timeout
            while len([m for m in os.listdir(marker_dir) if m.endswith(what)]) < WORLD:
                if future.done() or time.monotonic() > deadline:
                    raise DemoError(f"engine {engine.label} never reached the kill point: {future.result()}")
                time.sleep(0.02)
            killed_at = time.monotonic()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            future.result()  # the pool sees EOF, reports the ranks as gone, and restarts on next use
        return killed_at

    def wait_attached(self, pair: str, count: int = 0, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Until both daemons see ``count`` attachments: detaches (EOF, however the engine died)
        are noticed by a watcher thread, a moment after the engine went away."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.query(pair)
            if all(len(s.get("attached") or []) == count for s in states) or time.monotonic() > deadline:
                return states
            time.sleep(0.05)

    def wait_detached(self, pair: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        return self.wait_attached(pair, 0, timeout)

    def close(self) -> None:
        for future in self._warming.values():
            future.result()
        self._executor.shutdown()
        daemons = [d for pair in self.pairs.values() for d in pair]
        with concurrent.futures.ThreadPoolExecutor(len(daemons) + 2) as pool:
            # Each stop waits up to a second for sglang's serve loop: stop them all at once.
            list(
                pool.map(
                    lambda x: x.close() if isinstance(x, EngineRanks) else x.stop(),
                    [*self.pools, *daemons],
                )
            )
        if self.opt.keep_workdir:
            self.step(f"kept the work folder (daemon logs): {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def raw_fetch(self, pair: str, rank: int) -> dict[str, Any]:
        """sglang's plain ``fetch_state`` (no layout field), as an older engine sends it."""
        reply = request(
            self.pairs[pair][rank].socket_path, {"type": "fetch_state", "config": self._daemon_config(rank)}
        )
        return {k: v for k, v in reply.items() if k != "entries"}


# -- helpers for the rows ---------------------------------------------------------------


def versions(states: Sequence[dict[str, Any]]) -> list[Any]:
    return [s.get("version") for s in states]


def same_record(states: Sequence[dict[str, Any]]) -> bool:
    return len({(s.get("version"), s.get("digest")) for s in states}) == 1 and states[0].get("digest") is not None


def differing(a: Sequence[int], b: Sequence[int]) -> int:
    return sum(int(x != y) for x, y in zip(a, b, strict=True))


def init_location(rows: Sequence[Sequence[int]]) -> str:
    """sglang's ``--init-expert-location`` value for a map (JSON text)."""
    return json.dumps({"physical_to_logical_map": [list(r) for r in rows]})


def summary(value: Any) -> str:
    """``value`` on one line, in full (table cells wrap; they are never cut)."""
    return " ".join(str(value).split())
