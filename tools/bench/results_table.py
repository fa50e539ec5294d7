"""``python -m tools.bench.results_table``: the headline figures of the latest ``make bench`` as one table.

``make bench`` writes everything it measured to ``bench-results/`` (ignored by git). This reads its
``bench.json`` and writes the headline rows, each against its floor and its target, to the committed
``results/bench.md`` (the README links it: the product's text carries no figures). The notes after the
table in ``results/bench.md`` (from its ``## Notes`` heading on) are kept as they are.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.bench.real import ADDED_SHARE_MAX, READY_RATIO_MAX, REBALANCE_RATIO_MAX, TAKEOVER_MAX_S, spread_text

HEADER = [
    "| figure | with the protocol | floor, or without it | ratio | target | met |",
    "| --- | --- | --- | --- | --- | --- |",
]
NOTES = "## Notes"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def rows(data: dict[str, Any]) -> list[str]:
    """The headline rows of a ``bench.json``: the protocol's own costs, then real servers where measured."""
    t = data["targets"]
    out = []
    for key in ("chunk_1_rank", "chunk_2_ranks"):
        r = data[key]
        ok = r["chunk_ratio"] <= t["chunk_ratio_max"]
        out.append(
            f"| a chunk of one layer, 61 x 288 map, {r['ranks']} rank(s) | {r['chunk_us']} µs | "
            f"{r['chunk_floor_us']} µs | {r['chunk_ratio']}x | ≤ {t['chunk_ratio_max']}x | {_yes(ok)} |"
        )
    if data.get("scaling"):
        widest = max(data["scaling"]["by_ranks"], key=lambda p: p["ranks"])
        out.append(
            f"| the same chunk, {widest['ranks']} ranks | {widest['chunk_us']:.0f} µs | "
            f"{widest['chunk_floor_us']:.0f} µs | {widest['chunk_ratio']}x | none | - |"
        )
        if data["scaling"].get("by_ranks_two_nodes"):
            split = max(data["scaling"]["by_ranks_two_nodes"], key=lambda p: p["ranks"])
            out.append(
                f"| the same chunk, {split['ranks']} ranks over two nodes (a veth link) | {split['chunk_us']:.0f} µs | "
                f"{split['chunk_floor_us']:.0f} µs | {split['chunk_ratio']}x | none | - |"
            )
    widest_points = [max(data["scaling"]["by_ranks"], key=lambda p: p["ranks"])] if data.get("scaling") else []
    for r in [data["chunk_1_rank"], data["chunk_2_ranks"], *widest_points]:
        if "two_collectives_us" not in r:
            continue
        ok = r["chunk_own_us"] <= r["two_collectives_own_us"] and r.get("all_gathers_per_chunk") == 1
        out.append(
            f"| a chunk, {r['ranks']} rank(s): one all-gather ({r.get('all_gathers_per_chunk')} a chunk, "
            f"+{r.get('all_gathers_per_rebalance_end')} at a rebalance's end) against two "
            f"({r['two_collectives_all_gathers_per_chunk']}), same session, same run | {r['chunk_us']:.0f} µs, "
            f"own {r['chunk_own_us']:.0f} µs | {r['two_collectives_us']:.0f} µs, own "
            f"{r['two_collectives_own_us']:.0f} µs | {r['chunk_us'] / r['two_collectives_us']:.2f}x | one "
            f"all-gather; own time no larger | {_yes(ok)} |"
        )
    for key in ("chunk_1_rank", "chunk_2_ranks"):
        r = data[key]
        ok = r["startup_ratio"] <= t["startup_ratio_max"]
        out.append(
            f"| startup (attach + agreement), {r['ranks']} rank(s) | {r['startup_us']} µs | "
            f"{r['startup_floor_us']} µs | {r['startup_ratio']}x | ≤ {t['startup_ratio_max']}x | {_yes(ok)} |"
        )
    commit_ms = data["scale"]["commit_full_map_daemon_us"] / 1000
    out.append(
        f"| a full-map commit (61 x 288), daemon side | {commit_ms:.2f} ms | - | - | < {t['commit_ms_max']} ms | "
        f"{_yes(commit_ms < t['commit_ms_max'])} |"
    )
    fe = data["fetch"]
    out += [
        f"| `fetch_state` with the layout check | {fe['fetch_with_layout_check_us']} µs | "
        f"{fe['fetch_plain_sglang_us']} µs, sglang's own handler | +{100 * fe['overhead']:.2f}% | "
        f"≤ {100 * t['fetch_overhead_max']:.0f}% | {_yes(fe['overhead'] <= t['fetch_overhead_max'])} |",
        f"| `fetch_state` reading the request only (the floor of any check) | "
        f"{fe['fetch_reading_the_request_us']} µs | {fe['fetch_plain_sglang_us']} µs | "
        f"+{100 * fe['reading_overhead']:.2f}% | none | - |",
        f"| the layout check alone, timed where it runs in sglang's handler | {fe['check_in_situ_us']} µs | "
        f"{fe['check_warm_us']} µs, the same check warm | "
        f"{100 * fe['check_in_situ_us'] / fe['fetch_plain_sglang_us']:.2f}% of sglang's fetch | none | - |",
    ]
    real = data.get("real_servers")
    if real:
        out += _real_rows(real)
    return out


def _real_rows(real: dict[str, Any]) -> list[str]:
    r, b = real["ready"], real["rebalance"]
    out = [
        f"| real server ready time, TP2/EP2 (launch to the first generated token) | {r['median_on_s']} s | "
        f"{r['median_off_s']} s, `SGLANG_PLUGINS=none` | {r['ratio_on_to_off']}x"
        f"{_per_pair(r.get('ratio_on_to_off_spread'))} | ≤ {READY_RATIO_MAX}x | "
        f"{_yes(r['ratio_on_to_off'] <= READY_RATIO_MAX)} |",
        f"| real EPLB rebalance, one layer per chunk, {b['chunks_per_rebalance']} layers | "
        f"{1000 * b['median_on_s']:.1f} ms | {1000 * b['median_off_s']:.1f} ms without the protocol | "
        f"{b['ratio_on_to_off']}x (per rotation {spread_text(b['ratio_on_to_off_spread'])}) | "
        "reported, not the target | - |",
    ]
    if b.get("added_share_of_floor2"):
        share = b["added_share_of_floor2"]
        out.append(
            f"| time the protocol adds to that rebalance, against the two-collective floor's | "
            f"{1000 * b['added_on_s']['median']:.1f} ms | {1000 * b['added_floor2_s']['median']:.1f} ms "
            f"(one-collective floor: {1000 * b['added_floor1_s']['median']:.1f} ms) | "
            f"{spread_text(share, '')} | ≤ {ADDED_SHARE_MAX} | {_yes(share['median'] <= ADDED_SHARE_MAX)} |"
        )
    parts = b.get("chunk_parts_ms", {})
    on, floor1, floor2 = parts.get("on"), parts.get("floor1"), parts.get("floor2")
    if on and floor1 and floor2 and "begin" in on and "before" in floor1 and "before" in floor2:
        out.append(
            f"| inside each chunk (ms): the protocol's begin + commit, sglang's move | {on['begin']} + "
            f"{on['commit']}, move {on['move']} | one-collective floor {floor1['before']} + {floor1['after']}; "
            f"two-collective floor {floor2['before']} + {floor2['after']} | - | none | - |"
        )
    s = real.get("standby")
    if s:
        busy = s["busy_pauses"]["beside"]
        ok = busy == 0 and s["ratio_beside_to_alone"] <= REBALANCE_RATIO_MAX
        out.append(
            f"| a primary's rebalance beside a parked warm standby | {1000 * s['median_beside_s']:.1f} ms, "
            f"{busy} busy | {1000 * s['median_alone_s']:.1f} ms alone | {s['ratio_beside_to_alone']}x"
            f"{_per_pair(s.get('ratio_beside_to_alone_spread'))} | "
            f"≤ {REBALANCE_RATIO_MAX}x, never busy | {_yes(ok)} |"
        )
        first, ready = s.get("takeover_first_token_s"), s.get("takeover_ready_s")
        if first and ready:
            answered = [r for r in ready if r is not None]
            ok = len(answered) == len(ready) and max(first) < TAKEOVER_MAX_S and max(answered) < TAKEOVER_MAX_S
            out.append(
                f"| a warm standby's takeover from its SIGKILLed primary: first token, `/ready` 200 | "
                f"{statistics.median(first):.3f} s, {statistics.median(answered) if answered else float('nan'):.3f} s "
                f"| - | - | both < {TAKEOVER_MAX_S:.0f} s | {_yes(ok)} |"
            )
    p = real.get("repair")
    if p:
        out.append(
            f"| a torn move's repair (auto), from the mover's EOF to clean | {p['repair_s']} s | "
            f"{p['restart_s']} s to restart the daemon set | - | faster than a restart | "
            f"{_yes(p['repair_s'] < p['restart_s'])} |"
        )
    return out


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def results_md(data: dict[str, Any], commit: str, notes: str) -> str:
    machine = ", ".join(f"{k} {v}" for k, v in data["machine"].items())
    lines = [
        "# Benchmarks: the headline figures",
        "",
        f"Measured by `make bench` on commit `{commit}` ({machine}); written by "
        "`python -m tools.bench.results_table` from `bench-results/bench.json`, where every figure of the run "
        "is, each with its repetitions. Each figure is set against a floor measured in the same run.",
        "",
        *HEADER,
        *rows(data),
        "",
    ]
    return "\n".join(lines) + (("\n" + notes) if notes else "")


def _per_pair(spread: dict[str, float] | None) -> str:
    return "" if not spread else f" (per pair {spread_text(spread)})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.results_table", description=__doc__)
    parser.add_argument("--bench", default="bench-results/bench.json")
    parser.add_argument("--out", default="results/bench.md")
    parser.add_argument("--commit", default=None, help="the commit measured (default: the checkout's HEAD)")
    args = parser.parse_args(argv)
    data = json.loads(Path(args.bench).read_text())
    out = Path(args.out)
    old = out.read_text() if out.is_file() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(results_md(data, args.commit or _commit(), notes))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
