"""Seeded fault schedules on real ``python -m sglang.launch_server`` servers (TP2/EP2, the tiny MoE,
standalone layout-aware daemons with auto repair, as deployed).

A schedule, drawn from its seed: server A rebalances one layer per chunk and every rank stops at a
point drawn from the seed (after a chunk's begin was answered, after sglang moved it and before its
commit, or after its commit), where A's whole process tree is SIGKILLed. What follows, by the seed:

- ``fresh``: server B starts on the daemons as left (a torn move is repaired by the daemons on their
  own first); with some seeds the daemons are SIGKILLed and restarted from disk before it;
- ``standby``: a warm standby S, started beside A and parked, takes over from the killed A;
- ``standby killed``: S's takeover stops once its first daemon granted its claim (a partial grant),
  S's tree is SIGKILLed there, and B starts on the daemons as S left them.

The server that serves at the end (B or S) must serve: every rank routes with the same map, the
daemons' memory holds that map slot by slot (``tools.demo.memory_probe``), and its outputs equal a
server's loaded from disk with that map (one reference per map in a campaign: a disk server's
outputs depend on its map alone). Every trace of the run must be a behaviour of the protocol.
"""

from __future__ import annotations

import random
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_adapter.roles import ROLE_ENV, STANDBY
from tools.chaos.campaign import Outcome, check_traces
from tools.demo import memory_probe
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS, build_tiny_qwen3_moe
from tools.realserver.server import (
    DiskReferences,
    RealServer,
    RunDir,
    ServerFailed,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
    park,
    start_standby_beside,
    wait_parked,
)
from tools.trace_check import check_all

START_TIMEOUT_S = 600.0
PROMPT_TIMEOUT_S = 240.0
STOPS = ("mid_move", "before_commit", "after_commit")
FOLLOWERS = ("fresh", "standby", "standby killed")
STANDBY_ENV = {ROLE_ENV: STANDBY}


@dataclass(frozen=True)
class RealSchedule:
    stop: StopPoint  # where A's ranks stop before the SIGKILL
    follower: str  # one of FOLLOWERS: what serves after A
    restart: bool  # the daemons SIGKILLed and restarted from disk before B starts

    def describe(self) -> list[str]:
        ops = [f"server A stops at {self.stop.env_value()}, SIGKILL"]
        if self.follower != "fresh":
            ops.insert(0, "warm standby S parks beside A")
            ops.append("S takes over" if self.follower == "standby" else "S killed inside its takeover")
        if self.restart:
            ops.append("daemons SIGKILLed, restarted")
        if self.follower != "standby":
            ops.append("server B on the daemons")
        return [*ops, "against a disk reference"]


def draw(seed: int) -> RealSchedule:
    rng = random.Random(seed)
    stop = StopPoint(rng.choice(STOPS), rng.randint(1, 3))
    follower = FOLLOWERS[seed % len(FOLLOWERS)]  # any three seeds in a row take each
    return RealSchedule(stop, follower, follower != "standby" and rng.random() < 0.5)


def _states(run: RunDir) -> list[dict[str, Any]]:
    return [d.get("state") or {} for d in daemon_status(run, include_map=True)["daemons"]]


def _settled(run: RunDir, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """The daemons' states once nothing is attached and no repair runs (a torn move's auto repair)."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(run)
        busy = any(s.get("attached") or s.get("phase") == "repairing" for s in states)
        if (states and not busy) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def run_real_schedule(seed: int, root: Path, references: DiskReferences | None = None, tlc: bool = False) -> Outcome:
    schedule = draw(seed)
    out = Outcome(seed, schedule.describe())
    started = time.monotonic()
    run = RunDir(root / "run")
    topology = Topology(build_tiny_qwen3_moe())
    daemons = StandaloneDaemons(run, topology).start()
    servers: list[RealServer] = []
    try:
        daemons.wait_ready(START_TIMEOUT_S)
        a = RealServer(
            run, topology, ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=schedule.stop)
        ).start()
        servers.append(a)
        s = None
        if schedule.follower != "fresh":
            stop_at = StopPoint("after_claim", 1) if schedule.follower == "standby killed" else None
            s = start_standby_beside(
                run, a, ServerSpec("S", rebalance_iterations=100_000, extra_env=STANDBY_ENV, stop_at=stop_at)
            )
            servers.append(s)
        a.wait_ready(START_TIMEOUT_S)
        if s is not None:
            wait_parked(run, s, topology.tp_size, START_TIMEOUT_S)
        park([a], PROMPT_TIMEOUT_S)
        a.kill()
        out.kills += 1
        if s is not None and schedule.follower == "standby":
            s.wait_ready(START_TIMEOUT_S)  # /health answers 200 once S is promoted
            out.notes.append(f"after A's kill at {schedule.stop.env_value()}: S took over")
            serving = s
        else:
            if s is not None:
                _wait_claimed(s)
                s.kill()
                out.kills += 1
            left = _settled(run)
            killed = f"A's kill at {schedule.stop.env_value()}" + ("" if s is None else " and S's inside its takeover")
            out.notes.append(f"after {killed}: " + ", ".join(map(_state, left)))
            if schedule.restart:
                daemons.kill()
                daemons = StandaloneDaemons(run, topology).start()
                daemons.wait_ready(START_TIMEOUT_S)
                out.notes.append("every daemon SIGKILLed and started again from its durable copy")
            serving = RealServer(run, topology, ServerSpec("B", rebalance_iterations=100_000)).start()
            servers.append(serving)
            serving.wait_ready(START_TIMEOUT_S)
        _check_serving(serving, run, topology, root, out, references)
    except Exception:  # a server that did not come up, or the harness: the schedule fails with its words
        out.fail(traceback.format_exc())
    finally:
        for server in servers:
            server.kill()
        daemons.kill()
    check_traces(run.root / "traces", check_all([run.root / "traces"]), out, tlc)
    out.seconds = time.monotonic() - started
    return out


def _wait_claimed(s: RealServer, timeout_s: float = START_TIMEOUT_S) -> None:
    """Until S's first rank stops after its granted claim (the others wait on its all-gather)."""
    deadline = time.monotonic() + timeout_s
    while not s.stopped_ranks():
        if not s.tree.alive() or time.monotonic() > deadline:
            raise ServerFailed(f"standby S did not stop after a granted claim; {s.tree.failure_report()}")
        time.sleep(0.1)


def _state(state: dict[str, Any]) -> str:
    return f"{state.get('phase')} at v{state.get('version')}"


def _check_serving(
    server: RealServer, run: RunDir, topology: Topology, root: Path, out: Outcome, references: DiskReferences | None
) -> None:
    name = server.spec.name
    outputs = server.generate(list(PROMPTS), max_new_tokens=16, timeout_s=PROMPT_TIMEOUT_S)
    beliefs = server.beliefs()
    maps = [beliefs[rank]["map"] for rank in sorted(beliefs)]
    if len(maps) != topology.tp_size or any(m != maps[0] for m in maps):
        out.fail(f"{name}'s ranks route with different maps (or a rank wrote none): {sorted(beliefs)}")
        return
    sockets = [run.socket_path(r) for r in range(topology.tp_size)]
    held = memory_probe.held_map(sockets, str(topology.model_path), run.root / "traces")
    wrong = memory_probe.wrong_slots(maps[0], held)
    out.notes.append(f"{name} serves ({beliefs[0]['startup']}, v{beliefs[0]['version']}); {wrong} slots wrong")
    if wrong:
        out.fail(f"{name} routes to the wrong expert in {wrong} slots of the daemons' memory")
    server.kill()
    references = references or DiskReferences(root, START_TIMEOUT_S, PROMPT_TIMEOUT_S)
    started = references.started
    reference = references.outputs(topology, maps[0])
    if references.started == started:
        out.notes.append("the disk reference for that map already ran")
    if outputs != reference:
        out.fail(f"{name}'s outputs differ from a server's loaded from disk with {name}'s map")
    else:
        out.notes.append(f"{name}'s outputs equal the disk reference's")
