"""``make bench``'s real-server part: the plugin's cost on ``python -m sglang.launch_server``.

Measured side by side in one run, each as a ratio with the protocol on against off:

1. **ready time**: seconds from launching a server to its first generated token (a one-token ``/generate``,
   sent again 50 ms after each refused connection, answered as soon as the token is made; sglang's
   ``/health`` answers only on whole seconds after it was asked, which read a start to ~1 s), with the
   plugin and with ``SGLANG_PLUGINS=none``, on the *same* standalone layout-aware daemons
   (``python -m daemon_adapter --enable-eplb``) and the same flags, alternated (on, off, off, on, ...) so
   drift on a shared machine hits both alike;
2. **rebalance time**, one layer per chunk (``--eplb-rebalance-layers-per-chunk 1``): a chunked
   rebalance runs across forward passes and sglang times only an unchunked one, so each rank times
   its ``EPLBManager.on_forward_pass_end`` calls that did rebalance work (the plan, each chunk's move
   and, with the plugin, its begin, commit and all-gathers: ``engine_probes.EplbTimer``); on servers
   with spawned daemons (``--weight-cache-mode daemon``), rotated with a third side: the plugin off and
   each chunk doing the protocol's floor where the protocol does it (``engine_probes.ChunkFloor``), the
   floor measured inside the same kind of server. Each server times ``--real-rebalances`` rebalances (8:
   the first carries one-off costs, sglang's and the plugin's, that a serving engine pays once).

Servers need about 30-60 s each to be ready on 2 cores: this part takes several minutes
(``--real-repeats`` sets how many servers per side per figure, at least ``READY_REPEATS`` for the ready
time); ``--no-real`` skips it.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.realserver import engine_probes, torn_move
from tools.realserver import server as rs
from tools.realserver.model import PROMPTS, TinyMoeRecipe, build_tiny_qwen3_moe
from tools.realserver.router_probe import ReadyPoller

REBALANCE_END = r"TP0[^\]\n]*\] \[EPLBManager\] rebalance end"
ITERATIONS = 20
# A warm standby's takeover, from the SIGKILL to its first token and to its /ready 200 (sglang's roadmap:
# "<1s warm standby switch").
TAKEOVER_MAX_S = 1.0
READY_RATIO_MAX = 1.03
# A start's ±2 s swings on 2 shared cores are larger than the 3% looked for: the ready time takes at least
# this many servers a side, whatever --real-repeats says for the other figures.
READY_REPEATS = 5
REBALANCE_RATIO_MAX = 1.10


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _median(values: list[float]) -> float:
    # To 0.1 ms: a rebalance of the tiny MoE takes tens of ms, and its ratio is read off these medians.
    return round(statistics.median(values), 4) if values else float("nan")


def _ratio(on: float, off: float) -> float:
    return round(on / off, 3) if off else float("nan")


def _rotated(sides: tuple[str, ...], repeats: int) -> list[tuple[str, ...]]:
    """The sides' order per repeat, each first in turn ((a, b), (b, a), ... for two): drift on a shared
    machine hits all alike."""
    return [sides[i % len(sides) :] + sides[: i % len(sides)] for i in range(repeats)]


def _topology(model: Path) -> rs.Topology:
    return rs.Topology(model, tp_size=2, ep_size=2, redundant_experts=2, enable_eplb=True)


def ready_times(model: Path, workdir: Path, repeats: int, step: Any) -> dict[str, Any]:
    run = rs.RunDir(workdir / "ready")
    daemons = rs.StandaloneDaemons(run, _topology(model)).start()
    seconds: dict[str, list[float]] = {"on": [], "off": []}

    def ready_s(name: str, side: str) -> float:
        spec = rs.ServerSpec(
            name,
            weight_cache_mode="client",
            rebalance_iterations=ITERATIONS,
            layers_per_chunk=1,
            plugins=None if side == "on" else rs.PROTOCOL_OFF,
        )
        server = rs.RealServer(run, _topology(model), spec).start()
        try:
            return round(server.wait_first_token(), 3)
        finally:
            server.stop()

    try:
        daemons.wait_ready()
        # Not timed: the first server after the daemons reads sglang's modules and the model from disk
        # into the page cache (slower than every start after it), and would be an "on" one.
        step(f"  ready time, warmup start (not timed): {ready_s('ready-warmup', 'on'):.1f} s")
        for i, pair in enumerate(_rotated(("on", "off"), repeats)):
            for side in pair:
                seconds[side].append(ready_s(f"ready-{side}-{i}", side))
                step(f"  ready time, plugin {side}: {seconds[side][-1]:.1f} s")
    finally:
        daemons.stop()
    on, off = _median(seconds["on"]), _median(seconds["off"])
    pairs = zip(seconds["on"], seconds["off"], strict=True)
    return {
        "ready_s_plugin_on": seconds["on"],
        "ready_s_plugin_off": seconds["off"],
        "median_on_s": on,
        "median_off_s": off,
        "ratio_on_to_off": _ratio(on, off),
        # Each alternated pair's ratio (the two servers started one after the other): how far runs spread.
        "ratio_on_to_off_spread": _spread([a / b for a, b in pairs]),
    }


@dataclass(frozen=True)
class Timed:
    """A server's rebalances: seconds of rebalance work per rebalance (the slowest rank's), how many
    rebalances, the rebalance calls, and the garbage collector's share of that work."""

    per_rebalance_s: float
    rebalances: int
    calls: int
    gc_s: float
    full_collections: int
    chunk_s: dict[str, list[float]]  # each chunk's parts on every rank (engine_probes: the plugin's or the floor's)

    def line(self) -> str:
        return (
            f"{self.per_rebalance_s * 1000:.1f} ms per rebalance ({self.rebalances} rebalances, {self.calls} calls; "
            f"garbage collector {self.gc_s * 1000:.1f} ms in all, {self.full_collections} full collections)"
        )


def _rebalance_seconds(server: rs.RealServer, tp_size: int) -> dict[str, Any]:
    """The slowest rank's ``engine_probes.EplbTimer`` figures (time in rebalance work, its calls, GC)."""
    per_rank = []
    for rank in range(tp_size):
        path = server.probe_dir / f"rank{rank}.eplb.json"
        if path.exists():
            per_rank.append(json.loads(path.read_text()))
    if not per_rank:
        return {}
    slowest = dict(max(per_rank, key=lambda d: d["rebalance_s"]))
    # Each chunk's parts, every rank's: the slowest rank decides a collective step, not a part.
    slowest["chunk_s"] = {
        part: [s for d in per_rank for s in d.get("chunk_s", {}).get(part, ())] for part in slowest.get("chunk_s", {})
    }
    return slowest


def _timed_rebalances(server: rs.RealServer, topology: rs.Topology, rebalances: int) -> Timed:
    """Requests until the server logged ``rebalances`` rebalances. First sglang's own ``/freeze_gc``, on
    every server of both sides alike, as an operator runs it once a server is up: a full collection of
    the heap left by startup takes a noticeable pause and otherwise lands in whichever forward pass
    allocates at the wrong moment, a rebalance's first chunk as often as not (results/bench.md)."""
    server.freeze_gc()
    for _ in range(4 * rebalances):
        if len(re.findall(REBALANCE_END, server.log_text())) >= rebalances:
            break
        server.generate(list(PROMPTS), 16)
    done = max(1, len(re.findall(REBALANCE_END, server.log_text())))
    data = _rebalance_seconds(server, topology.tp_size)
    return Timed(
        round(data.get("rebalance_s", float("nan")) / done, 4),
        done,
        data.get("rebalance_calls", 0),
        data.get("rebalance_gc_s", 0.0),
        data.get("rebalance_full_collections", 0),
        data.get("chunk_s", {}),
    )


# The rebalance's sides: the protocol on; off; and off with each chunk doing a floor where the protocol
# does its work (engine_probes.ChunkFloor), so that the floors are measured inside the same servers: the
# protocol's shape (a round trip and an all-gather before the move, a round trip after it) and the shape
# with an all-gather after the move too (the commit's check in a collective of its own).
_REBALANCE_SIDES = ("on", "off", "floor1", "floor2")
# The time the protocol adds to a rebalance, at most this share of what the two-collective floor adds.
ADDED_SHARE_MAX = 0.65
# A tiny MoE with enough layers that a rebalance has enough chunks (one layer each) to show a chunk's cost.
REBALANCE_LAYERS = 8


def _spread(values: list[float]) -> dict[str, float]:
    """Median, least and most of ``values``: a figure from alternated runs, with how far they spread."""
    if not values:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def rebalance_times(model: Path, workdir: Path, rebalances: int, repeats: int, step: Any) -> dict[str, Any]:
    """EPLB's rebalance, one layer per chunk, with the protocol, without it, and without it plus each chunk's
    floor in either shape, on spawned daemons; servers rotated (on, off, floor1, floor2; off, floor1, ...).
    Each figure: seconds of rebalance work per rebalance; each ratio and each added time also per rotation
    (the servers started one after the other), as a median with its spread."""
    out: dict[str, list[float]] = {side: [] for side in _REBALANCE_SIDES}
    gc_s: dict[str, list[float]] = {side: [] for side in _REBALANCE_SIDES}  # the garbage collector's, in all
    chunk_s: dict[str, dict[str, list[float]]] = {side: {} for side in _REBALANCE_SIDES}  # every server's chunks
    topology = _topology(model)
    rotations = _rotated(_REBALANCE_SIDES, repeats)
    for i, order in enumerate(rotations):
        for side in order:
            run = rs.RunDir(workdir / f"rebalance-{side}-{i}")
            env = {engine_probes.EPLB_TIME_ENV: "1"}
            if side.startswith("floor"):
                env[engine_probes.CHUNK_FLOOR_ENV] = side.removeprefix("floor")
            spec = rs.ServerSpec(
                f"rebalance-{side}-{i}",
                weight_cache_mode="daemon",
                rebalance_iterations=ITERATIONS,
                layers_per_chunk=1,
                plugins=None if side == "on" else rs.PROTOCOL_OFF,
                extra_env=env,
            )
            server = rs.RealServer(run, topology, spec).start()
            try:
                server.wait_ready()
                timed = _timed_rebalances(server, topology, rebalances)
            finally:
                server.stop()
            out[side].append(timed.per_rebalance_s)
            gc_s[side].append(round(timed.gc_s, 4))
            for part, seconds in timed.chunk_s.items():
                chunk_s[side].setdefault(part, []).extend(seconds)
            step(f"  rebalance, {_SIDE_WORDS[side]}: {timed.line()}")
    on, off, floor1, floor2 = (_median(out[side]) for side in _REBALANCE_SIDES)
    rounds = range(len(rotations))

    def added(side: str) -> list[float]:  # what a side adds to sglang's rebalance, per rotation
        return [out[side][k] - out["off"][k] for k in rounds]

    shares = [a / b for a, b in zip(added("on"), added("floor2"), strict=True) if b > 0]
    return {
        "chunks_per_rebalance": REBALANCE_LAYERS,  # every layer of the tiny model is an MoE layer, one chunk each
        "rebalance_s_protocol_on": out["on"],
        "rebalance_s_protocol_off": out["off"],
        "rebalance_s_off_with_floor1": out["floor1"],
        "rebalance_s_off_with_floor2": out["floor2"],
        "gc_s_protocol_on": gc_s["on"],
        "gc_s_protocol_off": gc_s["off"],
        "gc_s_off_with_floor1": gc_s["floor1"],
        "gc_s_off_with_floor2": gc_s["floor2"],
        "layers_per_chunk": 1,
        "median_on_s": on,
        "median_off_s": off,
        "median_floor1_s": floor1,
        "median_floor2_s": floor2,
        "ratio_on_to_off": _ratio(on, off),
        "ratio_on_to_off_spread": _spread([out["on"][k] / out["off"][k] for k in rounds]),
        "ratio_floor1_to_off": _ratio(floor1, off),
        "ratio_floor2_to_off": _ratio(floor2, off),
        "added_on_s": _spread(added("on")),
        "added_floor1_s": _spread(added("floor1")),
        "added_floor2_s": _spread(added("floor2")),
        # The protocol's added time against the two-collective floor's, per rotation: the target's figure.
        "added_share_of_floor2": _spread(shares),
        # Where a chunk's time goes, inside the servers: medians over every rank's chunks, in ms (the
        # plugin's begin, sglang's move, its commit; each floor's round trip and all-gather before and after).
        "chunk_parts_ms": {side: _part_medians_ms(parts) for side, parts in chunk_s.items() if parts},
    }


def _part_medians_ms(parts: dict[str, list[float]]) -> dict[str, Any]:
    medians: dict[str, Any] = {
        part.removesuffix("_s"): round(statistics.median(s) * 1000, 2) for part, s in parts.items() if s
    }
    medians["chunks"] = max((len(s) for s in parts.values()), default=0)
    return medians


_SIDE_WORDS = {
    "on": "protocol on",
    "off": "protocol off",
    "floor1": "protocol off, each chunk doing the one-collective floor",
    "floor2": "protocol off, each chunk doing the two-collective floor",
}


def standby_rebalance_times(model: Path, workdir: Path, rebalances: int, repeats: int, step: Any) -> dict[str, Any]:
    """A primary's EPLB rebalance, one layer per chunk, with a parked warm standby attached to its daemons
    (docs/protocol.md §10) against the primary alone, on one standalone daemon set; primaries alternated
    (beside, alone, alone, beside, ...). The standby starts once the primary is up and parks; once the primary's
    rebalances are timed, the primary is SIGKILLed and the standby takes over (``_takeover``). Each
    rebalance figure: seconds of rebalance work per rebalance."""
    from engine_adapter.roles import ROLE_ENV, STANDBY

    run = rs.RunDir(workdir / "standby")
    topology = _topology(model)
    daemons = rs.StandaloneDaemons(run, topology).start()
    out: dict[str, list[float]] = {"beside": [], "alone": []}
    busy: dict[str, int] = {"beside": 0, "alone": 0}
    health: dict[str, list[float]] = {"parked_standby": [], "primary": []}
    takeover: dict[str, list[float | None]] = {"first_token": [], "ready": []}
    try:
        daemons.wait_ready()
        for i, pair in enumerate(_rotated(("beside", "alone"), repeats)):
            for side in pair:
                spec = rs.ServerSpec(
                    f"primary-{side}-{i}",
                    rebalance_iterations=ITERATIONS,
                    layers_per_chunk=1,
                    extra_env={engine_probes.EPLB_TIME_ENV: "1"},
                )
                primary = rs.RealServer(run, topology, spec).start()
                standby = None
                try:
                    primary.wait_ready()
                    if side == "beside":
                        role = {ROLE_ENV: STANDBY}
                        parked = rs.ServerSpec(f"standby-{i}", rebalance_iterations=100_000, extra_env=role)
                        standby = rs.RealServer(run, topology, parked).start()
                        rs.wait_parked(run, standby, topology.tp_size)
                        for who, server in (("parked_standby", standby), ("primary", primary)):
                            asked = time.monotonic()
                            server.health()
                            health[who].append(round(time.monotonic() - asked, 3))
                    timed = _timed_rebalances(primary, topology, rebalances)
                    busy[side] += primary.log_text().count("rebalance paused")
                    if standby is not None:
                        first_token_s, ready_s = _takeover(daemons, primary, standby)
                        takeover["first_token"].append(first_token_s)
                        takeover["ready"].append(ready_s)
                        step(f"  takeover: first token {first_token_s} s, /ready 200 {ready_s} s after the SIGKILL")
                finally:
                    if standby is not None:
                        standby.stop()
                    primary.stop()
                out[side].append(timed.per_rebalance_s)
                step(f"  rebalance, primary {side}: {timed.line()}")
    finally:
        daemons.stop()
    beside, alone = _median(out["beside"]), _median(out["alone"])
    pairs = zip(out["beside"], out["alone"], strict=True)
    return {
        "ratio_beside_to_alone_spread": _spread([a / b for a, b in pairs]),
        "rebalance_s_beside_parked_standby": out["beside"],
        "rebalance_s_alone": out["alone"],
        "busy_pauses": busy,
        "median_beside_s": beside,
        "median_alone_s": alone,
        "ratio_beside_to_alone": _ratio(beside, alone),
        "health_s_parked_standby": health["parked_standby"],
        "health_s_primary": health["primary"],
        "health_ratio_parked_to_primary": _ratio(_median(health["parked_standby"]), _median(health["primary"])),
        "takeover_first_token_s": takeover["first_token"],
        "takeover_ready_s": takeover["ready"],
    }


def _takeover(
    daemons: rs.StandaloneDaemons, primary: rs.RealServer, standby: rs.RealServer
) -> tuple[float, float | None]:
    """The primary SIGKILLed beside its parked standby: seconds from the kill to the first token of a request
    sent to the standby right after it, and to the first 200 of the standby's ``/ready`` polled as a router
    does (``router_probe``; None: no 200 within 30 s)."""
    torn_move.wait_phase(daemons, "clean")  # no move under way: the kill tears none
    poller = ReadyPoller(standby.url).start()
    try:
        killed, killed_unix = time.monotonic(), time.time()
        primary.kill()
        streamed = standby.generate_streamed(PROMPTS[1], max_new_tokens=16)
        ready = poller.wait_ready(killed_unix, timeout_s=30.0)
    finally:
        poller.stop()
    first_token_s = (streamed.first_token or streamed.done) - killed
    return round(first_token_s, 3), None if ready is None else round(ready.answered - killed_unix, 3)


def repair_against_restart(model: Path, workdir: Path, step: Any) -> dict[str, Any]:
    """A torn move's repair (docs/protocol.md §4) against what it replaces, restarting the daemon set, on one
    standalone set with auto repair (the default): start it (loading from disk), commit a move of
    layer 0 and tear a second one (``tools.realserver.torn_move``), time from the EOF to every daemon
    clean again (``expert_layout_query`` on their sockets every 10 ms), then stop the set and start
    it again, timed the same way (launch to every daemon's ready file)."""
    topology = _topology(model)
    daemons = rs.StandaloneDaemons(rs.RunDir(workdir / "repair"), topology).start()
    try:
        start_s = daemons.wait_ready()
        step(f"  repair: daemon set (TP{topology.tp_size}) up in {start_s:.1f} s")
        engines = torn_move.attach_all(daemons)
        row = engines[0].record["map"][0]
        torn_move.move_layer(engines, 0, 0, list(reversed(row)))
        torn_move.wait_phase(daemons, "clean")
        eof = time.monotonic()
        torn_move.tear_move(engines, 0, 1)
        clean = torn_move.wait_phase(daemons, "clean", timeout_s=300.0, poll_s=0.01, detached=True)
        repair_s = time.monotonic() - eof
        logged = torn_move.logged_repairs(daemons.tree.log_path.read_text(errors="replace"))
    finally:
        daemons.stop()
    step(f"  repair: clean at version {clean[0]['version']} {repair_s:.3f} s after the EOF")
    again = rs.StandaloneDaemons(rs.RunDir(workdir / "restart"), topology).start()
    try:
        restart_s = again.wait_ready()
    finally:
        again.stop()
    step(f"  repair: the daemon set restarted (stop, then load from disk) in {restart_s:.1f} s")
    whole = logged[0].checkpoint_bytes if logged else 0
    return {
        "first_start_s": round(start_s, 2),
        "restart_s": round(restart_s, 2),
        "repair_s": round(repair_s, 3),
        "repair_in_daemons_s": [r.seconds for r in logged],
        "version_after": clean[0]["version"],
        "bytes_read_per_rank": [r.bytes_read for r in logged],
        "checkpoint_bytes": whole,
        "restart_to_repair": round(restart_s / repair_s, 1) if repair_s else float("nan"),
    }


def _versions(run: rs.RunDir) -> list[Any]:
    return [(d.get("state") or {}).get("version") for d in rs.daemon_status(run)["daemons"]]


def full_restart(model: Path, workdir: Path, step: Any) -> dict[str, Any]:
    """Every daemon SIGKILLed and started again, with the durable copies (the default) and without them
    (``--expert-layout-no-copy``), on one run folder: a server rebalances the daemons to a moved version
    first. For each side: the daemons' start (launch to ready: sglang's load from disk, at the copy's
    map or the initial one), the next server's time to its first token (launch to a one-token answer)
    and the version it serves at, and the bytes each daemon read again after its load (a rejoin's)."""
    topology = _topology(model)
    run = rs.RunDir(workdir / "full-restart")
    daemons = rs.StandaloneDaemons(run, topology).start()
    out: dict[str, Any] = {}
    try:
        daemons.wait_ready()
        mover = rs.RealServer(run, topology, rs.ServerSpec("mover", rebalance_iterations=10, layers_per_chunk=1))
        mover.start()
        try:
            mover.wait_ready()
            for _ in range(40):
                mover.generate(list(PROMPTS), max_new_tokens=16)
                if all(v is not None and v >= 1 for v in _versions(run)):
                    break
        finally:
            mover.stop()
        out["version_before"] = _versions(run)[0]
        torn_move.wait_phase(daemons, "clean")
        for side, extra in (("copy", ()), ("no_copy", ("--expert-layout-no-copy",))):
            daemons.kill()
            daemons = rs.StandaloneDaemons(run, topology, name=f"daemons-{side}", extra_args=extra).start()
            start_s = daemons.wait_ready()
            server = rs.RealServer(run, topology, rs.ServerSpec(f"next-{side}", rebalance_iterations=100_000)).start()
            try:
                first_token_s = server.wait_first_token()
                versions = [b.get("version") for b in server.beliefs().values()]
            finally:
                server.stop()
            logged = torn_move.logged_repairs(daemons.tree.log_path.read_text(errors="replace"))
            out[side] = {
                "daemons_start_s": round(start_s, 2),
                "first_token_s": round(first_token_s, 2),
                "served_versions": versions,
                "bytes_reloaded_per_rank": [r.bytes_read for r in logged] or [0] * topology.tp_size,
            }
            step(f"  full restart, {side}: {out[side]}")
    finally:
        daemons.stop()
    return out


def bench_real_servers(workdir: str, repeats: int, rebalances: int, step: Any) -> dict[str, Any]:
    model = build_tiny_qwen3_moe().resolve()
    root = Path(workdir) / "real"
    t0 = time.monotonic()
    step("real servers: ready time with and without the plugin, on the same standalone daemons")
    ready = ready_times(model, root, max(repeats, READY_REPEATS), step)
    step("real servers: EPLB rebalance wall time with and without the protocol (spawned daemons)")
    many_layers = build_tiny_qwen3_moe(recipe=TinyMoeRecipe(num_hidden_layers=REBALANCE_LAYERS)).resolve()
    rebalance = rebalance_times(many_layers, root, rebalances, repeats, step)
    step("real servers: EPLB rebalance wall time with a parked warm standby attached against the primary alone")
    standby = standby_rebalance_times(model, root, rebalances, repeats, step)
    step("real daemons: a torn move's repair against restarting the daemon set")
    repair = repair_against_restart(model, root, step)
    step("real daemons: every daemon SIGKILLed and started again, with the durable copies and without")
    restart = full_restart(model, root, step)
    return {
        "ready": ready,
        "rebalance": rebalance,
        "standby": standby,
        "repair": repair,
        "full_restart": restart,
        "seconds": round(time.monotonic() - t0, 1),
    }


def markdown_rows(data: dict[str, Any]) -> list[str]:
    r, b = data["ready"], data["rebalance"]
    return [
        "| real server ready time (launch to its first generated token: a one-token `/generate` sent every 50 ms "
        "until the port accepts it), "
        f"TP2/EP2, same standalone daemons | "
        f"{r['median_on_s']} s with the plugin ({r['ready_s_plugin_on']}) | "
        f"{r['median_off_s']} s with `SGLANG_PLUGINS=none` ({r['ready_s_plugin_off']}) | "
        f"{r['ratio_on_to_off']}x (per pair {spread_text(r.get('ratio_on_to_off_spread'))}) | ≤{READY_RATIO_MAX}x: "
        f"{_met(r['ratio_on_to_off'] <= READY_RATIO_MAX)}"
        f"{_pair_note(r.get('ratio_on_to_off_spread'), READY_RATIO_MAX)} |",
        "| real EPLB rebalance, one layer per chunk (`--eplb-rebalance-layers-per-chunk 1`), a tiny MoE of "
        f"{b['chunks_per_rebalance']} MoE layers: seconds of "
        "rebalance work per rebalance in `EPLBManager.on_forward_pass_end`, slowest rank, spawned daemons, "
        "after sglang's `/freeze_gc` on every server (garbage collector in that work, all rebalances: "
        f"{b.get('gc_s_protocol_on')} s with, {b.get('gc_s_protocol_off')} s without) | "
        f"{b['median_on_s']} s with the protocol ({b['rebalance_s_protocol_on']}) | "
        f"{b['median_off_s']} s without ({b['rebalance_s_protocol_off']}) | {b['ratio_on_to_off']}x "
        f"(per rotation {spread_text(b.get('ratio_on_to_off_spread'))}) | reported beside the target below: "
        f"sglang's move of the tiny model is a few ms, so this ratio is not the target{_floor_note(b)} |",
        "| the time the protocol adds to that rebalance (with it, minus without it, per rotation), against what "
        "the two-collective floor adds (protocol off, each chunk doing a ping to the rank's daemon and an "
        "all-gather of its reply before sglang's move, a device synchronize, and the same again after it: "
        "`engine_probes.ChunkFloor`), servers rotated with the others | "
        f"{_ms(b['added_on_s'])} added by the protocol | {_ms(b['added_floor2_s'])} added by the two-collective "
        f"floor; the one-collective floor (a ping after the move, no all-gather) adds {_ms(b['added_floor1_s'])} | "
        f"{spread_text(b['added_share_of_floor2'])} of it | ≤{ADDED_SHARE_MAX} of it: "
        f"{_met(b['added_share_of_floor2']['median'] <= ADDED_SHARE_MAX)}"
        f"{_spread_note(b['added_share_of_floor2'], ADDED_SHARE_MAX)} |",
        *_chunk_part_rows(b.get("chunk_parts_ms", {})),
        *_standby_rows(data.get("standby")),
        *_repair_rows(data.get("repair")),
        *_full_restart_rows(data.get("full_restart")),
    ]


def floor_bound(rebalance: dict[str, Any], chunk_floor_us: float) -> None:
    """What the floor alone costs a rebalance: each chunk's two round trips to the daemons and one
    all-gather (the 2-rank chunk floor measured in the same run, ``chunk_floor_us``), added to sglang's
    own rebalance. No check that asks every daemon before and after each chunk can do better."""
    chunks, off = rebalance.get("chunks_per_rebalance"), rebalance.get("median_off_s")
    if not chunks or not off or off != off:
        return
    floor_s = chunks * chunk_floor_us / 1e6
    rebalance["floor_s_per_rebalance"] = round(floor_s, 4)
    rebalance["floor_bound_ratio"] = _ratio(off + floor_s, off)


def _floor_note(b: dict[str, Any]) -> str:
    if "floor_bound_ratio" not in b:
        return ""
    return (
        f" (the one-collective floor alone, {b['chunks_per_rebalance']:g} chunks of 2 round trips and 1 all-gather "
        f"as measured out of the server, {b['floor_s_per_rebalance'] * 1000:.1f} ms, makes {b['floor_bound_ratio']}x)"
    )


def _ms(spread: dict[str, float]) -> str:
    return f"{1000 * spread['median']:.1f} ms ({1000 * spread['min']:.1f} to {1000 * spread['max']:.1f})"


def spread_text(spread: dict[str, float] | None, unit: str = "x") -> str:
    """A median from alternated runs, with the least and the most (``_spread``'s figures)."""
    if not spread:
        return "-"
    return f"{spread['median']:.3g}{unit} ({spread['min']:.3g} to {spread['max']:.3g})"


def _pair_note(spread: dict[str, float] | None, limit: float) -> str:
    return "" if not spread else _spread_note(spread, limit)


def _spread_note(spread: dict[str, float], limit: float) -> str:
    """Whether the runs' spread lies on one side of the target: narrower than its margin, or not."""
    if spread["max"] <= limit or spread["min"] > limit:
        return " (every rotation on the same side of it)"
    return " (the rotations spread across it: more runs a side would be needed to tell)"


def _chunk_part_rows(parts: dict[str, dict[str, Any]]) -> list[str]:
    """Where a chunk's time goes inside the servers of the rows above: the protocol's begin and commit
    against each floor's before and after, and sglang's move between them on each side."""
    on, floor1, floor2 = parts.get("on"), parts.get("floor1"), parts.get("floor2")
    if not on or not floor1 or not floor2 or "begin" not in on or "before" not in floor1 or "before" not in floor2:
        return []
    phases = on["begin"] + on["commit"]
    one, two = floor1["before"] + floor1["after"], floor2["before"] + floor2["after"]
    return [
        "| inside each chunk of those rebalances (medians over every rank's chunks, in ms, timed where they run: "
        "the plugin's own `begin_s`, `move_s`, `commit_s`; `engine_probes.ChunkFloor` the same way) | "
        f"begin {on['begin']} + sglang's move {on['move']} + commit {on['commit']} ({on['chunks']} chunks) | "
        f"one-collective floor: before {floor1['before']} + move {floor1['move']} + after {floor1['after']}; "
        f"two-collective floor: before {floor2['before']} + move {floor2['move']} + after {floor2['after']} | "
        f"the protocol's {phases:.2f} ms against {one:.2f} and {two:.2f} ms: {_ratio(phases, one)}x and "
        f"{_ratio(phases, two)}x | shown: where the rebalance's time goes |",
    ]


def _standby_rows(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    return [
        "| real EPLB rebalance of a primary, one layer per chunk, with a parked warm standby attached to its "
        "standalone daemons: seconds of rebalance work per rebalance, slowest rank | "
        f"{p['median_beside_s']} s beside the standby ({p['rebalance_s_beside_parked_standby']}; busy pauses "
        f"{p['busy_pauses']['beside']}) | {p['median_alone_s']} s alone ({p['rebalance_s_alone']}) | "
        f"{p['ratio_beside_to_alone']}x (per pair {spread_text(p.get('ratio_beside_to_alone_spread'))}) | not busy, "
        f"and ≤{REBALANCE_RATIO_MAX}x: "
        f"{_met(p['busy_pauses']['beside'] == 0 and p['ratio_beside_to_alone'] <= REBALANCE_RATIO_MAX)}"
        f"{_pair_note(p.get('ratio_beside_to_alone_spread'), REBALANCE_RATIO_MAX)} |",
        *_health_rows(p),
        *_takeover_rows(p),
    ]


def _takeover_rows(p: dict[str, Any]) -> list[str]:
    """The parked standby's takeover from its SIGKILLed primary: the first token and ``/ready`` 200."""
    first, ready = p.get("takeover_first_token_s"), p.get("takeover_ready_s")
    if not first or not ready:
        return []
    answered = [r for r in ready if r is not None]
    met = len(answered) == len(ready) and max(first) < TAKEOVER_MAX_S and max(answered) < TAKEOVER_MAX_S
    return [
        "| a parked warm standby takes over from its SIGKILLed primary, once per standby of the rows above: seconds "
        f"from the SIGKILL | first token of a request sent right after it: {_median(first)} s ({first}) | `/ready` "
        f"200, polled every 50 ms as a router does: {_median(answered)} s ({ready}) | - | both under "
        f"{TAKEOVER_MAX_S:.0f} s: {_met(met)} |",
    ]


def _health_rows(p: dict[str, Any]) -> list[str]:
    """A parked standby's ``/health`` (503) against the serving primary's, asked right after it."""
    if not p.get("health_s_parked_standby"):
        return []
    return [
        "| `/health` of a parked warm standby (it answers 503), once per standby of the row above | "
        f"{_median(p['health_s_parked_standby'])} s ({p['health_s_parked_standby']}) | "
        f"{_median(p['health_s_primary'])} s, the serving primary's, asked right after "
        f"({p['health_s_primary']}) | {p['health_ratio_parked_to_primary']}x | none: shown |",
    ]


def _repair_rows(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    read, whole = p["bytes_read_per_rank"], p["checkpoint_bytes"]
    share = ", ".join(f"{b / whole:.1%}" for b in read) if whole else "?"
    return [
        "| a torn move's repair (auto, TP2 standalone daemons): from the mover's EOF to every daemon clean at "
        f"the base version, asked on the daemons' sockets every 10 ms | {p['repair_s']} s (in the daemons: "
        f"{p['repair_in_daemons_s']} s); bytes reloaded per rank {read} of a {whole}-byte checkpoint ({share}) | "
        f"{p['restart_s']} s to restart the daemon set (load from disk; its first start: {p['first_start_s']} s) | "
        f"{p['restart_to_repair']}x faster | faster than a restart: {_met(p['repair_s'] < p['restart_s'])} |",
    ]


def _full_restart_rows(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    on, off = p["copy"], p["no_copy"]
    return [
        "| every daemon SIGKILLed and started again (TP2 standalone daemons at version "
        f"{p['version_before']}), then the next server: the daemons' start, the server's time to its first "
        f"token, the version it serves | with the durable copies: {on['daemons_start_s']} s, "
        f"{on['first_token_s']} s, versions {on['served_versions']}; bytes read again after the load "
        f"{on['bytes_reloaded_per_rank']} | without (`--expert-layout-no-copy`): {off['daemons_start_s']} s, "
        f"{off['first_token_s']} s, versions {off['served_versions']} (the layout EPLB learned is lost) | "
        f"{round(on['first_token_s'] / off['first_token_s'], 2) if off['first_token_s'] else '?'}x | serves "
        f"the last committed version: {_met(all(v == p['version_before'] for v in on['served_versions']))} |",
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.bench.real``: this part alone (``make bench`` runs it after the others)."""
    import argparse
    import json
    import tempfile

    from tools.demo.results import machine

    parser = argparse.ArgumentParser(prog="python -m tools.bench.real", description=__doc__)
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--real-repeats", type=int, default=3, help="servers per side, alternated, for each figure")
    parser.add_argument("--real-rebalances", type=int, default=8, help="rebalances timed per server")
    args = parser.parse_args(argv)
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    data = bench_real_servers(
        tempfile.mkdtemp(prefix="expert-layout-bench-"), args.real_repeats, args.real_rebalances, step
    )
    data["machine"] = machine()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "real_servers.json").write_text(json.dumps(data, indent=2) + "\n")
    header = ["| what | with the protocol | without | ratio | target |", "| --- | --- | --- | --- | --- |"]
    text = "\n".join(["# Real servers: the protocol's cost", "", *header, *markdown_rows(data), ""])
    (Path(args.out) / "real_servers.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
