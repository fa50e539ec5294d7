"""Seeded fault schedules on the in-process harness: real daemon processes, engines of two rank
processes over gloo running sglang's own startup, loader and EPLB code with the plugin, SIGKILLed
at points drawn from the seed.

A schedule is drawn from its seed alone (``draw``), before it runs, so the printed seed replays it.
Its operations name engines by age (the newest, the oldest live one), and one whose engine is
gone is skipped. After every operation each live engine must route with the memory it maps
(its map's expert in every slot). The daemons repair a torn move on their own, and a daemon
started again rejoins at the others' record when an engine's startup asks it to: both reload
from the toy's checkpoint (``FakeCheckpointReload``). At the end every engine is killed, and a
new engine must start on the daemons as they are left, or, where they refuse it (a repair that
failed), on daemons restarted from disk; it must route with their memory. Then every trace the
schedule wrote must be a behaviour of the protocol (``tools.trace_check``; the independent oracle,
``tools.oracle``, where it is installed; TLC on a seeded sample, ``tools.mirror.trace_tla``).

Some seeds also arm a reply fault on one rank's commit, or begin, of one chunk
(``rank_scripts.ReplyFault``): its reply lost, the request never sent, or rows the daemon refuses.
Every rank must then stop rebalancing (as unverified after a commit's, as refused after a begin's),
and the daemon that took a begin or did not record a commit keep its move pending.

The last engine needing the daemons restarted, and a rejoin refused, must have a cause in the
schedule (``LAGGING``, ``TORN``, ``DIED_IN_RELOAD``, ``REPAIR_FAILED``, ``REJOIN_BESIDE``); where
none explains it, the schedule fails.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import random
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layout_sm.messages import query_request
from layout_sm.reasons import Reason
from layout_sm.trace_codec import TRACE_ENV
from tools.chaos import rank_scripts
from tools.chaos.rank_scripts import BEGIN_FAULT, BEGIN_FAULTS, COMMIT_FAULTS, KillPoint, ReplyFault
from tools.harness import toy_moe
from tools.harness.daemon_proc import DaemonProcess, rank_cache_config, request, start_daemon
from tools.harness.engine_ranks import (
    RANK_LOG_DIR_ENV,
    EngineRanks,
    EngineSpec,
    RankResult,
    install_recorder_stand_in,
    select_plugins,
    write_model_dir,
)
from tools.oracle import traces as oracle_traces
from tools.trace_check import Verdict, check_all, reports, summary

WORLD = 2
CPU_TRANSPORT = "tools.harness.cpu_transport:CpuShmTransportBackend"  # any number of engines map it
RUN_TIMEOUT_S = 60.0
WAIT_TIMEOUT_S = 1.0  # an engine's startup wait for a daemon with a move pending (the plugin's timeout)

# The events a kill may follow, by operation: the startup's (attach, the findings' all-gather,
# agreement, polls of a daemon with a move pending, the fetch) and the rebalance's (a chunk's
# begin answered, the decision on the gathered replies, the move, the commit answered, the
# all-gather of commits, the verification at the end).
STARTUP_EVENTS = ("attach", "gather", "agree", "poll", "fetch", "install_checked", "start")
REBALANCE_EVENTS = ("chunk", "begin", "decide", "move", "commit", "committed", "owed_gathered", "verify", "abort")
CHUNK_EVENTS = ("chunk", "begin", "decide", "move", "commit", "committed")


@dataclass(frozen=True)
class Operation:
    kind: str  # engine, rebalance, kill_engine, stop_engine, kill_daemon, restart_daemons, die_in_reload
    rank: int = 0  # the rank that kills (kill points) or the daemon killed
    kill: tuple[str, int, str] | None = None  # (event, count, "rank" or "daemon")
    alongside: bool = False  # an engine started while another one is live (a warm standby's start)
    # A reply fault armed from this rebalance on: (kind, rank, the count-th commit of a rebalance). It
    # stays armed until a rebalance of a live engine commits that many chunks on that rank. The fault's
    # rebalance is an operation of its own, drawn apart: a seed's other operations stay as they were.
    fault: tuple[str, int, int] | None = None

    def describe(self) -> str:
        said = self._describe()
        if self.fault is None:
            return said
        kind, rank, count = self.fault
        return f"{said} [from here, rank {rank}'s {_faulted_request(kind)} #{count}: {kind}]"

    def _describe(self) -> str:
        if self.kind == "kill_daemon":
            return f"kill_daemon(rank {self.rank}, restart)"
        if self.kind == "die_in_reload":
            return f"daemon {self.rank} dies inside its first reload"
        kind = "engine alongside" if self.alongside else self.kind
        if self.kill is None:
            return kind
        event, count, what = self.kill
        what = "daemon and the engines on it" if what == "daemon" else what
        return f"{kind}(rank {self.rank} kills its {what} after {event} #{count})"


def _faulted_request(kind: str) -> str:
    return "begin" if kind.startswith(BEGIN_FAULT) else "commit"


def draw(seed: int) -> list[Operation]:
    """The schedule of ``seed``: an engine first, then 2 to 6 operations; with some seeds a daemon
    is first armed to die inside its first reload (a repair's, or a rejoin's)."""
    rng = random.Random(seed)
    kinds = ("engine", "rebalance", "kill_engine", "stop_engine", "kill_daemon", "restart_daemons")
    weights = (5, 6, 1, 1, 1.5, 0.5)
    armed = [Operation("die_in_reload", rank=rng.randrange(WORLD))] if rng.random() < 0.3 else []
    ops = [*armed, _with_kill(rng, "engine")]
    for _ in range(rng.randint(2, 6)):
        ops.append(_with_kill(rng, rng.choices(kinds, weights)[0]))
    return _with_fault(seed, ops)


FAULT_SALT = 0x5EED_FA17  # the reply fault's own draw: the other draws of a seed stay as they were
FAULT_P = 0.35  # the share of schedules with a reply fault armed on one rank's commit
# A begin's fault, drawn only where no commit fault was, from a draw of its own: the schedules drawn
# before the begin's faults existed stay as they were.
BEGIN_FAULT_SALT = 0xB361_FA17
BEGIN_FAULT_P = 0.15  # the share of the schedules without a commit fault that get a begin's fault


DURABLE_SALT = 0xD0_AB1E  # whether a schedule's daemons keep durable copies: a draw of its own, as the faults'
DURABLE_P = 0.5


def durable(seed: int) -> bool:
    """Whether ``seed``'s daemons keep durable copies (``daemon_adapter.durable``): a daemon killed, or
    every daemon (``restart_daemons``), then starts again from its copy, its weights at the copy's map.
    Without, from disk at version 0. Drawn apart: the other draws of a seed stay as they were."""
    return random.Random(seed ^ DURABLE_SALT).random() < DURABLE_P


def _with_fault(seed: int, ops: list[Operation]) -> list[Operation]:
    """With some seeds, a rebalance armed with a reply fault right after one of the engine starts: the
    first rebalance of a live engine from there on that sends the chunk's commit (or begin) on that rank
    takes it."""
    rng = random.Random(seed ^ FAULT_SALT)
    kinds = COMMIT_FAULTS
    if rng.random() >= FAULT_P:
        rng, kinds = random.Random(seed ^ BEGIN_FAULT_SALT), BEGIN_FAULTS
        if rng.random() >= BEGIN_FAULT_P:
            return ops
    n = rng.choice([n for n, op in enumerate(ops) if op.kind == "engine"])
    fault = (rng.choice(kinds), rng.randrange(WORLD), rng.randint(1, toy_moe.ToyMoEConfig().num_layers))
    return [*ops[: n + 1], Operation("rebalance", fault=fault), *ops[n + 1 :]]


def _with_kill(rng: random.Random, kind: str) -> Operation:
    if kind == "kill_daemon":
        return Operation(kind, rank=rng.randrange(WORLD))
    alongside = kind == "engine" and rng.random() < 0.25
    if kind not in ("engine", "rebalance") or rng.random() < 0.4:
        return Operation(kind, alongside=alongside)
    event = rng.choice(STARTUP_EVENTS if kind == "engine" else REBALANCE_EVENTS)
    # A rebalance takes a chunk's events once per layer; its end (owed_gathered, verify) once.
    count = rng.randint(1, toy_moe.ToyMoEConfig().num_layers) if event in CHUNK_EVENTS else 1
    kill = (event, count, rng.choice(("rank", "daemon")))
    return Operation(kind, rank=rng.randrange(WORLD), kill=kill, alongside=alongside)


# Why the last engine may legitimately need the daemons restarted from disk: what the schedule did
# since the daemons were last all restarted. Anything else is an anomaly, and the schedule fails.
TORN = "a chunk torn between two ranks' commits"  # a rank killed after its move or its commit: the peer's may land
# After "decide" the move, a collective, needs the dead rank; after "committed" both commits landed.
TORN_EVENTS = ("move", "commit")
LAGGING = "a daemon behind the others"  # a commit the daemon never recorded, its mover gone: it rejoins
DIED_IN_RELOAD = "a daemon died in its reload"  # a repair's or a rejoin's reload killed: no record to serve
REPAIR_FAILED = "a daemon's repair failed"  # its torn move stays dirty: engines are refused until a restart
UNEXPLAINED = "restart the schedule did not cause"
REJOIN_BESIDE = "rejoin refused beside a live engine"  # the rejoin's guard: no other engine attached
REJOIN_ALONE = "rejoin refused with no other engine"
# A daemon whose record lags the others' (a refused or lost commit, then its mover's death) repairs back
# to the base version, and the next startup has it rejoin at the others' record: a restart it needs is
# an anomaly too.
FAILING_CAUSES = {UNEXPLAINED, REJOIN_ALONE, LAGGING}
REJOIN_REFUSED = "asked its daemon to rejoin and was refused"  # the startup's words (startup_rules)


@dataclass
class Engine:
    name: str
    pool: EngineRanks
    daemon_pids: tuple[int | None, ...]  # the daemons it loaded from
    source: str | None

    @property
    def alive(self) -> bool:
        return bool(self.pool.pids)


@dataclass
class Outcome:
    seed: int
    ops: list[str]
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what happened, operation by operation
    kills: int = 0  # kill points that fired
    faults: dict[str, int] = field(default_factory=dict)  # reply faults injected, by kind
    anomalies: dict[str, int] = field(default_factory=dict)  # the last engine's restarts, rejoins refused, by cause
    traces: str = ""  # the trace check's summary line
    timings: dict[str, float] = field(default_factory=dict)  # seconds by operation
    daemon_steps: dict[str, int] = field(default_factory=dict)  # the daemons' traced steps, by event
    tlc: str = ""  # TLC's verdict on the traces, for people, where the campaign asked for it (--tlc)
    tlc_ok: bool | None = None  # TLC accepted every run of the schedule; None: TLC did not run
    oracle: str = ""  # the independent oracle's word ("checked", "rejected"); "": the schedule broke first
    seconds: float = 0.0

    def fail(self, problem: str) -> None:
        self.ok = False
        self.problems.append(problem)

    def anomaly(self, cause: str, what: str) -> None:
        """A restart or refusal the campaign counts by ``cause``; one the schedule did not cause fails it."""
        self.anomalies[cause] = self.anomalies.get(cause, 0) + 1
        if cause in FAILING_CAUSES:
            self.fail(f"{what}: {cause}")


class World:
    """One schedule's daemons (one per rank) and engines, in a folder of its own."""

    def __init__(
        self,
        root: Path,
        model_dir: str,
        cfg: toy_moe.ToyMoEConfig,
        die_in_reload: int | None = None,
        durable: bool = False,
    ) -> None:
        self.root = root
        self.cfg = cfg
        self.traces = root / "traces"
        self.traces.mkdir(parents=True)
        os.environ[TRACE_ENV] = str(self.traces)
        os.environ[RANK_LOG_DIR_ENV] = str(root)  # sglang's and the plugin's logs, per rank
        initial = toy_moe.trivial_map(cfg)
        self.daemons: list[DaemonProcess] = []
        for rank in range(WORLD):
            config = rank_cache_config(model_dir, rank, WORLD)
            self.daemons.append(
                start_daemon(
                    str(root / f"rank{rank}.sock"),
                    physical_to_logical_map=initial,
                    num_logical=cfg.num_logical,
                    tensors=toy_moe.rank_state(cfg, rank, initial),
                    config=config,
                    transport_backend=CPU_TRANSPORT,
                    checkpoint=(cfg, rank),
                    auto_repair=True,
                    die_in_reload=self.died_marker(rank) if rank == die_in_reload else None,
                    durable=durable,
                    log_path=str(root / f"daemon-rank{rank}.log"),
                    wait=False,
                )
            )
        for daemon in self.daemons:
            daemon.wait_ready()
            daemon.spec = dataclasses.replace(daemon.spec, die_in_reload=None)  # started again, it lives
        self.died_in_reload: set[int] = set()
        self.engines: list[Engine] = []
        self.fault: tuple[str, int, int] | None = None  # the reply fault armed now (Operation.fault)
        self.causes: set[str] = set()  # why the daemons may not agree, since they were last all restarted
        self.phase = 0
        self.made = 0

    def died_marker(self, rank: int) -> str:
        return str(self.root / f"daemon-rank{rank}.died-in-reload")

    def spec(self) -> EngineSpec:
        return EngineSpec(
            sockets=tuple(d.socket_path for d in self.daemons),
            cfg=self.cfg,
            layers_per_chunk=1,
            wait_timeout=WAIT_TIMEOUT_S,
        )

    def daemon_pids(self) -> tuple[int | None, ...]:
        return tuple(d.pid if d.alive else None for d in self.daemons)

    def live(self) -> list[Engine]:
        self.engines = [e for e in self.engines if e.alive]
        return self.engines

    def kill_point(self, op: Operation, rank: int, pool: EngineRanks) -> KillPoint | None:
        """``op``'s kill point for ``rank`` of ``pool``. Every engine here is attached to every daemon, so
        a daemon's death takes every live engine's ranks with it (the spec's ``Lose``)."""
        if op.kill is None or rank != op.rank:
            return None
        event, count, what = op.kill
        if what == "rank":
            return KillPoint(event, count, (), what, str(self.kill_marker))
        daemon = self.daemons[rank].pid
        if daemon is None:
            return None
        others = [pid for engine in self.live() if engine.pool is not pool for pid in engine.pool.pids]
        own = [pid for r, pid in enumerate(pool.pids) if r != rank]
        return KillPoint(event, count, (*others, *own, daemon), what, str(self.kill_marker))

    def reply_fault(self, rank: int) -> ReplyFault | None:
        if self.fault is None or rank != self.fault[1]:
            return None
        kind, _, count = self.fault
        return ReplyFault(kind, count, str(self.fault_marker))

    @property
    def fault_marker(self) -> Path:
        return self.root / "reply-fault-fired"

    def _count_fault(self, out: Outcome) -> tuple[str, int] | None:
        if self.fault is None or not self.fault_marker.exists():
            return None
        kind, rank, count = self.fault
        self.fault = None  # fired: one per schedule
        self.fault_marker.unlink()
        out.faults[kind] = out.faults.get(kind, 0) + 1
        if kind in ("lost_request", "bad_rows"):  # the daemon did not record it: it keeps the move pending,
            self.causes.add(LAGGING)  # then repairs back to the version before it
        out.notes.append(f"rank {rank}'s {_faulted_request(kind)} #{count} faulted: {kind}")
        return kind, rank

    def _check_fault(self, kind: str, rank: int, results: list[RankResult], out: Outcome) -> None:
        """Where the engine lived through it: a faulted commit stops every rank's rebalancing as
        unverified, a faulted begin as refused; a daemon that did not record the commit, or took the
        begin, keeps its move pending; a begin that never reached its daemon leaves it none."""
        if not all(r.ok and not r.value.get("error") for r in results):
            return  # a kill point of the same operation, or a death it caused
        said = f"a {kind} {_faulted_request(kind)}"
        reasons = [r.value.get("stats", {}).get("off_reason") for r in results]
        want = Reason.BEGIN_REFUSED.value if kind.startswith(BEGIN_FAULT) else Reason.COMMIT_UNVERIFIED.value
        if any(reason != want for reason in reasons):
            out.fail(f"{said}: the ranks' rebalancing ended with {reasons}, not {want}")
        if kind == "lost_reply" or not self.daemons[rank].alive:
            return
        pending = request(self.daemons[rank].socket_path, query_request()).get("pending")
        if kind == BEGIN_FAULT + "lost_request":
            if pending is not None:
                out.fail(f"{said}: daemon {rank} holds a move pending, though no begin reached it")
        elif pending is None:
            out.fail(f"{said}: daemon {rank} keeps no move pending while its mover lives")

    @property
    def kill_marker(self) -> Path:
        return self.root / "kill-point-fired"

    def lose_engines(self) -> None:
        """Every live engine dies: a daemon is about to die, or has died (the spec's ``Lose``)."""
        for engine in self.live():
            engine.pool.kill()

    def run_each(
        self, pool: EngineRanks, script: Callable[..., Any], args: Callable[[int], tuple[Any, ...]]
    ) -> list[RankResult]:
        return pool.run_each([(script, args(rank)) for rank in range(WORLD)], timeout=RUN_TIMEOUT_S)

    def start_engine(self, op: Operation, out: Outcome) -> Engine | None:
        self.made += 1
        beside = bool(self.live())
        pool = EngineRanks(WORLD, workdir=str(self.root.parent), start_method="fork").start()
        spec = self.spec()
        loaded_from = self.daemon_pids()
        results = self.run_each(pool, rank_scripts.start, lambda r: (spec, self.kill_point(op, r, pool)))
        self._count_kill(op, results, out)
        name = f"E{self.made}"
        # A rank whose weights did not load fails sglang's startup: that engine never serves.
        if not all(r.ok and r.value["started"] and r.value.get("source") for r in results):
            out.notes.append(f"{name} did not start: {_why(results)}")
            if REJOIN_REFUSED in _why(results):
                out.anomaly(REJOIN_BESIDE if beside else REJOIN_ALONE, f"{name}'s startup")
            _hung(results, out, f"engine {name}'s startup")
            pool.kill()
            return None
        sources = {r.value.get("source") for r in results}
        engine = Engine(name, pool, loaded_from, sources.pop() if len(sources) == 1 else "mixed")
        out.notes.append(f"{name} started ({engine.source})")
        self.engines.append(engine)
        return engine

    def rebalance(self, engine: Engine, op: Operation, out: Outcome) -> None:
        self.phase += 1
        phase = self.phase
        pool = engine.pool
        results = self.run_each(
            pool, rank_scripts.rebalance, lambda r: (phase, self.kill_point(op, r, pool), self.reply_fault(r))
        )
        self._count_kill(op, results, out)
        fired = self._count_fault(out)
        if fired is not None:
            self._check_fault(*fired, results, out)
        _hung(results, out, f"engine {engine.name}'s rebalance")
        moved = [r.value.get("moved") for r in results if r.ok]
        out.notes.append(f"{engine.name} rebalanced: {_why(results) if not all(r.ok for r in results) else moved}")

    def _count_kill(self, op: Operation, results: list[RankResult], out: Outcome) -> None:
        if op.kill is None:
            return
        event, count, what = op.kill
        # The rank SIGKILLs itself last; the pool may see a peer it killed die first and call it "killed".
        fired = results[op.rank].kind == "died" or self.kill_marker.exists()
        self.kill_marker.unlink(missing_ok=True)
        if fired and what == "daemon":
            # Its SIGKILL was sent, but a process takes a moment to exit: the daemon is down before
            # anything else runs (the spec's Lose), and settle() starts it again.
            self.daemons[op.rank].kill()
        if fired and what == "rank" and event in TORN_EVENTS:
            self.causes.add(TORN)  # the dead rank's daemon repairs back; its peer's may have recorded the commit
        if fired:
            out.kills += 1
            out.notes.append(f"rank {op.rank} killed its {what} after {event} #{count}")

    def settle(self, out: Outcome, timeout: float = 10.0) -> None:
        """A daemon that a kill point killed is restarted (its supervisor would); then wait until each
        daemon counts no more than the live engines attached (an engine's death is a detach the
        daemon's watcher notices a moment later) and repairs nothing (a torn move's auto repair). A
        daemon that died meanwhile (inside that repair's reload) is restarted, and waited for, too."""
        for _ in range(2):
            self._restart_dead(out)
            self._wait_settled(timeout)
            if all(daemon.alive for daemon in self.daemons):
                return

    def _restart_dead(self, out: Outcome) -> None:
        for rank, daemon in enumerate(self.daemons):
            if rank not in self.died_in_reload and os.path.exists(self.died_marker(rank)):
                self.died_in_reload.add(rank)
                self.causes.add(DIED_IN_RELOAD)
                out.kills += 1
                out.notes.append(f"daemon {rank} died inside a reload")
            if not daemon.alive:
                self.lose_engines()
                self.restart_daemon(rank)
                out.notes.append(f"daemon {rank} restarted after its kill")

    def _wait_settled(self, timeout: float) -> None:
        live = len(self.live())
        deadline = time.monotonic() + timeout
        for daemon in self.daemons:
            while daemon.alive and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    state = request(daemon.socket_path, query_request())
                    if state.get("repair_failed"):
                        self.causes.add(REPAIR_FAILED)
                    if len(state.get("attached") or []) <= live and state.get("phase") != "repairing":
                        break
                time.sleep(0.02)

    def check_routing(self, out: Outcome, when: str) -> None:
        """Every live engine routes with the memory it maps; readings of a daemon's memory go into
        the traces as truth."""
        for engine in self.live():
            truth = engine.source == "daemon" and engine.daemon_pids == self.daemon_pids()
            results = engine.pool.run(rank_scripts.report, truth, timeout=RUN_TIMEOUT_S)
            if not all(r.ok for r in results):
                out.fail(f"{when}: engine {engine.name} did not report: {_why(results)}")
                engine.pool.kill()
                continue
            believed = results[0].value["map"]
            held = toy_moe.join_rank_slots([r.value["slots"] for r in results])
            if any(r.value["map"] != believed for r in results):
                out.fail(f"{when}: engine {engine.name}'s ranks route with different maps")
            wrong = toy_moe.count_mismatches(believed, held)
            if wrong:
                out.fail(f"{when}: engine {engine.name} routes to the wrong expert in {wrong} slots")

    def restart_daemon(self, rank: int) -> None:
        """One daemon started again from disk: the next engine's startup has it rejoin at the other's
        record, which ends a disagreement of the two (a torn chunk, a lagging daemon), whichever lagged."""
        self.daemons[rank].restart()
        self.causes -= {TORN, LAGGING}

    def restart_daemons(self) -> None:
        self.causes.clear()  # every daemon from disk: they agree again
        self.lose_engines()
        for daemon in self.daemons:
            daemon.kill()
        for daemon in self.daemons:
            daemon.start(wait=False)
        for daemon in self.daemons:
            daemon.wait_ready()

    def close(self) -> None:
        for engine in self.engines:
            engine.pool.kill()
        for daemon in self.daemons:
            daemon.kill()


def _why(results: list[RankResult]) -> str:
    return "; ".join(
        f"rank {r.rank}: {r.error or r.value.get('error') or r.value.get('load_error')}"
        for r in results
        if not r.ok or (isinstance(r.value, dict) and (r.value.get("error") or r.value.get("load_error")))
    )


def _hung(results: list[RankResult], out: Outcome, what: str) -> None:
    if any(r.kind == "hung" for r in results):
        out.fail(f"{what} hung: {_why(results)}")


TLC_SALT = 0x71C_5A3B1E  # the TLC sample's own draw from the seed
TLC_SAMPLE = 0.1  # the share of schedules TLC checks by default (every failing one besides)


def tlc_sampled(seed: int) -> bool:
    """Whether the default campaign runs TLC on ``seed``'s traces (a seeded one in ten)."""
    return random.Random(seed ^ TLC_SALT).random() < TLC_SAMPLE


def run_schedule(seed: int, root: Path, model_dir: str, cfg: toy_moe.ToyMoEConfig, tlc: str = "off") -> Outcome:
    """Run ``seed``'s schedule in ``root``. ``tlc``: TLC on its traces for every schedule ("all"), for the
    seeded sample and every failing schedule ("sample"), or never ("off")."""
    ops = draw(seed)
    copies = durable(seed)
    out = Outcome(seed, [*(["daemons keep durable copies"] if copies else []), *(op.describe() for op in ops)])
    started = time.monotonic()
    world = World(root, model_dir, cfg, next((op.rank for op in ops if op.kind == "die_in_reload"), None), copies)
    out.timings["daemons"] = time.monotonic() - started
    try:
        for n, op in enumerate(ops):
            live = world.live()
            op_started = time.monotonic()
            if op.fault is not None:
                world.fault = op.fault
            if op.kind == "engine" and (not live or (op.alongside and len(live) < 2)):
                world.start_engine(op, out)
            elif op.kind == "rebalance" and live:
                world.rebalance(live[-1], op, out)
            elif op.kind == "kill_engine" and live:
                live[-1].pool.kill()
                out.notes.append(f"{live[-1].name} killed")
            elif op.kind == "stop_engine" and live:
                live[0].pool.run(rank_scripts.stop, timeout=RUN_TIMEOUT_S)
                live[0].pool.close()
                out.notes.append(f"{live[0].name} stopped")
            elif op.kind == "kill_daemon":
                world.lose_engines()
                world.restart_daemon(op.rank)
                out.notes.append(f"daemon {op.rank} killed and restarted")
            elif op.kind == "restart_daemons":
                world.restart_daemons()
                out.notes.append("daemons restarted")
            world.settle(out)
            out.timings[op.kind] = out.timings.get(op.kind, 0.0) + time.monotonic() - op_started
            checked = time.monotonic()
            world.check_routing(out, f"after operation {n + 1} ({op.describe()})")
            out.timings["check"] = out.timings.get("check", 0.0) + time.monotonic() - checked
        recovered = time.monotonic()
        _recover(world, out)
        out.timings["last engine"] = time.monotonic() - recovered
    except Exception:  # the harness itself broke: the schedule fails with its words
        out.fail(f"the harness broke: {traceback.format_exc()}")
    finally:
        world.close()
        os.environ.pop(TRACE_ENV, None)
        os.environ.pop(RANK_LOG_DIR_ENV, None)
    checked = time.monotonic()
    verdicts = check_all([world.traces])
    out.timings["trace check"] = time.monotonic() - checked
    sampled = tlc == "all" or (tlc == "sample" and tlc_sampled(seed))
    check_traces(world.traces, verdicts, out, sampled, tlc_if_failed=tlc == "sample")
    out.seconds = time.monotonic() - started
    return out


def check_traces(traces: Path, verdicts: list[Verdict], out: Outcome, tlc: bool, tlc_if_failed: bool = False) -> None:
    """The Python checker's verdicts into ``out``; the independent oracle's (``tools.oracle``); with
    ``tlc``, or ``tlc_if_failed`` where the schedule failed so far, TLC's on the same traces too
    (``tools.mirror.trace_tla``): the schedule fails where any says "not a behaviour"."""
    out.traces = summary(verdicts)
    out.daemon_steps = daemon_steps(verdicts)
    if not all(v.ok for v in verdicts):
        out.fail("a trace is not a behaviour of the protocol:\n" + reports(verdicts))
    check_oracle(traces, out)
    if not (tlc or (tlc_if_failed and not out.ok)):
        return
    from tools.mirror.trace_tla import compare

    found, why = compare([traces], verdicts=verdicts)
    if not found or any(c.tlc is None for c in found):
        out.fail(f"TLC did not check the traces: {why if found else 'no daemon trace'}")
        return
    out.tlc = "; ".join(c.line().partition(": ")[2] for c in found)
    out.tlc_ok = all(c.tlc is not None and c.tlc.accepted for c in found)
    for comparison in found:
        if comparison.tlc is not None and not comparison.tlc.accepted:
            out.fail(f"TLC: not a behaviour of the spec: {comparison.line()}\n{comparison.tlc.report}")


def check_oracle(traces: Path, out: Outcome) -> None:
    """The independent oracle (``tools.oracle``: the spec transcribed without ``layout_sm``), so that a
    bug in the core, which ``tools.trace_check`` replays the traces on, cannot judge itself."""
    out.oracle = "checked"
    wrong = [v for v in oracle_traces.check_paths([traces]) if not v.accepted]  # a folder, as trace_check
    if wrong:
        out.oracle = "rejected"
        out.fail("the independent oracle: not a behaviour of the spec:\n" + "\n".join(v.report() for v in wrong))


def daemon_steps(verdicts: list[Verdict]) -> dict[str, int]:
    """The steps the daemons' traces hold, by event (what the campaign made the daemons do)."""
    steps: collections.Counter[str] = collections.Counter()
    for verdict in verdicts:
        if verdict.kind == "daemon":
            steps.update(verdict.events)
    return dict(steps)


def _recover(world: World, out: Outcome) -> None:
    """Every engine killed; a new engine starts on the daemons as left, or on daemons restarted from
    disk where they refuse it, and routes with their memory."""
    for engine in world.live():
        engine.pool.kill()
    world.settle(out)
    engine = world.start_engine(Operation("engine"), out)
    if engine is None or engine.source != "daemon":
        if engine is not None:
            engine.pool.kill()
            world.settle(out)
        cause = min(world.causes) if world.causes else UNEXPLAINED  # one name per schedule, as stable as the set
        out.anomaly(cause, "the last engine needed the daemons restarted")
        world.restart_daemons()
        out.notes.append("daemons restarted for the last engine")
        engine = world.start_engine(Operation("engine"), out)
    if engine is None or engine.source != "daemon":
        out.fail("no engine could start from the daemons, even restarted from disk")
        return
    world.check_routing(out, "the last engine")
    engine.pool.run(rank_scripts.stop, timeout=RUN_TIMEOUT_S)
    engine.pool.close()


def warm_imports() -> None:
    """Import what a rank imports and apply the hooks it applies, so that each forked rank starts
    without sglang's seconds of imports and hook patching; no torch op runs here (a forked child
    cannot use its parent's thread pools)."""
    import sglang.srt.configs.model_config
    import sglang.srt.distributed.parallel_state
    import sglang.srt.eplb.eplb_manager
    import sglang.srt.eplb.expert_location_updater
    import sglang.srt.model_executor.model_runner
    import sglang.srt.plugins
    import sglang.srt.server_args
    import sglang.srt.weight_cache.ipc_loader
    from sglang.srt.models.registry import import_model_classes

    import engine_adapter.plugin  # noqa: F401

    import_model_classes("sglang.srt.models")  # cached: a rank resolving the toy's architecture reuses it
    # sglang's apply_hooks walks every loaded module per target, most of a rank's start: done here once.
    # A rank's own load_plugins() is then a no-op, and the set is the one a rank would apply (called from
    # a harness module, the plugin registers an engine process's hooks).
    select_plugins()
    sglang.srt.plugins.load_plugins()
    install_recorder_stand_in()


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="expert-layout-chaos-"))


def model(root: Path) -> tuple[str, toy_moe.ToyMoEConfig]:
    """The toy model's folder under ``root`` (where the ranks look for it) and its shape."""
    cfg = toy_moe.ToyMoEConfig()
    return write_model_dir(cfg, str(root)), cfg


def cleanup(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
