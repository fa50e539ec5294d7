"""The demo's bench of real servers, on the real-server library (``tools.realserver``).

A *chain* is one set of weight cache daemons (one per rank) with its own run folder
(``tools.realserver.server.RunDir`` under ``<out>/logs/<chain>/``: sglang's logs, the
daemons' socket and ready files, the engines' belief probes). Its daemons are standalone
(``python -m daemon_adapter``) or spawned by the chain's first server
(``--weight-cache-mode daemon``). The terminal gets one line per step from ``Lab.step``;
``expert-layout status`` runs between steps and its tables go to ``<out>/status.md``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tools.demo import memory_probe
from tools.realserver import server as rs
from tools.realserver import torn_move
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS, build_tiny_qwen3_moe

from daemon_adapter.__main__ import NO_AUTO_REPAIR
from engine_adapter.roles import ROLE_ENV, STANDBY

T = TypeVar("T")
WORLD = 2
NUM_LOGICAL = 8
MAX_NEW_TOKENS = 16
# EPLB's interval in forward passes: one round of the prompts (one batch, 16 tokens) stays below
# it, so each server's outputs come from one layout; the demo drives more rounds to rebalance.
REBALANCE_ITERATIONS = 20
# The disk references keep their layout. sglang sizes the recorder's buffer by this number too
# (the library passes it as --expert-distribution-recorder-buffer-size): 10**9 asked for 80 GB.
NO_REBALANCE_ITERATIONS = 10_000
LAYERS_PER_CHUNK = 1  # two chunks per rebalance: a point between them to SIGKILL at
READY_TIMEOUT_S = 600.0  # a start took 290-300 s at a load average of 15-20 (other work)
# sglang's crash diagnostics (a py-spy dump, then a 60 s wait for CUDA coredumps) have nothing to
# collect on this CPU machine without py-spy; off, so a failed server exits when it fails.
NO_CRASH_DIAGNOSTICS = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}
# sglang logs each line once per rank: count rank 0's.
RANK0 = r"TP0[^\]\n]*\] "
REBALANCE_END = RANK0 + r"\[EPLBManager\] rebalance end"
PAUSED = RANK0 + r"\[expert-layout\] rebalance paused"


@dataclass
class Chain:
    """One set of daemons (one per rank) and its run folder."""

    name: str
    run: rs.RunDir
    daemons: rs.StandaloneDaemons | None = None
    start_s: float = 0.0  # its standalone daemons' start: launch to ready (sglang's load from disk)

    def sockets(self) -> list[str]:
        return [self.run.socket_path(rank) for rank in range(WORLD)]


# The series the demo's steps show, each summed per rank (sglang's tp_rank label) and per reason.
SHOWN_METRICS = (
    ("sglang:expert_layout_record_version", "version"),
    ("sglang:expert_layout_chunks_committed_total", "chunks committed"),
    ("sglang:expert_layout_rebalances_paused_total", "paused"),
)


def _metric_summary(samples: Sequence[tuple[str, dict[str, str], float]]) -> list[str]:
    out = []
    for name, label in SHOWN_METRICS:
        values: dict[str, float] = {}
        for sample, labels, value in samples:
            if sample == name:
                key = f"rank {labels.get('tp_rank', '?')}" + (f" {labels['reason']}" if "reason" in labels else "")
                values[key] = values.get(key, 0.0) + value
        if values:
            out.append(f"{label} " + ", ".join(f"{k}={v:g}" for k, v in sorted(values.items())))
    return out


@dataclass
class Launched:
    """A server the demo started: ready, or the reason it failed."""

    name: str
    server: rs.RealServer
    ready: bool = False
    ready_s: float = 0.0
    failed_s: float = 0.0
    failure: str = ""
    stopped: bool = False
    killed_at: float = 0.0  # time.monotonic() when the SIGKILL was sent (kill_at_stop)
    gate: QuietGate | None = None  # the lab's: a generation is held back while a timing needs quiet

    @property
    def returncode(self) -> int | None:
        return self.server.tree.exit_code()

    def log_text(self) -> str:
        return self.server.log_text()

    def log_count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log_text()))

    def _busy(self) -> contextlib.AbstractContextManager[None]:
        return self.gate.busy() if self.gate is not None else contextlib.nullcontext()

    def generate(self) -> list[list[int]]:
        with self._busy():
            return self.server.generate(list(PROMPTS), MAX_NEW_TOKENS)

    def generate_each(self) -> list[list[int]]:
        """The prompts one request at a time: the same batch shapes on every server. (One batch of
        all prompts is split by timing, 4+2 or 6; where weights are garbage, as in the slots
        sglang never writes, the float differences between batch shapes change greedy tokens.)
        Counts ~100 forward passes toward EPLB's interval."""
        with self._busy():
            return [self.server.generate([prompt], MAX_NEW_TOKENS)[0] for prompt in PROMPTS]

    def beliefs(self) -> dict[int, dict[str, Any]]:
        return self.server.beliefs()


class QuietGate:
    """Starts (servers, daemon sets) and generations run side by side in two lanes; a timing that must not
    measure the other lane's work (the takeover's) waits until none is under way and holds new work back
    until it is done. A start is mostly sglang's imports: two cores' worth of CPU for tens of seconds; a
    generation is both of a server's ranks' forward passes for a few seconds."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._starting = 0
        self._quiet = False

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._quiet)
            self._starting += 1
        try:
            yield
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def quiet(self, timeout_s: float = READY_TIMEOUT_S) -> Iterator[None]:
        with self._cond:
            self._quiet = True
            self._cond.wait_for(lambda: self._starting == 0, timeout=timeout_s)
        try:
            yield
        finally:
            with self._cond:
                self._quiet = False
                self._cond.notify_all()


@dataclass
class Lab:
    out: Path
    t0: float = field(default_factory=time.monotonic)
    status_log: list[str] = field(default_factory=list)
    launched: list[Launched] = field(default_factory=list)
    chains: list[Chain] = field(default_factory=list)
    gate: QuietGate = field(default_factory=QuietGate)

    def __post_init__(self) -> None:
        # The two lanes of cases (cases.run_all) run side by side in these threads; the third
        # starts a lane's next daemons while the lane is still busy with servers.
        self._background = concurrent.futures.ThreadPoolExecutor(3, thread_name_prefix="demo-start")
        self.out = Path(self.out).resolve()
        self.logs = self.out / "logs"
        shutil.rmtree(self.logs, ignore_errors=True)  # this run's logs only: the cases read them
        self.logs.mkdir(parents=True, exist_ok=True)
        self.model = build_tiny_qwen3_moe().resolve()

    def topology(self, enable_eplb: bool = True) -> rs.Topology:
        return rs.Topology(self.model, tp_size=WORLD, ep_size=WORLD, redundant_experts=2, enable_eplb=enable_eplb)

    # -- terminal ---------------------------------------------------------------------------

    def step(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def background(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        """``fn(*args, **kwargs)`` in a background thread; ``.result()`` waits for it."""
        return self._background.submit(fn, *args, **kwargs)

    # -- daemons ----------------------------------------------------------------------------

    def chain(self, name: str, standalone: bool = False, enable_eplb: bool = True, auto_repair: bool = True) -> Chain:
        """A new chain; ``standalone``: start its layout-aware daemons now (``python -m daemon_adapter``);
        ``auto_repair=False``: with ``--expert-layout-no-auto-repair`` (a torn move leaves them dirty)."""
        chain = Chain(name, rs.RunDir(self.logs / name))
        self.chains.append(chain)
        if standalone:
            extra = () if auto_repair else (NO_AUTO_REPAIR,)
            with self.gate.busy():
                chain.daemons = rs.StandaloneDaemons(chain.run, self.topology(enable_eplb), extra_args=extra).start()
                seconds = chain.start_s = chain.daemons.wait_ready(READY_TIMEOUT_S)
            flag = ("--enable-eplb" if enable_eplb else "no --enable-eplb") + (
                "" if auto_repair else f", {NO_AUTO_REPAIR}"
            )
            self.step(f"{name}: standalone daemons up (python -m daemon_adapter, {flag}) in {seconds:.0f}s")
        return chain

    # -- servers ----------------------------------------------------------------------------

    def server(
        self,
        name: str,
        chain: Chain | None,
        *,
        plugin: bool = True,
        mode: str = "client",
        init_map: Sequence[Sequence[int]] | None = None,
        stop_at: StopPoint | None = None,
        expect_ready: bool = True,
        rebalance: bool = True,
        metrics: bool = False,
        standby: bool = False,
    ) -> Launched:
        """Start ``python -m sglang.launch_server`` and wait until it serves or fails.

        ``chain=None``: a reference loaded from disk (no weight cache, no rebalance).
        ``rebalance=False``: EPLB on, but its interval is never reached.
        ``metrics``: sglang's ``--enable-metrics`` (``/metrics`` carries the plugin's series).
        ``standby``: a warm standby (``SGLANG_EXPERT_LAYOUT_ROLE=standby``), ready once parked on every daemon.
        """
        run = chain.run if chain is not None else rs.RunDir(self.logs / "reference")
        init = None
        if init_map is not None:
            init = rs.write_expert_location(run.root / f"{name}-init-expert-location.json", [list(r) for r in init_map])
        spec = rs.ServerSpec(
            name,
            weight_cache_mode=mode if chain is not None else "off",
            rebalance_iterations=REBALANCE_ITERATIONS if chain is not None and rebalance else NO_REBALANCE_ITERATIONS,
            layers_per_chunk=LAYERS_PER_CHUNK,
            init_expert_location=init,
            plugins=None if plugin else rs.PROTOCOL_OFF,
            stop_at=stop_at,
            extra_args=("--enable-metrics",) if metrics else (),
            extra_env={**NO_CRASH_DIAGNOSTICS, **({ROLE_ENV: STANDBY} if standby else {})},
        )
        with self.gate.busy():
            return self._start(name, chain, rs.RealServer(run, self.topology(), spec), standby, expect_ready)

    def _start(
        self, name: str, chain: Chain | None, server: rs.RealServer, standby: bool, expect_ready: bool
    ) -> Launched:
        launched = Launched(name, server.start(), gate=self.gate)
        self.launched.append(launched)
        t0 = time.monotonic()
        try:
            if standby:
                assert chain is not None, "a standby shares a chain's daemons"
                launched.ready_s = rs.wait_parked(chain.run, launched.server, WORLD, READY_TIMEOUT_S)
            else:
                launched.ready_s = launched.server.wait_ready(READY_TIMEOUT_S)
            launched.ready = True
        except rs.ServerFailed as failed:
            launched.failed_s = time.monotonic() - t0
            launched.failure = failure_line(launched.log_text()) or str(failed).splitlines()[0]
            launched.server.stop()
            launched.stopped = True
            if expect_ready:
                raise
        return launched

    def metrics(self, launched: Launched, what: str) -> str:
        """A few of the plugin's series on the server's ``/metrics``, per rank, as one step line."""
        try:
            samples = launched.server.metrics()
        except OSError as error:
            line = f"/metrics unreadable: {error!r}"
        else:
            line = "; ".join(_metric_summary(samples)) or "no expert-layout series"
        self.step(f"{what} | /metrics: {line}")
        return line

    def rounds(self, launched: Launched, count: int) -> None:
        """``count`` rounds of the prompts: forward passes that count toward EPLB's interval."""
        for _ in range(count):
            launched.generate()

    def until(self, launched: Launched, pattern: str, times: int, max_rounds: int = 20) -> int:
        """Rounds of requests until ``pattern`` appears ``times`` more times in the server's log."""
        start = launched.log_count(pattern)
        for _ in range(max_rounds):
            if launched.log_count(pattern) - start >= times:
                break
            launched.generate()
        return launched.log_count(pattern) - start

    def rebalance(self, launched: Launched, times: int) -> int:
        """Rounds until sglang logged ``times`` more ``[EPLBManager] rebalance end``."""
        return self.until(launched, REBALANCE_END, times)

    def kill_at_stop(self, launched: Launched, timeout_s: float = 120.0) -> float:
        """Requests until every rank is parked at the server's stop point, then SIGKILL its whole
        process tree; returns the seconds it took to get there. A parked rank blocks its forward
        pass, so the requests run in a thread that the kill ends."""
        server = launched.server
        t0 = time.monotonic()

        def drive() -> None:
            while server.tree.alive() and len(server.stopped_ranks()) < WORLD:
                try:
                    server.generate(list(PROMPTS), MAX_NEW_TOKENS)
                except OSError:
                    return  # the kill closed the connection

        threading.Thread(target=drive, name=f"drive-{launched.name}", daemon=True).start()
        server.wait_stopped(timeout_s)
        launched.killed_at = time.monotonic()
        server.kill()
        launched.stopped = True
        return time.monotonic() - t0

    def stop(self, *servers: Launched) -> None:
        for launched in servers:
            if not launched.stopped:
                launched.server.stop()
                launched.stopped = True

    # -- what the daemons say and hold ------------------------------------------------------

    def status(self, chain: Chain, label: str) -> list[dict[str, Any]]:
        """``expert-layout status`` on the chain's daemons: the table into ``status.md``, one line
        on the terminal; returns each daemon's state (with its map)."""
        table = rs.daemon_status_table(chain.run)
        self.status_log.append(f"## {label}\n\n```\n$ expert-layout status\n{table}\n```\n")
        data = rs.daemon_status(chain.run, include_map=True)
        states = [d.get("state") or {"phase": d.get("outcome"), "detail": d.get("detail")} for d in data["daemons"]]
        self.step(f"{label} | status: " + "; ".join(describe(s) for s in states))
        return states

    def wait_detached(self, chain: Chain, label: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """``status`` once the daemons noticed every detach (a killed engine's EOF reaches their
        watcher threads a moment after the kill)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            data = rs.daemon_status(chain.run)
            if all(not (d.get("state") or {}).get("attached") for d in data["daemons"]):
                break
            time.sleep(0.2)
        return self.status(chain, label)

    def wait_phase(self, chain: Chain, phase: str, timeout_s: float = 60.0) -> float:
        """Seconds until every daemon of the chain is in ``phase`` with nothing attached, asked every
        10 ms on their sockets (``torn_move.queried_states``); RuntimeError after ``timeout_s``."""
        t0 = time.monotonic()
        while True:
            states = torn_move.queried_states(chain.sockets())
            if all(s.get("phase") == phase and not s.get("attached") for s in states):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"{chain.name}: daemons not {phase} after {timeout_s:.0f}s: {states}")
            time.sleep(0.01)

    def held(self, chain: Chain) -> list[list[int]]:
        """What the chain's daemons' memory holds, slot by slot (``memory_probe``); each reading goes into
        the run's traces as the spec's truth."""
        return memory_probe.held_map(chain.sockets(), str(self.model), chain.run.root / "traces")

    def close(self) -> None:
        self._background.shutdown(wait=True)
        for launched in self.launched:
            if not launched.stopped:
                launched.server.kill()
                launched.stopped = True
        for chain in self.chains:
            if chain.daemons is not None:
                chain.daemons.stop()
        with open(self.out / "status.md", "w") as f:
            f.write("# `expert-layout status` between the demo's steps\n\n")
            f.write("\n".join(self.status_log))

    def timings(self) -> list[dict[str, Any]]:
        return [
            {
                "server": s.name,
                "ready": s.ready,
                "seconds": round(s.ready_s if s.ready else s.failed_s, 1),
                "failure": s.failure,
            }
            for s in self.launched
        ]


def describe(state: dict[str, Any]) -> str:
    """One daemon's state in a few words, for a progress line."""
    if state.get("version") is None:
        return str(state.get("phase") or "no record")
    parts = [f"{state.get('phase')} v{state.get('version')}"]
    if state.get("attached"):
        parts.append(f"{len(state['attached'])} attached")
    if state.get("pending"):
        parts.append("move pending")
    return " ".join(parts)


def failure_line(log: str) -> str:
    """The line that says why a server failed: a refusal of this project, or an exception's message."""
    patterns = (
        r"[^\n]*\[expert-layout\][^\n]*(fail|refus|dirty|cannot|must)[^\n]*",
        r"[^\n]*\b[A-Z]\w+(Error|Exception): [^\n]*",
    )
    for pattern in patterns:
        found = [m.group(0) for m in re.finditer(pattern, log)]
        if found:
            return " ".join(found[-1].split())
    return ""


def same_record(states: Sequence[dict[str, Any]]) -> bool:
    return len({(s.get("version"), s.get("digest")) for s in states}) == 1 and states[0].get("digest") is not None


def record_map(states: Sequence[dict[str, Any]]) -> list[list[int]]:
    rows = states[0].get("map")
    if not rows:
        raise RuntimeError(f"the daemons' record has no map: {states[0]}")
    return [list(r) for r in rows]


def believed_map(beliefs: dict[int, dict[str, Any]]) -> list[list[int]]:
    """The map every rank routes with (they must agree)."""
    maps = [b["map"] for _, b in sorted(beliefs.items())]
    if len(maps) != WORLD or any(m != maps[0] for m in maps):
        raise RuntimeError(f"the ranks' beliefs are missing or disagree: {beliefs}")
    return [list(r) for r in maps[0]]


def differing(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> int:
    """Prompts whose greedy outputs differ."""
    return sum(int(list(x) != list(y)) for x, y in zip(a, b, strict=True))
