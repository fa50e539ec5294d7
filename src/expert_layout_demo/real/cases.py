"""The demo's cases on real ``python -m sglang.launch_server`` servers (TP2/EP2, CPU).

Three chains of daemons, one after the other (at most two servers alive at once):

* ``off``: the protocol off everywhere (``SGLANG_PLUGINS=none``). Server 0-A spawns plain
  sglang daemons (``--weight-cache-mode daemon``); a layout-aware server (M1) visits them
  before any move; 0-A rebalances; 0-B starts on the same daemons (``client``). A server loaded
  from disk (``ref-disk``) gives the right outputs.
* ``noeplb``: standalone layout-aware daemons without ``--enable-eplb`` (M3).
* ``aware``: standalone layout-aware daemons (``python -m daemon_adapter --enable-eplb``),
  engines in ``client`` mode: case 1 (restart), the older engine (M2), case 2 (warm standby),
  3a (SIGKILL between chunks), 3b (SIGKILL mid-move, which leaves the daemons dirty).

What an engine believes is read from its own log (``[expert-layout] rank r startup: adopt``)
and the daemons' record (``expert-layout status --json --include-map``); without the protocol it
is sglang's initial layout (``ExpertLocationMetadata.init_trivial``). What memory holds is read
from the daemons' memory (``memory_probe``).
"""

from __future__ import annotations

import time
from typing import Any

from expert_layout_demo import memory_probe
from expert_layout_demo.real import servers
from expert_layout_demo.real.lab import Lab, differing, first_match, record_map, same_record
from expert_layout_demo.results import Row

PLUGINS_OFF = {"SGLANG_PLUGINS": "none"}
ADOPT = r"\[expert-layout\] rank \d+ startup: adopt"
KEEP_OWN = r"\[expert-layout\] rank \d+ startup: keep_own"
PAUSED = r"\[expert-layout\] rebalance paused"
REBALANCE_OFF = r"\[expert-layout\] [^\n]*rebalanc[^\n]*off[^\n]*"


class Evidence(dict):  # type: ignore[type-arg]
    """What the cases hand to each other and to the picture."""


def case0_and_m1(lab: Lab, ev: Evidence) -> list[Row]:
    chain = lab.chain("off")
    a = lab.server("0-A", chain, plugin=False, weight_cache="daemon", env=PLUGINS_OFF)
    lab.step(f"case 0: server 0-A (plugins off) spawned plain sglang daemons; ready in {a.ready_s:.0f}s")
    lab.status(chain, "case 0: plain daemons")

    # M1: a layout-aware engine on plain sglang daemons, before any move.
    p = lab.server("M1-P", chain, plugin=True, weight_cache="client")
    p_keep = p.log_count(KEEP_OWN)
    p_out = lab.generate(p)
    lab.drive(p, 4)  # enough forward passes for a rebalance interval
    p_off = first_match(p.log_text(), REBALANCE_OFF)
    lab.step(f"matrix M1: layout-aware server on plain daemons: keep_own on {p_keep} ranks; {p_off or 'no off line'}")
    lab.stop(p)

    moved = lab.rebalance(a, 3)
    lab.step(f"case 0: 0-A rebalanced {moved} times (sglang's EPLB, weights moved in the daemons' memory)")
    b = lab.server("0-B", chain, plugin=False, env=PLUGINS_OFF)
    lab.step(f"case 0: server 0-B (plugins off) started on the same daemons without error, ready in {b.ready_s:.0f}s")
    b_out = lab.generate(b)
    held = lab.held(chain)
    believed = memory_probe.trivial_map(len(held), len(held[0]), servers.NUM_LOGICAL)
    wrong = memory_probe.wrong_slots(believed, held)
    lab.stop(b, a)

    ref = lab.server("ref-disk", None, plugin=False)
    ref_out = lab.generate(ref)
    lab.stop(ref)
    ev["ref_out"] = ref_out
    ev["before"] = (believed, held)
    diff = differing(b_out, ref_out)
    slots = len(held) * len(held[0])
    lab.step(
        f"case 0: {wrong}/{slots} slots hold another expert than 0-B believes; {diff}/{len(ref_out)} outputs differ"
    )
    p_same = differing(p_out, ref_out)
    return [
        Row(
            "0",
            "protocol off: restart on moved daemons",
            "B starts without error on A's daemons and serves wrong outputs; slots hold other experts than B believes",
            f"0-A rebalanced {moved} times; 0-B started without error and believes sglang's initial layout; "
            f"{wrong} of {slots} slots hold another expert; {diff} of {len(ref_out)} prompts' outputs differ "
            f"from a server loaded from disk",
            {"rebalances": moved, "wrong_slots": f"{wrong}/{slots}", "outputs_differ": f"{diff}/{len(ref_out)}"},
            b.ready and moved > 0 and wrong > 0 and diff > 0,
        ),
        Row(
            "M1",
            "layout-aware engine on plain sglang daemons",
            "keeps its own layout; rebalancing of shared weights off",
            f"M1-P started (keep_own on {p_keep} of {servers.WORLD} ranks); {p_off or 'no rebalancing-off line'}; "
            f"{len(p_out) - p_same} of {len(p_out)} outputs equal the disk server's",
            {"keep_own_ranks": p_keep, "outputs_equal": f"{len(p_out) - p_same}/{len(p_out)}"},
            p.ready and p_keep == servers.WORLD and bool(p_off) and p_same == 0,
        ),
    ]


def m3_no_eplb(lab: Lab, ev: Evidence) -> Row:
    chain = lab.standalone_daemons(lab.chain("noeplb"), layout_aware=True, enable_eplb=False)
    states = lab.status(chain, "matrix M3: layout-aware daemons without --enable-eplb")
    r = lab.server("M3-R", chain)
    out = lab.generate(r)
    keep = r.log_count(KEEP_OWN)
    lab.stop(r)
    chain.standalone.stop()  # type: ignore[union-attr]
    same = len(out) - differing(out, ev["ref_out"])
    lab.step(
        f"matrix M3: server on daemons without --enable-eplb: keep_own on {keep} ranks; "
        f"{same}/{len(out)} outputs as from disk"
    )
    no_record = all(s.get("version") is None for s in states)
    return Row(
        "M3",
        "daemons without --enable-eplb",
        "no record; they serve as sglang does",
        f"status: {', '.join(str(s.get('phase')) for s in states)}; M3-R started with its own layout on "
        f"{keep} ranks; {same} of {len(out)} outputs equal the disk server's",
        {"keep_own_ranks": keep, "outputs_equal": f"{same}/{len(out)}"},
        r.ready and no_record and same == len(out),
    )


def aware_chain(lab: Lab, ev: Evidence) -> list[Row]:
    rows: list[Row] = []
    chain = lab.standalone_daemons(lab.chain("aware"), layout_aware=True, enable_eplb=True)
    lab.status(chain, "case 1: layout-aware daemons up (python -m daemon_adapter --enable-eplb)")

    # -- case 1: restart ------------------------------------------------------------------
    a = lab.server("1-A", chain)
    moved = lab.rebalance(a, 3)
    st_a = lab.status(chain, f"case 1: 1-A rebalanced {moved} times")
    lab.stop(a)
    lab.status(chain, "case 1: 1-A stopped")
    b = lab.server("1-B", chain)
    adopted = b.log_count(ADOPT)
    b_out = lab.generate(b)
    st_b = lab.status(chain, f"case 1: 1-B started, adopt on {adopted} ranks")
    believed = record_map(st_b)
    held = lab.held(chain)
    wrong = memory_probe.wrong_slots(believed, held)
    ref = lab.server("ref-map", None, plugin=False, init_expert_location=believed)
    ref_out = lab.generate(ref)
    lab.stop(ref)
    diff = differing(b_out, ref_out)
    ev["after"] = (believed, held)
    version = st_b[0].get("version")
    slots = len(held) * len(held[0])
    lab.step(
        f"case 1: 1-B adopted version {version}; {wrong}/{slots} slots wrong; "
        f"{len(b_out) - diff}/{len(b_out)} outputs equal ref-map's"
    )
    rows.append(
        Row(
            "1",
            "restart with the protocol on",
            "B adopts A's version on every rank; its outputs equal a disk server started with "
            "--init-expert-location set to that map",
            f"1-A rebalanced {moved} times (daemons at version {st_a[0].get('version')}); 1-B adopted version "
            f"{version} on {adopted} of {servers.WORLD} ranks; {wrong} of {slots} slots wrong; "
            f"{len(b_out) - diff} of {len(b_out)} outputs equal ref-map's",
            {
                "version": version,
                "adopt_ranks": adopted,
                "wrong_slots": f"{wrong}/{slots}",
                "outputs_equal": f"{len(b_out) - diff}/{len(b_out)}",
            },
            moved > 0 and adopted == servers.WORLD and same_record(st_b) and wrong == 0 and diff == 0,
        )
    )

    # -- M2: an older engine (plugins off) after a move -------------------------------------
    t0 = time.monotonic()
    o = lab.server("M2-older", chain, plugin=False, env=PLUGINS_OFF, expect_ready=False)
    reason = first_match(o.log_text(), r"[^\n]*(layout_refused|refused fetch_state|older engine|upgrade)[^\n]*")
    lab.step(f"matrix M2: older server refused after {time.monotonic() - t0:.0f}s: {reason or o.failure}")
    rows.append(
        Row(
            "M2",
            "older engine (plugins off) after a move",
            "refused with the reason on screen",
            f"M2-older {'became ready' if o.ready else 'failed at startup'} (exit {o.returncode}); "
            f"reason: {reason or o.failure}",
            {"ready": o.ready, "exit": o.returncode},
            not o.ready and bool(reason),
        )
    )

    # -- case 2: warm standby ---------------------------------------------------------------
    c = lab.server("2-C", chain)
    c_adopt = c.log_count(ADOPT)
    st_c = lab.status(chain, "case 2: standby 2-C attached next to 1-B")
    paused = lab.drive_until(b, PAUSED, 1)
    st_busy = lab.status(chain, f"case 2: 1-B's rebalance paused {paused} times (busy)")
    unchanged = same_record(st_busy) and st_busy[0].get("digest") == st_c[0].get("digest")
    lab.stop(c)
    lab.status(chain, "case 2: 2-C stopped")
    again = lab.rebalance(b, 1)
    st_again = lab.status(chain, f"case 2: 1-B rebalanced {again} times after 2-C stopped")
    v_before, v_after = st_busy[0].get("version"), st_again[0].get("version")
    rows.append(
        Row(
            "2",
            "warm standby",
            "while B is attached A's rebalances are busy and the record does not change; "
            "after B stops A rebalances again",
            f"2-C adopted on {c_adopt} ranks; 1-B's rebalance paused {paused} times with 2-C attached; record "
            f"{'unchanged' if unchanged else 'CHANGED'} at version {v_before}; after 2-C stopped, 1-B rebalanced "
            f"{again} times: version {v_before} -> {v_after}",
            {"paused": paused, "version_busy": v_before, "version_after": v_after},
            c_adopt == servers.WORLD and paused > 0 and unchanged and again > 0 and (v_after or 0) > (v_before or 0),
        )
    )

    # -- case 3a: SIGKILL between chunks ----------------------------------------------------
    killed = lab.kill_at(b, servers.BETWEEN_CHUNKS)
    st_k = lab.status(chain, f"case 3a: 1-B SIGKILLed between chunks ({killed})")
    d = lab.server("3a-D", chain)
    d_adopt = d.log_count(ADOPT)
    st_d = lab.status(chain, "case 3a: 3a-D started")
    held_d = lab.held(chain)
    wrong_d = memory_probe.wrong_slots(record_map(st_d), held_d)
    clean = not any(s.get("dirty") or s.get("pending") for s in st_k)
    rows.append(
        Row(
            "3a",
            "SIGKILL between chunks",
            "the next server adopts the last committed version",
            f"after the kill the daemons are {'clean' if clean else 'NOT clean'} at version {st_k[0].get('version')}; "
            f"3a-D adopted version {st_d[0].get('version')} on {d_adopt} ranks; {wrong_d} slots wrong",
            {"version": st_d[0].get("version"), "adopt_ranks": d_adopt, "wrong_slots": wrong_d},
            clean and d_adopt == servers.WORLD and wrong_d == 0 and st_d[0].get("version") == st_k[0].get("version"),
        )
    )

    # -- case 3b: SIGKILL mid-move ----------------------------------------------------------
    killed = lab.kill_at(d, servers.MID_MOVE)
    st_dirty = lab.status(chain, f"case 3b: 3a-D SIGKILLed mid-move ({killed})")
    t0 = time.monotonic()
    e = lab.server("3b-E", chain, expect_ready=False)
    fail_s = time.monotonic() - t0
    reason = first_match(e.log_text(), r"[^\n]*\[expert-layout\][^\n]*dirty[^\n]*") or e.failure
    lab.step(f"case 3b: 3b-E failed at startup after {fail_s:.0f}s (exit {e.returncode}): {reason}")
    dirty = all(s.get("dirty") for s in st_dirty)
    rows.append(
        Row(
            "3b",
            "SIGKILL mid-move",
            "daemons dirty; the next server fails at startup, promptly, with the reason",
            f"daemons {'dirty' if dirty else 'NOT dirty'}; 3b-E {'became ready' if e.ready else 'failed'} after "
            f"{fail_s:.0f}s (exit {e.returncode}) with: {reason}",
            {"dirty": dirty, "fail_s": round(fail_s, 1), "exit": e.returncode},
            dirty and not e.ready and "dirty" in reason,
        )
    )
    chain.standalone.stop()  # type: ignore[union-attr]
    return rows


def run_all(lab: Lab) -> tuple[list[Row], dict[str, Any]]:
    ev = Evidence()
    rows: list[Row] = []
    for name, fn in (("0", case0_and_m1), ("M3", m3_no_eplb), ("1", aware_chain)):
        try:
            out = fn(lab, ev)
            rows.extend(out if isinstance(out, list) else [out])
        except Exception as exc:  # one broken chain must not hide the others' rows
            lab.step(f"case {name}: could not run: {type(exc).__name__}: {exc}")
            rows.append(Row(name, "could not run", "", f"{type(exc).__name__}: {exc}", {}, False))
    return rows, ev
