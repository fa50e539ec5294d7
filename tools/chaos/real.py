"""Seeded fault schedules on real ``python -m sglang.launch_server`` servers (TP2/EP2, the tiny MoE,
standalone layout-aware daemons with auto repair, as deployed).

A schedule, drawn from its seed: server A rebalances one layer per chunk and every rank stops at a
point drawn from the seed (after a chunk's begin was answered, after sglang moved it and before its
commit, or after its commit), where A's whole process tree is SIGKILLed; with some seeds the daemons
are then SIGKILLed too and restarted from disk. Server B then starts on the daemons as left (a torn
move is repaired by the daemons on their own first) and must serve: every rank routes with the same
map, the daemons' memory holds that map slot by slot (``tools.demo.memory_probe``), and B's outputs
equal a server's loaded from disk with that map. Every trace of the run must be a behaviour of the
protocol.
"""

from __future__ import annotations

import random
import time
import traceback
from pathlib import Path
from typing import Any

from tools.chaos.campaign import Outcome
from tools.demo import memory_probe
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS, build_tiny_qwen3_moe
from tools.realserver.server import (
    RealServer,
    RunDir,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
    disk_reference,
    park,
)
from tools.trace_check import check_all, reports, summary

START_TIMEOUT_S = 600.0
PROMPT_TIMEOUT_S = 240.0
STOPS = ("mid_move", "before_commit", "after_commit")


def draw(seed: int) -> tuple[StopPoint, bool]:
    """Where A's ranks stop before the SIGKILL, and whether the daemons are restarted after it."""
    rng = random.Random(seed)
    return StopPoint(rng.choice(STOPS), rng.randint(1, 3)), rng.random() < 0.3


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


def run_real_schedule(seed: int, root: Path) -> Outcome:
    stop, restart = draw(seed)
    ops = [f"server A stops at {stop.env_value()}, SIGKILL", *(["daemons SIGKILLed, restarted"] if restart else [])]
    out = Outcome(seed, [*ops, "server B on the daemons, against a disk reference"])
    started = time.monotonic()
    run = RunDir(root / "run")
    topology = Topology(build_tiny_qwen3_moe())
    daemons = StandaloneDaemons(run, topology).start()
    servers: list[RealServer] = []
    try:
        daemons.wait_ready(START_TIMEOUT_S)
        a = RealServer(
            run, topology, ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=stop)
        ).start()
        servers.append(a)
        a.wait_ready(START_TIMEOUT_S)
        park([a], PROMPT_TIMEOUT_S)
        a.kill()
        out.kills += 1
        left = _settled(run)
        out.notes.append(f"after A's kill at {stop.env_value()}: " + ", ".join(_state(s) for s in left))
        if restart:
            daemons.kill()
            daemons = StandaloneDaemons(run, topology).start()
            daemons.wait_ready(START_TIMEOUT_S)
            out.notes.append("daemons restarted from disk")
        b = RealServer(run, topology, ServerSpec("B", rebalance_iterations=100_000)).start()
        servers.append(b)
        b.wait_ready(START_TIMEOUT_S)
        _check_b(b, run, topology, root, out)
    except Exception:  # a server that did not come up, or the harness: the schedule fails with its words
        out.fail(traceback.format_exc())
    finally:
        for server in servers:
            server.kill()
        daemons.kill()
    verdicts = check_all([run.root / "traces"])
    out.traces = summary(verdicts)
    if not all(v.ok for v in verdicts):
        out.fail("a trace is not a behaviour of the protocol:\n" + reports(verdicts))
    out.seconds = time.monotonic() - started
    return out


def _state(state: dict[str, Any]) -> str:
    return f"{state.get('phase')} at v{state.get('version')}"


def _check_b(b: RealServer, run: RunDir, topology: Topology, root: Path, out: Outcome) -> None:
    outputs = b.generate(list(PROMPTS), max_new_tokens=16, timeout_s=PROMPT_TIMEOUT_S)
    beliefs = b.beliefs()
    maps = [beliefs[rank]["map"] for rank in sorted(beliefs)]
    if len(maps) != topology.tp_size or any(m != maps[0] for m in maps):
        out.fail(f"B's ranks route with different maps (or a rank wrote none): {sorted(beliefs)}")
        return
    sockets = [run.socket_path(r) for r in range(topology.tp_size)]
    held = memory_probe.held_map(sockets, str(topology.model_path), run.root / "traces")
    wrong = memory_probe.wrong_slots(maps[0], held)
    out.notes.append(f"B started ({beliefs[0]['startup']}, v{beliefs[0]['version']}); {wrong} slots wrong")
    if wrong:
        out.fail(f"B routes to the wrong expert in {wrong} slots of the daemons' memory")
    b.kill()
    reference = disk_reference(root / "reference", topology, maps[0]).start()
    try:
        reference.wait_ready(START_TIMEOUT_S)
        expected = reference.generate(list(PROMPTS), max_new_tokens=16, timeout_s=PROMPT_TIMEOUT_S)
    finally:
        reference.kill()
    if outputs != expected:
        out.fail("B's outputs differ from a server's loaded from disk with B's map")
    else:
        out.notes.append("B's outputs equal the disk reference's")
