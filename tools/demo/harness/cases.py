"""The demo's cases on the in-process harness, each adding one row to the results table (``lab``: the setup)."""

from __future__ import annotations

from typing import Any

from tools.demo.harness import rank_scripts
from tools.demo.harness.lab import Demo, differing, init_location, same_record, summary, versions
from tools.demo.results import Row


def case0_bug(demo: Demo) -> Row:
    """Protocol off (plain sglang daemons, engines without the plugin): the upstream failure."""
    demo.step("case 0: plain sglang daemons; engine A (no plugin) loads from them")
    a = demo.start_engine("A", demo.pool_a, demo.spec("P0", plugin=False))
    if not a.loaded:
        raise demo_error("A", a)
    moved = 0
    for i in range(demo.opt.rebalances):
        outs = demo.rebalance(a)
        moved += int(all(o.get("moved") for o in outs))
        demo.step(
            f"case 0: A rebalance {i + 1}/{demo.opt.rebalances}: experts moved in shared memory: {outs[0].get('moved')}"
        )
    rep_a = demo.report(a)
    demo.stop(a)
    demo.step(f"case 0: A stopped; its map matches memory in {rep_a['slots'] - rep_a['wrong']}/{rep_a['slots']} slots")

    b = demo.start_engine("B", demo.pool_a, demo.spec("P0", plugin=False))
    if not b.loaded:
        raise demo_error("B", b)
    rep_b = demo.report(b)
    out_b = demo.forward(b)
    demo.stop(b)
    demo.step(f"case 0: B started without error; {rep_b['wrong']}/{rep_b['slots']} of its slots hold another expert")

    ref = demo.start_engine("R", demo.pool_a, demo.spec(None, plugin=False))
    out_ref = demo.forward(ref)
    demo.stop(ref)
    diff = differing(out_b, out_ref)
    demo.step(f"case 0: reference engine R (weights from disk): {diff}/{len(out_ref)} of B's outputs differ")
    demo.picture["before_believed"] = rep_b["believed"]
    demo.picture["before_held"] = rep_b["held"]
    passed = moved == demo.opt.rebalances and rep_b["wrong"] > 0 and diff > 0 and b.ok
    return demo.results.add(
        Row(
            "0",
            "bug: protocol off, B starts after A's rebalances",
            "B starts without error and routes to the wrong experts (upstream: 6186/6240 slots, 0/1319 GSM8K)",
            f"B started without error; {rep_b['wrong']}/{rep_b['slots']} slots wrong; "
            f"{diff}/{len(out_ref)} outputs differ from the reference",
            {
                "rebalances_by_A": demo.opt.rebalances,
                "wrong_slots": f"{rep_b['wrong']}/{rep_b['slots']}",
                "outputs_differ": f"{diff}/{len(out_ref)}",
            },
            passed,
        )
    )


def case1_restart(demo: Demo) -> Row:
    """Restart on the same daemons: B adopts A's version; equal to D loaded with that map."""
    demo.step("case 1: layout-aware daemons P1; engine A attaches and loads")
    a = demo.start_engine("A", demo.pool_a, demo.spec("P1"))
    if not a.loaded:
        raise demo_error("A", a)
    for i in range(demo.opt.rebalances):
        outs = demo.rebalance(a)
        states = demo.query("P1")
        demo.step(
            f"case 1: A rebalance {i + 1}/{demo.opt.rebalances} ({outs[0].get('chunks')} chunks): "
            f"daemon versions {versions(states)}"
        )
    out_a = demo.forward(a)
    demo.stop(a)
    states = demo.wait_detached("P1")
    daemon_map = states[0]["map"]

    b = demo.start_engine("B", demo.pool_a, demo.spec("P1"))
    if not b.loaded:
        raise demo_error("B", b)
    rep_b = demo.report(b)
    out_b = demo.forward(b)
    demo.stop(b)
    adopted = all(s["map"] == daemon_map for s in b.started)
    demo.step(
        f"case 1: B adopted version {states[0]['version']} on both ranks: {adopted}; "
        f"{rep_b['wrong']}/{rep_b['slots']} slots wrong; outputs equal A's last: {out_b == out_a}"
    )

    d = demo.start_engine("D", demo.pool_a, demo.spec(None, init_expert_location=init_location(daemon_map)))
    rep_d = demo.report(d)
    out_d = demo.forward(d)
    demo.stop(d)
    same_weights = rep_d["experts_sha256"] == rep_b["experts_sha256"]
    same_routing = rep_d["believed"] == rep_b["believed"] and rep_d["l2p"] == rep_b["l2p"]
    demo.step(
        f"case 1: D (--init-expert-location = that map, weights from disk): same weights {same_weights}, "
        f"same routing {same_routing}, same outputs {out_d == out_b}"
    )
    demo.picture["after_believed"] = rep_b["believed"]
    demo.picture["after_held"] = rep_b["held"]
    passed = (
        same_record(states)
        and adopted
        and rep_b["wrong"] == 0
        and out_b == out_a
        and same_weights
        and same_routing
        and out_d == out_b
    )
    return demo.results.add(
        Row(
            "1",
            "restart on the same daemons",
            "B adopts A's version on both ranks; every slot matches; B's outputs = A's; B = D (init map)",
            f"B adopted v{states[0]['version']} on both ranks: {adopted}; {rep_b['wrong']}/{rep_b['slots']} "
            f"slots wrong; outputs = A's: {out_b == out_a}; weights, routing, outputs = D's: "
            f"{same_weights and same_routing and out_d == out_b}",
            {
                "version": states[0]["version"],
                "wrong_slots": f"{rep_b['wrong']}/{rep_b['slots']}",
                "outputs_differ_from_A": f"{differing(out_b, out_a)}/{len(out_a)}",
                "outputs_differ_from_D": f"{differing(out_b, out_d)}/{len(out_d)}",
            },
            passed,
        )
    )


def _busy(outs: list[dict[str, Any]]) -> int:
    """Begins that paused (busy) in one rebalance attempt, over the ranks: a begin that led to
    no commit while the rebalancing stayed on (a refusal turns it off for good)."""
    paused = 0
    for o in outs:
        before, after = o.get("stats_before") or {}, o.get("stats") or {}
        if after.get("phase") == "off":
            continue
        begins = int(after.get("begins", 0)) - int(before.get("begins", 0))
        commits = int(after.get("commits", 0)) - int(before.get("commits", 0))
        paused += begins - commits
    return paused


def _off(outs: list[dict[str, Any]]) -> str:
    """The adapter's reason for rebalancing being off, if it is."""
    for o in outs:
        stats = o.get("stats") or {}
        if stats.get("phase") == "off":
            return str(stats.get("off_reason"))
    return ""


def case2_standby(demo: Demo) -> Row:
    """A warm standby C pauses A's rebalancing; after C stops, A rebalances again."""
    demo.step("case 2: A attaches to P1 and adopts its version; warm standby C attaches too")
    a = demo.start_engine("A", demo.pool_a, demo.spec("P1"))
    c = demo.start_engine("C", demo.pool_c, demo.spec("P1"))
    if not (a.loaded and c.loaded):
        raise demo_error("A/C", a if not a.loaded else c)
    before = demo.query("P1")
    attempts, busy, moved = 2, 0, 0
    for _ in range(attempts):
        outs = demo.rebalance(a)
        busy += _busy(outs)
        moved += int(any(o.get("moved") for o in outs))
    during = demo.query("P1")
    unchanged = [(s["version"], s["digest"]) for s in during] == [(s["version"], s["digest"]) for s in before]
    demo.step(
        f"case 2: while C is attached A tried {attempts} rebalances: {busy} begins busy, {moved} moved; "
        f"record unchanged: {unchanged} (versions {versions(during)})"
    )
    out_a = demo.forward(a)
    out_c = demo.forward(c)
    demo.stop(c)
    demo.wait_attached("P1", 1)  # the daemons noticed C's detach (EOF) before A's next begin
    outs = demo.rebalance(a)
    after = demo.query("P1")
    demo.stop(a)
    up = all(x["version"] > y["version"] for x, y in zip(after, during, strict=True))
    demo.step(f"case 2: C gives A's outputs: {out_c == out_a}; C stopped; A rebalanced: versions {versions(after)}")
    passed = unchanged and moved == 0 and out_c == out_a and up and all(o.get("moved") for o in outs)
    return demo.results.add(
        Row(
            "2",
            "warm standby pauses rebalancing",
            "while C is attached A's begins are busy and the record does not change; C = A's outputs; "
            "after C stops A rebalances, version up",
            f"{busy} begins busy over {attempts} attempts, record unchanged: {unchanged}; C's outputs = A's: "
            f"{out_c == out_a}; after C stopped: version {versions(during)[0]} -> {versions(after)[0]}",
            {
                "busy_begins": busy,
                "attempts": attempts,
                "version_during": versions(during)[0],
                "version_after": versions(after)[0],
                "outputs_differ_C_vs_A": f"{differing(out_c, out_a)}/{len(out_a)}",
            },
            passed,
        )
    )


def case3_kill(demo: Demo) -> list[Row]:
    """SIGKILL during a rebalance with one layer per chunk: between chunks, then with a move pending."""
    rows = []
    demo.step("case 3a: A (one layer per chunk) rebalances once, then again and is SIGKILLed after 2 chunks")
    a = demo.start_engine("A", demo.pool_a, demo.spec("P1", layers_per_chunk=1))
    if not a.loaded:
        raise demo_error("A", a)
    demo.rebalance(a)
    start_version = versions(demo.query("P1"))[0]
    demo.kill_at(a, chunks_done=2, pending=False)
    states = demo.wait_detached("P1")
    clean = all(s["phase"] == "clean" for s in states) and same_record(states)
    demo.step(
        f"case 3a: killed between a commit and the next begin: daemons {[s['phase'] for s in states]}, "
        f"versions {start_version} -> {versions(states)}"
    )
    e = demo.start_engine("E", demo.pool_c, demo.spec("P1", layers_per_chunk=1))
    rep_e = demo.report(e) if e.loaded else {"wrong": None, "slots": 0, "believed": None}
    adopted = e.loaded and rep_e["believed"] == states[0]["map"]
    demo.step(f"case 3a: new engine E adopted v{states[0]['version']}: {adopted}; {rep_e['wrong']} slots wrong")
    rows.append(
        demo.results.add(
            Row(
                "3a",
                "SIGKILL between commit and next begin",
                "the daemons hold the last committed version; a new engine adopts it and matches memory",
                f"daemons {states[0]['phase']} at v{states[0]['version']} (2 of {demo.cfg.num_layers} layers "
                f"committed); E adopted it: {adopted}; {rep_e['wrong']}/{rep_e['slots']} slots wrong",
                {
                    "version_before": start_version,
                    "version_after_kill": states[0]["version"],
                    "wrong_slots": f"{rep_e['wrong']}/{rep_e['slots']}",
                },
                clean and adopted and rep_e["wrong"] == 0 and states[0]["version"] == start_version + 2,
            )
        )
    )

    demo.step("case 3b: E rebalances; SIGKILLed inside chunk 2, after its move and before its commit")
    demo.rebalance(e)
    demo.kill_at(e, chunks_done=1, pending=True)
    states = demo.wait_detached("P1")
    dirty = all(s["phase"] == "dirty" for s in states)
    demo.step(f"case 3b: daemons {[s['phase'] for s in states]}: {summary(states[0].get('dirty'))}")
    f = demo.start_engine("F", demo.pool_f, demo.spec("P1"))
    demo.step(f"case 3b: new engine F: started={f.ok}: {summary(f.error())}")
    if f.ok:
        demo.stop(f)
    rows.append(
        demo.results.add(
            Row(
                "3b",
                "SIGKILL with a move pending",
                "the daemons become dirty; a new engine fails at startup with the reason",
                f"daemons {states[0]['phase']}; F failed at startup: {not f.ok}: {summary(f.error())}",
                {"phases": "/".join(s["phase"] for s in states), "engine_started": f.ok},
                dirty and not f.ok and "dirty" in f.error().lower(),
            )
        )
    )
    return rows


def matrix_new_engine_old_daemon(demo: Demo) -> Row:
    """M1: a new engine (plugin) on older daemons (plain sglang): own layout, no shared rebalancing."""
    demo.step("matrix M1: new engine N on older (plain sglang) daemons P0")
    n = demo.start_engine("N", demo.pool_a, demo.spec("P0"))
    outs = demo.rebalance(n) if n.loaded else []
    rep = demo.report(n) if n.loaded else {"wrong": None, "slots": 0}
    demo.stop(n)
    moved = any(o.get("moved") for o in outs)
    demo.step(
        f"matrix M1: N started: {n.ok}, loaded from the daemons: {n.loaded}; its rebalance moved experts: {moved}"
    )
    return demo.results.add(
        Row(
            "M1",
            "new engine on an older daemon",
            "starts with its own initial layout (no daemon moved); rebalancing of shared weights off",
            f"started and loaded: {n.loaded}; rebalance moved experts: {moved}; {rep['wrong']}/{rep['slots']} "
            "slots wrong",
            {"moved": moved, "rebalance_off": _off(outs), "wrong_slots": f"{rep['wrong']}/{rep['slots']}"},
            n.loaded and not moved and rep["wrong"] == 0,
        )
    )


def matrix_old_engine_before_move(demo: Demo) -> Row:
    """M2a: an older engine (no plugin) on new daemons at version 0: served, flag set, moves refused."""
    demo.step("matrix M2a: older engine O on layout-aware daemons P3 at version 0")
    o = demo.start_engine("O", demo.pool_f, demo.spec("P3", plugin=False))
    states = demo.query("P3")
    demo.stop(o)
    flagged = all(s.get("non_following_seen") for s in states)
    demo.step(f"matrix M2a: O served: {o.loaded}; daemons flag non-following: {flagged}")
    n = demo.start_engine("N", demo.pool_f, demo.spec("P3"))
    outs = demo.rebalance(n) if n.loaded else []
    after = demo.query("P3")
    demo.stop(n)
    moved = any(x.get("moved") for x in outs)
    demo.step(f"matrix M2a: a new engine's rebalance afterwards moved experts: {moved}; versions {versions(after)}")
    return demo.results.add(
        Row(
            "M2a",
            "older engine on a new daemon, before a move",
            "served at version 0, non-following seen is set; later begins are refused (no move)",
            f"served: {o.loaded}; non-following seen: {flagged}; a later rebalance moved experts: {moved}",
            {
                "served": o.loaded,
                "non_following_seen": flagged,
                "rebalance_off": _off(outs),
                "version_after": versions(after)[0],
            },
            o.loaded and flagged and not moved and versions(after)[0] == 0,
        )
    )


def matrix_old_engine_after_move(demo: Demo) -> Row:
    """M2b: an older engine on new daemons after a move: fetch_state refused, with the reason."""
    demo.step("matrix M2b: older engine O on P1 after moves")
    o = demo.start_engine("O", demo.pool_f, demo.spec("P1", plugin=False))
    demo.stop(o)
    reason = o.error()
    states = demo.query("P1")
    # sglang's loader reports any non-ok reply as a config mismatch; the daemon's reply says why.
    raw = demo.raw_fetch("P1", 0)
    demo.step(f"matrix M2b: O loaded: {o.loaded}: {summary(reason)}")
    demo.step(
        f"matrix M2b: the daemon's reply to O: {raw.get('status')} ({raw.get('reason')}): {summary(raw.get('message'))}"
    )
    return demo.results.add(
        Row(
            "M2b",
            "older engine on a new daemon, after a move",
            "fetch_state refused (layout_refused): upgrade the engine or restart the daemons",
            f"loaded: {o.loaded}; daemon replied {raw.get('status')} ({raw.get('reason')}): "
            f"{summary(raw.get('message'))}",
            {"loaded": o.loaded, "version": versions(states)[0], "reply": raw.get("status")},
            not o.loaded and raw.get("status") == "layout_refused",
        )
    )


def matrix_no_eplb_daemon(demo: Demo) -> Row:
    """M3: daemons without --enable-eplb (no record): served as sglang does; no shared rebalancing."""
    demo.step("matrix M3: daemons P4 without --enable-eplb; a new engine N, then an older engine O")
    n = demo.start_engine("N", demo.pool_f, demo.spec("P4"))
    outs = demo.rebalance(n) if n.loaded else []
    rep = demo.report(n) if n.loaded else {"wrong": None, "slots": 0}
    demo.stop(n)
    o = demo.start_engine("O", demo.pool_f, demo.spec("P4", plugin=False))
    demo.stop(o)
    moved = any(x.get("moved") for x in outs)
    demo.step(f"matrix M3: N loaded {n.loaded}, rebalance moved {moved}; older O loaded {o.loaded}")
    return demo.results.add(
        Row(
            "M3",
            "daemon without --enable-eplb",
            "no record: engines start with their own layout, rebalancing of shared weights off; older engines served",
            f"new engine loaded: {n.loaded}, rebalance moved experts: {moved}, {rep['wrong']}/{rep['slots']} slots "
            f"wrong; older engine loaded: {o.loaded}",
            {"moved": moved, "rebalance_off": _off(outs), "older_engine_served": o.loaded},
            n.loaded and not moved and rep["wrong"] == 0 and o.loaded,
        )
    )


def demo_error(label: str, engine: Any) -> Exception:
    from tools.demo.harness.lab import DemoError

    return DemoError(f"engine {label} did not start and load from the daemons: {engine.error()}")


__all__ = [
    "case0_bug",
    "case1_restart",
    "case2_standby",
    "case3_kill",
    "matrix_new_engine_old_daemon",
    "matrix_no_eplb_daemon",
    "matrix_old_engine_after_move",
    "matrix_old_engine_before_move",
    "rank_scripts",
]
