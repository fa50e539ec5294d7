"""The demo's cases on real ``python -m sglang.launch_server`` servers (TP2/EP2, CPU).

Four chains of daemons, run in two lanes side by side (``run_all``): on 2 cores a server's start
is mostly sglang's imports, one process at a time in places, so two starts at once keep both
cores busy. Within a lane one server starts at a time, and every server and daemon set is
stopped as soon as its case no longer needs it (at most two daemon sets and three servers alive).

* lane 1, chain ``aware``: standalone layout-aware daemons (``python -m daemon_adapter
  --enable-eplb``, auto repair on, the default), servers in ``client`` mode: case 1 (restart), the
  older engine (M2), case 2 (warm standby), 3a (SIGKILL between chunks), 3b (SIGKILL mid-move: the
  daemons repair the torn layers by themselves and the next server adopts the base version), 4
  (every daemon SIGKILLed and started again: each from its durable copy, and the next server adopts
  the layout EPLB learned).
* lane 2, chain ``off``: the protocol off everywhere (``SGLANG_PLUGINS=none``). Server 0-A spawns
  plain sglang daemons (``--weight-cache-mode daemon``); a layout-aware server (M1) visits them
  before any move; 0-A rebalances; 0-B starts on the same daemons (``client``). The right
  outputs are 0-A's own, asked before its first rebalance.
* lane 2, chain ``noeplb``: standalone layout-aware daemons without ``--enable-eplb`` (M3): a
  server with the plugin and one without (``SGLANG_PLUGINS=none``), same flags, same daemons.
* lane 2, chain ``repairoff``: standalone layout-aware daemons with ``--expert-layout-no-auto-repair``
  (3c): a mover SIGKILLed mid-move leaves them dirty, the next server fails with the reason, then
  the operator's ``expert-layout repair``.
* lane 2, last: the disk references of cases 1 and 3b (``ref-map``, ``ref-3b``), loaded with the map
  the aware lane's server adopted, once it is known.

What an engine believes is what its ranks route with (the real-server library's belief probe:
each rank's ``physical_to_logical_map``, version and startup outcome). What memory holds is read
from the daemons' memory (``memory_probe``).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tools.demo import memory_probe
from tools.demo.real.lab import (
    MAX_NEW_TOKENS,
    PAUSED,
    READY_TIMEOUT_S,
    WORLD,
    Chain,
    Lab,
    Launched,
    believed_map,
    describe,
    differing,
    record_map,
    same_record,
)
from tools.demo.results import Row
from tools.realserver import server as rs
from tools.realserver import torn_move
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS
from tools.realserver.router_probe import ReadyPoller

UNWRITTEN_WARNING = r"\[expert-layout\] rank \d+: WARNING: [^\n]*--enable-eplb[^\n]*"
# The takeover's target (sglang's roadmap #33522: "<1s warm standby switch").
TAKEOVER_LIMIT_S = 1.0
# The primary's rebalances while the standby is parked (each of two chunks: two versions).
STANDBY_REBALANCES = 2
REBALANCE_OFF = r"\[EPLBManager\] rebalance disabled: [^\n]*|\[expert-layout\] [^\n]*rebalancing[^\n]* off[^\n]*"


def startups(launched: Launched, kind: str) -> int:
    """Ranks whose plugin reported this startup outcome (adopt, keep_own...)."""
    return sum(1 for b in launched.beliefs().values() if b.get("startup") == kind)


def versions(launched: Launched) -> list[Any]:
    return [b.get("version") for _, b in sorted(launched.beliefs().items())]


def _first(pattern: str, text: str) -> str:

    found = re.search(pattern, text)
    return " ".join(found.group(0).split()) if found else ""


def case0_and_m1(lab: Lab, ev: dict[str, Any]) -> list[Row]:
    chain = lab.chain("off")
    a = lab.server("0-A", chain, plugin=False, mode="daemon")
    # The reference: 0-A itself before anything moved (its daemons loaded sglang's initial
    # layout from disk; one round stays below EPLB's interval).
    ref_out = a.generate()
    lab.step(f"case 0: 0-A (SGLANG_PLUGINS=none) ready in {a.ready_s:.0f}s, spawned plain sglang daemons, answered")
    if ev.get("noeplb_wanted"):  # M3's daemons start now, so they are up when this lane gets there
        ev["noeplb_chain"] = lab.background(lab.chain, "noeplb", standalone=True, enable_eplb=False)
    lab.status(chain, "case 0: 0-A's spawned daemons")

    # M1: a layout-aware engine on plain sglang daemons, before any move.
    p = lab.server("M1-P", chain)
    p_keep = startups(p, "keep_own")
    p_out = p.generate()
    lab.rounds(p, 2)  # past EPLB's interval: its rebalance meets the off switch
    p_off = _first(REBALANCE_OFF, p.log_text())
    lab.step(f"matrix M1: layout-aware M1-P on plain daemons: keep_own on {p_keep} ranks; {p_off or 'no off line'}")
    lab.stop(p)

    moved = lab.rebalance(a, 3)
    a_believed = believed_map(a.beliefs())
    lab.step(f"case 0: 0-A rebalanced {moved} times (EPLB moved experts in the daemons' memory)")
    b = lab.server("0-B", chain, plugin=False)
    lab.step(f"case 0: 0-B (SGLANG_PLUGINS=none) started on the same daemons without error in {b.ready_s:.0f}s")
    b_believed = believed_map(b.beliefs())
    b_out = b.generate()
    held = lab.held(chain)
    wrong = memory_probe.wrong_slots(b_believed, held)
    a_wrong = memory_probe.wrong_slots(a_believed, held)
    lab.stop(b, a)  # 0-A's spawned daemons go with it

    ev["before"] = (b_believed, held)
    diff = differing(b_out, ref_out)
    slots = len(held) * len(held[0])
    lab.step(
        f"case 0: {wrong}/{slots} slots hold another expert than 0-B believes; {diff}/{len(ref_out)} outputs differ"
    )
    p_diff = differing(p_out, ref_out)
    n = len(ref_out)
    return [
        Row(
            "0",
            "protocol off: a second server on moved daemons",
            "B starts without error on A's daemons, believes sglang's initial layout and serves wrong outputs",
            f"0-A rebalanced {moved} times ({a_wrong} of {slots} slots differ from 0-A's own map); 0-B started "
            f"without error; {wrong} of {slots} slots hold another expert than 0-B believes; {diff} of {n} "
            f"prompts' outputs differ from 0-A's own before its first rebalance (sglang's initial layout, loaded "
            f"from disk)",
            {"rebalances": moved, "wrong_slots": f"{wrong}/{slots}", "outputs_differ": f"{diff}/{n}"},
            b.ready and moved > 0 and a_wrong == 0 and wrong > 0 and diff > 0,
        ),
        Row(
            "M1",
            "layout-aware engine on plain sglang daemons",
            "keeps its own layout; rebalancing of shared weights off",
            f"M1-P started with keep_own on {p_keep} of {WORLD} ranks; {p_off or 'no rebalancing-off line'}; "
            f"{n - p_diff} of {n} outputs equal 0-A's before any move",
            {"keep_own_ranks": p_keep, "outputs_equal": f"{n - p_diff}/{n}"},
            p.ready and p_keep == WORLD and bool(p_off) and p_diff == 0,
        ),
    ]


def m3_no_eplb(lab: Lab, ev: dict[str, Any]) -> list[Row]:
    """Daemons without ``--enable-eplb`` under servers with it: the plugin must change nothing of
    what sglang does there. Checked against plain sglang: a server with the plugin and one
    without (``SGLANG_PLUGINS=none``), same flags, same daemons, must give the same tokens. The
    prompts go one at a time (``generate_each``): tokens routed to the slots sglang never writes
    there meet garbage weights, and with garbage the batch shape alone changes greedy tokens."""
    started = ev.get("noeplb_chain")
    chain = started.result() if started is not None else lab.chain("noeplb", standalone=True, enable_eplb=False)
    states = lab.status(chain, "matrix M3: layout-aware daemons without --enable-eplb")
    r = lab.server("M3-R", chain)
    keep = startups(r, "keep_own")
    # ~100 forward passes: EPLB's interval (20) ends during the 2nd prompt, so the rebalance meets
    # the off switch while these outputs are made; the later prompts' are from after it
    r_out = r.generate_each()
    r_off = _first(REBALANCE_OFF, r.log_text())
    r_warned = _first(UNWRITTEN_WARNING, r.log_text())
    lab.stop(r)
    lab.step(f"matrix M3: M3-R (the plugin) on daemons without a record: keep_own on {keep} ranks; {r_off}")
    lab.step(f"matrix M3: M3-R warned: {r_warned or 'NO WARNING'}")
    # What the daemons hold, as sglang loaded it without --enable-eplb: slots matching no expert
    # of the checkpoint were never written (sglang's loader without EPLB metadata).
    held = lab.held(chain)
    unwritten = sum(e == memory_probe.UNKNOWN for row in held for e in row)
    slots = len(held) * len(held[0])
    # plain sglang; its EPLB interval is never reached, so it moves nothing in the daemons either
    plain = lab.server("M3-S", chain, plugin=False, rebalance=False)
    s_out = plain.generate_each()
    lab.stop(plain)
    assert chain.daemons is not None
    chain.daemons.stop()
    n = len(r_out)
    same = n - differing(r_out, s_out)
    lab.step(
        f"matrix M3: {same}/{n} of M3-R's outputs equal M3-S's (SGLANG_PLUGINS=none, same daemons and flags); "
        f"{unwritten}/{slots} slots hold no expert"
    )
    no_record = all(state.get("version") is None for state in states)
    return [
        Row(
            "M3",
            "daemons without --enable-eplb",
            "no record; the plugin changes nothing: outputs equal a plugin-off server's on the same daemons; "
            "it warns that sglang never wrote the redundant slots",
            f"status: {', '.join(str(state.get('phase')) for state in states)}; M3-R (the plugin) started with its own "
            f"layout (keep_own on {keep} ranks); {r_off or 'no rebalancing-off line'}; {same} of {n} outputs "
            f"equal M3-S's (SGLANG_PLUGINS=none, same daemons, same flags; each prompt its own request; "
            f"M3-R's rebalance met the off switch during the 2nd prompt); it warned: {r_warned or 'nothing'}. "
            f"sglang's own behaviour on these "
            f"daemons: {unwritten} of {slots} slots hold no expert of the checkpoint (redundant slots sglang "
            f"never writes without EPLB metadata)",
            {
                "keep_own_ranks": keep,
                "outputs_equal_plugin_off": f"{same}/{n}",
                "unwritten_slots": f"{unwritten}/{slots}",
            },
            r.ready and plain.ready and no_record and keep == WORLD and bool(r_off) and same == n and bool(r_warned),
        )
    ]


def aware_chain(lab: Lab, ev: dict[str, Any]) -> list[Row]:
    finished: concurrent.futures.Future[Callable[[], Row]] = ev.setdefault("case1", concurrent.futures.Future())
    repaired: concurrent.futures.Future[Callable[[], list[Row]]] = ev.setdefault("case3b", concurrent.futures.Future())
    try:
        chain = lab.chain("aware", standalone=True)  # auto repair on, the default
        lab.status(chain, "case 1: layout-aware daemons up")
        finished.set_result(case1_restart(lab, chain, ev))  # the other lane starts ref-map
        b: Launched = ev["1-B"]
        row_m2 = m2_older_engine(lab, chain)
        row2, c = case2_standby(lab, chain, b)
        row3a, d, takeover = case3a_between_chunks(lab, chain, b, c)
        repaired.set_result(case3b_repaired(lab, chain, d, takeover, ev))  # the other lane starts ref-3b
        row4 = case4_full_restart(lab, chain, ev)
    except BaseException as exc:
        for future in (finished, repaired):
            if not future.done():
                future.set_exception(exc)
        raise
    assert chain.daemons is not None
    chain.daemons.stop()
    return [row_m2, row2, row3a, row4]


def reference_of(key: str) -> Callable[[Lab, dict[str, Any]], list[Row]]:
    """A case's last step, in the other lane: its disk reference (``ref-map``, ``ref-3b``), started once
    the aware lane has the map it needs."""

    def run(lab: Lab, ev: dict[str, Any]) -> list[Row]:
        finished: concurrent.futures.Future[Callable[[], Row | list[Row]]] = ev.setdefault(
            key, concurrent.futures.Future()
        )
        rows = finished.result(timeout=4 * READY_TIMEOUT_S + 600)()
        return rows if isinstance(rows, list) else [rows]

    return run


def case1_restart(lab: Lab, chain: Chain, ev: dict[str, Any]) -> Callable[[], Row]:
    """Case 1 up to 1-B's outputs; returns what finishes it (``ref-map``: loaded from disk with
    1-B's map, started once the chain's daemons are gone)."""
    a = lab.server("1-A", chain)
    moved = lab.rebalance(a, 3)
    st_a = lab.status(chain, f"case 1: 1-A rebalanced {moved} times")
    lab.stop(a)
    # 1-B is the mover of cases 2 and 3a: its 5th commit (the first chunk of its 3rd rebalance, after
    # case 2's two) is where it is parked and SIGKILLed, between two chunks.
    b = lab.server("1-B", chain, stop_at=StopPoint("after_commit", 2 * STANDBY_REBALANCES + 1), metrics=True)
    ev["1-B"] = b
    adopted = startups(b, "adopt")
    b_believed = believed_map(b.beliefs())
    b_out = b.generate()
    b_versions = versions(b)  # at startup (1-B moves on in cases 2 and 3a)
    st_b = lab.status(chain, f"case 1: 1-B started (adopt on {adopted} ranks, versions {b_versions})")
    held = lab.held(chain)
    wrong = memory_probe.wrong_slots(b_believed, held)
    ev["after"] = (b_believed, held)
    version = st_b[0].get("version")
    slots = len(held) * len(held[0])
    lab.step(f"case 1: 1-B adopted version {version}; {wrong}/{slots} slots hold another expert than 1-B believes")

    def finish() -> Row:
        ref = lab.server("ref-map", None, plugin=False, init_map=b_believed)
        return _case1_row(lab, ref, b_versions, b_believed, b_out, st_a, st_b, moved, adopted, wrong)

    return finish


def _case1_row(
    lab: Lab,
    ref: Launched,
    b_versions: list[Any],
    b_believed: list[list[int]],
    b_out: list[list[int]],
    st_a: list[dict[str, Any]],
    st_b: list[dict[str, Any]],
    moved: int,
    adopted: int,
    wrong: int,
) -> Row:
    ref_out = ref.generate()
    lab.stop(ref)
    diff = differing(b_out, ref_out)
    version = st_b[0].get("version")
    slots, n = len(b_believed) * len(b_believed[0]), len(b_out)
    lab.step(f"case 1: {n - diff}/{n} of 1-B's outputs equal ref-map's (disk, --init-expert-location = 1-B's map)")
    return Row(
        "1",
        "restart with the protocol on",
        "B adopts A's version on every rank; its outputs equal a disk server started with "
        "--init-expert-location set to that map",
        f"1-A rebalanced {moved} times (daemons at version {st_a[0].get('version')}); 1-B adopted version "
        f"{version} on {adopted} of {WORLD} ranks (versions {b_versions}); its map is the record's: "
        f"{b_believed == record_map(st_b)}; {wrong} of {slots} slots wrong; {n - diff} of {n} outputs equal "
        f"ref-map's (loaded from disk with --init-expert-location set to that map)",
        {
            "version": version,
            "adopt_ranks": adopted,
            "wrong_slots": f"{wrong}/{slots}",
            "outputs_equal": f"{n - diff}/{n}",
        },
        moved > 0
        and adopted == WORLD
        and same_record(st_b)
        and b_believed == record_map(st_b)
        and wrong == 0
        and diff == 0,
    )


def m2_older_engine(lab: Lab, chain: Chain) -> Row:
    o = lab.server("M2-older", chain, plugin=False, expect_ready=False)
    assert chain.daemons is not None
    daemon_log = chain.daemons.tree.log_path.read_text(errors="replace")
    reason = _first(r"fetch_state refused: experts have moved[^\n]*", daemon_log)
    # sglang's loader prints the refusal reply's daemon_config under "Daemon config mismatch!":
    # the daemons put the reason there, so it is on the older engine's own screen (its log).
    on_screen = _first(r"Daemon config: [^\n]*", o.log_text())
    lab.step(f"matrix M2: older server (SGLANG_PLUGINS=none) failed after {o.failed_s:.0f}s: {o.failure}")
    lab.step(f"matrix M2: on its screen: {on_screen or 'no Daemon config line'}")
    return Row(
        "M2",
        "older engine (plugins off) after a move",
        "refused with the reason on screen",
        f"M2-older {'became ready' if o.ready else 'failed at startup'} after {o.failed_s:.0f}s "
        f"(exit {o.returncode}); its own output (sglang's loader): {o.failure} {on_screen}; the daemons "
        f"logged: {reason}",
        {"ready": o.ready, "exit": o.returncode, "fail_s": round(o.failed_s, 1)},
        not o.ready and bool(reason) and "experts have moved" in on_screen,
    )


def case2_standby(lab: Lab, chain: Chain, b: Launched) -> tuple[Row, Launched]:
    """Case 2: 2-C starts as a warm standby beside 1-B and parks; 1-B rebalances as if it were alone."""
    # 2-C never reaches EPLB's interval: once promoted (case 3a) it serves the record's map, unmoved.
    c = lab.server("2-C", chain, standby=True, rebalance=False)
    c_adopt = startups(c, "adopt")
    health = c.server.health()
    st_c = lab.status(chain, f"case 2: standby 2-C parked beside 1-B (its /health answers {health})")
    busy_before = b.log_count(PAUSED)
    again = lab.rebalance(b, STANDBY_REBALANCES)
    busy = b.log_count(PAUSED) - busy_before
    st_again = lab.status(chain, f"case 2: 1-B rebalanced {again} times with 2-C parked ({busy} busy)")
    lab.metrics(b, "case 2: 1-B with the parked standby 2-C")
    v_before, v_after = st_c[0].get("version"), st_again[0].get("version")
    parked = [len(s.get("parked") or []) for s in st_again]
    row = Row(
        "2",
        "warm standby beside a rebalancing primary",
        "the standby parks (/health 503); the primary's rebalances are not busy and the record moves on",
        f"2-C (SGLANG_EXPERT_LAYOUT_ROLE=standby) adopted on {c_adopt} ranks and parked on {sum(parked)} of "
        f"{WORLD} daemons, /health {health}; 1-B rebalanced {again} times beside it, {busy} busy: version "
        f"{v_before} -> {v_after}",
        {"parked_daemons": sum(parked), "health": health, "busy": busy, "version_after": v_after},
        c_adopt == WORLD and parked == [1] * WORLD and health == 503 and again >= STANDBY_REBALANCES and busy == 0
        and (v_after or 0) > (v_before or 0),
    )  # fmt: skip
    return row, c


@dataclass
class TakeoverSeen:
    """What case 3a saw of 2-C's takeover; its outputs are judged against ref-3b (the same map)."""

    first_token_s: float
    complete_s: float
    ready_s: float | None  # the first 200 of 2-C's /ready, polled as a router does (None: none came)
    health: int
    beliefs_version: list[Any]
    record_version: Any
    routes_record: bool
    c_map: list[list[int]]
    c_out: list[list[int]]
    parts: dict[str, float]


def _takeover_parts(lab: Lab, chain: Chain, c: Launched, killed_unix: float) -> dict[str, float]:
    """The takeover's parts, from the wall clocks the daemons and 2-C's ranks logged, in seconds after the kill."""
    assert chain.daemons is not None
    parts: dict[str, float] = {}
    notices = re.findall(r"no primary \(at unix ([0-9.]+)\)", chain.daemons.tree.log_path.read_text(errors="replace"))
    for rank, at in enumerate(notices[-WORLD:]):
        parts[f"daemon {rank} saw the EOF, told 2-C"] = round(float(at) - killed_unix, 3)
    for line in re.findall(r"rank (\d+): promoted[^\n]*takeover times \(unix s\): ([^\n]*)", c.log_text()):
        for mark in line[1].split():
            name, _, value = mark.partition("=")
            parts[f"rank {line[0]} {name}"] = round(float(value) - killed_unix, 3)
    return parts


def case3a_between_chunks(lab: Lab, chain: Chain, b: Launched, c: Launched) -> tuple[Row, Launched, TakeoverSeen]:
    # The takeover is timed with no server or daemon set starting in the other lane (a start takes both cores).
    with lab.gate.quiet():
        poller = ReadyPoller(c.server.url).start()  # a router's readiness probe of the parked standby
        try:
            took = lab.kill_at_stop(b)
            killed_unix = time.time() - (time.monotonic() - b.killed_at)
            # A request sent right after the kill: the standby takes over and streams it.
            streamed = c.server.generate_streamed(PROMPTS[1], MAX_NEW_TOKENS)
            ready = poller.wait_ready(killed_unix, timeout_s=30.0)
        finally:
            poller.stop()
    ready_s = None if ready is None else ready.answered - killed_unix
    first_token_s = (streamed.first_token or streamed.done) - b.killed_at
    complete_s = streamed.done - b.killed_at
    lab.step(
        f"case 3a: 1-B parked after its {2 * STANDBY_REBALANCES + 1}th commit (between two chunks) in {took:.0f}s "
        "and was SIGKILLed; "
        f"the standby 2-C took over: first token {first_token_s:.2f}s after the SIGKILL, complete {complete_s:.2f}s, "
        f"/ready 200 {'never' if ready_s is None else f'{ready_s:.2f}s'} after the SIGKILL"
    )
    health = c.server.health()
    st_c = lab.status(chain, f"case 3a: 2-C promoted (/health {health})")
    c_map = believed_map(c.beliefs())
    c_versions = versions(c)
    c_out = c.generate()
    parts = _takeover_parts(lab, chain, c, killed_unix)
    lab.step("case 3a: the takeover's parts (s after the SIGKILL): " + ", ".join(f"{k} {v}" for k, v in parts.items()))
    lab.stop(c)
    takeover = TakeoverSeen(
        first_token_s, complete_s, ready_s, health, c_versions, st_c[0].get("version"), c_map == record_map(st_c),
        c_map, c_out, parts,
    )  # fmt: skip
    st_k = lab.wait_detached(chain, "case 3a: after 2-C stopped")
    # 3a-D is 3b's mover: parked before its first commit (its chunk moved in memory, the record at the
    # base version: memory and record apart) and SIGKILLed there.
    d = lab.server("3a-D", chain, stop_at=StopPoint("before_commit", 1))
    d_adopt = startups(d, "adopt")
    d_believed = believed_map(d.beliefs())
    st_d = lab.status(chain, f"case 3a: 3a-D started (adopt on {d_adopt} ranks, versions {versions(d)})")
    held = lab.held(chain)
    wrong = memory_probe.wrong_slots(d_believed, held)
    clean = not any(s.get("dirty") or s.get("pending") for s in st_k)
    v_kill, v_d = st_k[0].get("version"), versions(d)
    slots = len(held) * len(held[0])
    row = Row(
        "3a",
        "SIGKILL between chunks",
        "the next server adopts the last committed version",
        f"1-B SIGKILLed between two chunks of a rebalance; the daemons stayed "
        f"{'clean' if clean else 'NOT clean'} at version {v_kill}; 3a-D adopted versions {v_d} on {d_adopt} "
        f"ranks; {wrong} of {slots} slots hold another expert than 3a-D believes",
        {"version": v_kill, "adopt_ranks": d_adopt, "wrong_slots": f"{wrong}/{slots}"},
        clean and d_adopt == WORLD and wrong == 0 and all(v == v_kill for v in v_d) and d_believed == record_map(st_d),
    )
    return row, d, takeover


def takeover_rows(seen: TakeoverSeen, ref_map: list[list[int]], ref_out: list[list[int]], cold_s: float) -> list[Row]:
    """2b, judged on what the protocol decides (promoted with the record's layout, serving it), and the
    takeover's time beside it as a limit: reported, with a warning when exceeded, never a failure (a
    time says how busy the machine was)."""
    n, diff = len(seen.c_out), differing(seen.c_out, ref_out)
    ready = "no 200" if seen.ready_s is None else f"200 {seen.ready_s:.2f} s"
    first = (
        f"first token {seen.first_token_s:.2f} s after the SIGKILL, complete {seen.complete_s:.2f} s; "
        f"/ready (a router's probe, every 50 ms) {ready} after the SIGKILL"
    )
    return [
        Row(
            "2b",
            "the primary SIGKILLed: the standby takes over",
            "the parked standby promotes with the record's layout and serves it: /health 200, its outputs equal a "
            "disk server's with --init-expert-location set to that map",
            f"1-B SIGKILLed between chunks; 2-C promoted at version {seen.beliefs_version} (record "
            f"{seen.record_version}), its map the record's: {seen.routes_record}, /health {seen.health}; a request "
            f"sent right after the kill: {first}; parts (s after the SIGKILL): "
            + ", ".join(f"{k} {v}" for k, v in seen.parts.items())
            + f"; {n - diff} of {n} outputs equal ref-3b's (the same map, loaded from disk)",
            {"parts": seen.parts, "outputs_equal": f"{n - diff}/{n}"},
            seen.health == 200
            and seen.routes_record
            and all(v == seen.record_version for v in seen.beliefs_version)
            and seen.c_map == ref_map
            and diff == 0,
        ),
        Row(
            "2b time",
            "the takeover's time",
            f"the first token of a request sent right after the SIGKILL, and /ready 200, within "
            f"{TAKEOVER_LIMIT_S:.0f} s",
            f"{first} (a cold server's start here: {cold_s:.0f} s)",
            {
                "first_token_s": round(seen.first_token_s, 3),
                "ready_s": None if seen.ready_s is None else round(seen.ready_s, 3),
                "complete_s": round(seen.complete_s, 3),
                "cold_start_s": round(cold_s, 1),
            },
            seen.first_token_s < TAKEOVER_LIMIT_S and seen.ready_s is not None and seen.ready_s < TAKEOVER_LIMIT_S,
            judged=False,
        ),
    ]


def case3b_repaired(
    lab: Lab, chain: Chain, d: Launched, takeover: TakeoverSeen, ev: dict[str, Any]
) -> Callable[[], list[Row]]:
    """3a-D SIGKILLed mid-move; the daemons repair by themselves; 3b-E adopts. Returns what finishes
    the case (``ref-3b``: loaded from disk with 3b-E's map, in the other lane)."""
    assert chain.daemons is not None
    log_path = chain.daemons.tree.log_path
    before = len(log_path.read_text(errors="replace"))  # the log is appended to across runs: read what follows
    took = lab.kill_at_stop(d)
    killed = time.monotonic()
    lab.step(f"case 3b: 3a-D parked before its first commit (its chunk moved, not committed) in {took:.0f}s, SIGKILLed")
    lab.wait_phase(chain, "clean")
    repair_s = time.monotonic() - killed  # from the kill's return: it waits for the server's processes to exit
    log = log_path.read_text(errors="replace")[before:]
    went_repairing = log.count("daemon is now REPAIRING")
    repairs = torn_move.logged_repairs(log)
    st = lab.status(chain, f"case 3b: the daemons repaired the torn move by themselves, {repair_s:.2f}s after the kill")
    for pattern in (r"daemon is now REPAIRING[^\n]*", r"ok\(repaired\)[^\n]*"):
        lab.step(f"case 3b: a daemon logged: {_first(pattern, log) or 'nothing'}")
    e = lab.server("3b-E", chain)
    e_adopt, e_versions = startups(e, "adopt"), versions(e)
    e_map = believed_map(e.beliefs())
    wrong = memory_probe.wrong_slots(e_map, lab.held(chain))
    e_out = e.generate()
    lab.stop(e)
    ev["3b-E"] = (e_map, e_out)
    lab.step(f"case 3b: 3b-E adopted versions {e_versions} on {e_adopt} ranks; {wrong} slots hold another expert")

    def finish() -> list[Row]:
        ref = lab.server("ref-3b", None, plugin=False, init_map=e_map)
        ref_out = ref.generate()
        lab.stop(ref)
        # 2-C took over at the version 3b's repair returned to: the same map, so the same reference.
        rows2b = takeover_rows(takeover, e_map, ref_out, ref.ready_s)
        n, diff = len(e_out), differing(e_out, ref_out)
        lab.step(f"case 3b: {n - diff}/{n} of 3b-E's outputs equal ref-3b's (disk, --init-expert-location = its map)")
        base = st[0].get("version")
        read = [r.bytes_read for r in repairs]
        whole = repairs[0].checkpoint_bytes if repairs else 0
        in_daemons = [r.seconds for r in repairs]
        return [*rows2b, Row(
            "3b",
            "SIGKILL mid-move (auto repair on)",
            "the daemons go dirty, repair the torn layers by themselves and are clean at the base version in "
            "seconds, against a daemon-set restart; the next server adopts that version and its outputs equal a "
            "disk server with --init-expert-location set to that map",
            f"3a-D SIGKILLed with its first chunk moved in memory, not committed; {went_repairing} of {WORLD} "
            f"daemons logged the torn move and turned REPAIRING; clean at version {base} {repair_s:.2f} s after "
            f"the kill returned (the reload: {in_daemons} s in the daemons, {read} bytes per rank of a "
            f"{whole}-byte checkpoint), against {chain.start_s:.1f} s for this daemon set's start from disk; "
            f"3b-E adopted versions {e_versions} on {e_adopt} of {WORLD} ranks, its map the record's: "
            f"{e_map == record_map(st)}; {wrong} slots wrong; {n - diff} of {n} "
            f"outputs equal ref-3b's (loaded from disk with --init-expert-location set to that map)",
            {
                "repair_s": round(repair_s, 2),
                "daemon_set_start_s": round(chain.start_s, 1),
                "bytes_per_rank": read,
                "checkpoint_bytes": whole,
                "version": base,
                "outputs_equal": f"{n - diff}/{n}",
            },
            went_repairing == WORLD
            and len(repairs) == WORLD
            and repair_s < chain.start_s
            and all(s.get("phase") == "clean" for s in st)
            and all(v == base for v in e_versions)
            and e_adopt == WORLD
            and e_map == record_map(st)
            and wrong == 0
            and diff == 0,
        )]  # fmt: skip

    return finish


def case4_full_restart(lab: Lab, chain: Chain, ev: dict[str, Any]) -> Row:
    """Every daemon of the chain SIGKILLed and started again (a power loss, a driver upgrade, a GPU daemon
    lost: on CUDA its whole set comes back): each starts from its durable copy, and 4-F adopts it."""
    assert chain.daemons is not None
    e_map, e_out = ev["3b-E"]
    before = lab.status(chain, "case 4: the daemons before the full restart")
    chain.daemons.kill()
    lab.step("case 4: every daemon SIGKILLed")
    with lab.gate.busy():
        chain.daemons = rs.StandaloneDaemons(chain.run, lab.topology(True), name="daemons-again").start()
        seconds = chain.daemons.wait_ready(READY_TIMEOUT_S)
    st = lab.status(chain, f"case 4: every daemon started again in {seconds:.0f}s, each from its durable copy")
    from_copy = sum((s.get("durable") or {}).get("at_start", {}).get("kind") == "whole" for s in st)
    f = lab.server("4-F", chain)
    f_adopt, f_versions = startups(f, "adopt"), versions(f)
    f_map = believed_map(f.beliefs())
    wrong = memory_probe.wrong_slots(f_map, lab.held(chain))
    f_out = f.generate()
    lab.stop(f)
    n, diff = len(f_out), differing(f_out, e_out)
    version = before[0].get("version")
    lab.step(f"case 4: 4-F adopted versions {f_versions} on {f_adopt} ranks; {n - diff}/{n} outputs equal 3b-E's")
    return Row(
        "4",
        "every daemon SIGKILLed and started again",
        "each daemon starts from its durable copy at the last committed version, its experts loaded at that "
        "map; the next server adopts it on every rank and answers as before the restart",
        f"the daemons were at version {version}; after the SIGKILL of every daemon they started again in "
        f"{seconds:.1f} s, {from_copy} of {WORLD} from a whole durable copy, at versions "
        f"{[s.get('version') for s in st]}; 4-F adopted versions {f_versions} on {f_adopt} of {WORLD} ranks, its "
        f"map 3b-E's: {f_map == e_map}; {wrong} slots wrong; {n - diff} of {n} outputs equal 3b-E's (which "
        "equal ref-3b's, loaded from disk with that map)",
        {"version": version, "from_copy": f"{from_copy}/{WORLD}", "outputs_equal": f"{n - diff}/{n}"},
        from_copy == WORLD
        and all(s.get("version") == version for s in st)
        and f_adopt == WORLD
        and all(v == version for v in f_versions)
        and f_map == e_map
        and wrong == 0
        and diff == 0,
    )


def repair_off_chain(lab: Lab, ev: dict[str, Any]) -> list[Row]:
    """Case 3c: the torn move on daemons with auto repair off (the operator looks first): dirty; the
    next server fails at startup with the reason; then the operator's ``expert-layout repair``."""
    chain = lab.chain("repairoff", standalone=True, auto_repair=False)
    mover = lab.server("3c-D", chain, stop_at=StopPoint("before_commit", 1))
    standby = lab.server("3d-S", chain, standby=True, rebalance=False)  # case 3d: a standby beside the mover
    took = lab.kill_at_stop(mover)
    lab.step(f"case 3c: 3c-D parked before its first commit (its chunk moved, not committed) in {took:.0f}s, SIGKILLed")
    row3d = case3d_standby_fails_dirty(lab, standby, mover)
    lab.wait_phase(chain, "dirty")
    st = lab.status(chain, "case 3c: after the SIGKILL (auto repair off)")
    e = lab.server("3c-E", chain, expect_ready=False)
    ready = [s.ready_s for s in lab.launched if s.ready]
    typical = sorted(ready)[len(ready) // 2] if ready else 0.0
    lab.step(f"case 3c: 3c-E failed at startup after {e.failed_s:.0f}s (exit {e.returncode}): {e.failure}")
    assert chain.daemons is not None
    done, repair_wall_s = torn_move.run_repair_cli(chain.daemons)
    try:
        replies = [d["reply"] for d in json.loads(done.stdout)["daemons"]]
    except (ValueError, KeyError, TypeError):
        replies = []
    after = lab.status(chain, f"case 3c: `expert-layout repair` (exit {done.returncode}, {repair_wall_s:.2f}s)")
    chain.daemons.stop()
    repaired = [r for r in replies if r.get("reason") == "repaired"]
    base = st[0].get("dirty", {}).get("base_version") if st[0].get("dirty") else None
    return [
        row3d,
        Row(
            "3c",
            "SIGKILL mid-move (auto repair off)",
            "daemons dirty; the next server fails at startup, promptly, with the reason and both remedies; the "
            "operator's `expert-layout repair` brings them back clean at the base version",
            f"daemons {', '.join(str(s.get('phase')) for s in st)} after the SIGKILL; 3c-E "
            f"{'became ready' if e.ready else 'exited'} after {e.failed_s:.0f}s (exit {e.returncode}; a server is "
            f"ready after {typical:.0f}s here) with: {e.failure}; `expert-layout repair` exited {done.returncode} "
            f"after {repair_wall_s:.2f} s ({[r.get('seconds') for r in repaired]} s in the daemons, layers "
            f"{[r.get('layers') for r in repaired]}): daemons {', '.join(describe(s) for s in after)}, against "
            f"{chain.start_s:.1f} s for this daemon set's start from disk",
            {
                "fail_s": round(e.failed_s, 1),
                "typical_ready_s": round(typical, 1),
                "repair_cli_s": round(repair_wall_s, 2),
                "daemon_set_start_s": round(chain.start_s, 1),
                "exit": e.returncode,
            },
            all(s.get("phase") == "dirty" for s in st)
            and not e.ready
            and e.returncode not in (None, 0)
            and "dirty" in e.failure.lower()
            and "expert-layout repair" in e.failure
            and done.returncode == 0
            and len(repaired) == WORLD
            and all(s.get("phase") == "clean" and s.get("version") == base for s in after),
        ),
    ]


def case3d_standby_fails_dirty(lab: Lab, standby: Launched, mover: Launched) -> Row:
    """Case 3d: the primary beside the parked standby 3d-S died mid-move (auto repair off): 3d-S must not
    take over; it exits by itself, promptly, with the dirty reason."""
    code = standby.server.wait_exit(120.0)
    took = time.monotonic() - mover.killed_at
    standby.stopped = True
    log = standby.log_text()
    reason = _first(r"claim refused: [^\n]*", log)
    lab.step(f"case 3d: the parked standby 3d-S exited (code {code}) {took:.2f}s after the SIGKILL: {reason[:300]}")
    return Row(
        "3d",
        "warm standby, primary SIGKILLed mid-move (auto repair off)",
        "the standby does not take over: it exits by itself, promptly, with the dirty reason",
        f"3d-S was parked beside 3c-D; after 3c-D's SIGKILL mid-move it exited (code {code}) {took:.2f} s after "
        f"the SIGKILL with: {reason}",
        {"exit": code, "exit_s": round(took, 2)},
        code not in (None, 0) and "dirty" in reason and "expert-layout repair" in reason and took < 60.0,
    )


CHAINS = {
    "off": case0_and_m1,
    "case1-ref": reference_of("case1"),
    "noeplb": m3_no_eplb,
    "repairoff": repair_off_chain,
    "aware": aware_chain,
    "case3b-ref": reference_of("case3b"),
}
# Two lanes side by side. The aware lane is the longer one: the references of cases 1 and 3b (no
# daemons, only a map from the aware lane) and the repair-off chain run in the other.
LANES = (("off", "case1-ref", "noeplb", "repairoff", "case3b-ref"), ("aware",))
ROW_ORDER = ("0", "1", "2", "2b", "3a", "3b", "3c", "3d", "4", "M1", "M2", "M3")


def run_lane(lab: Lab, ev: dict[str, Any], chains: list[str]) -> list[Row]:
    rows: list[Row] = []
    for name in chains:
        try:
            rows.extend(CHAINS[name](lab, ev))
        except Exception as exc:  # one broken chain must not hide the others' rows
            first = str(exc).splitlines()[0] if str(exc) else ""
            lab.step(f"chain {name}: could not run: {type(exc).__name__}: {first}")
            rows.append(Row(name, "could not run", "", f"{type(exc).__name__}: {first}", {}, False))
    return rows


def run_all(lab: Lab, chains: list[str] | None = None) -> tuple[list[Row], dict[str, Any]]:
    wanted = set(chains or ("off", "noeplb", "aware", "repairoff"))
    if "aware" in wanted:
        wanted |= {"case1-ref", "case3b-ref"}
    ev: dict[str, Any] = {"noeplb_wanted": "noeplb" in wanted and "off" in wanted}
    lanes = [[c for c in lane if c in wanted] for lane in LANES]
    started = [lab.background(run_lane, lab, ev, lane) for lane in lanes if lane]
    rows = [row for lane in started for row in lane.result()]
    rank = {case: k for k, case in enumerate(ROW_ORDER)}
    return sorted(rows, key=lambda row: rank.get(row.case, len(rank))), ev
