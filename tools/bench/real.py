"""``make bench``'s real-server part: the plugin's cost on ``python -m sglang.launch_server``.

Measured side by side in one run, each as a ratio with the protocol on against off:

1. **ready time**: seconds from launching a server to its first 200 from ``/health`` (a 1-token generation),
   with the plugin and with ``SGLANG_PLUGINS=none``, on the *same* standalone layout-aware
   daemons (``python -m daemon_adapter --enable-eplb``) and the same flags, alternated
   (on, off, off, on, ...) so drift on a shared machine hits both alike;
2. **rebalance wall time**: sglang's own figure, the ``time=`` of EPLB's
   ``[EPLBManager] rebalance end`` log line (logged when the rebalance is not chunked), on a
   server with spawned daemons (``--weight-cache-mode daemon``), with the plugin (every move
   goes through begin/commit on the daemons) and without it.

Servers need about 30 s each to be ready on 2 cores: this part takes a few minutes
(``--real-repeats`` sets how many servers per side); ``--no-real`` skips it.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

from tools.realserver import server as rs
from tools.realserver.model import PROMPTS, build_tiny_qwen3_moe

REBALANCE_TIME = r"TP0[^\]\n]*\] \[EPLBManager\] rebalance end time=([0-9.]+)s"
ITERATIONS = 20


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def _ratio(on: float, off: float) -> float:
    return round(on / off, 3) if off else float("nan")


def _topology(model: Path) -> rs.Topology:
    return rs.Topology(model, tp_size=2, ep_size=2, redundant_experts=2, enable_eplb=True)


def ready_times(model: Path, workdir: Path, repeats: int, step: Any) -> dict[str, Any]:
    run = rs.RunDir(workdir / "ready")
    daemons = rs.StandaloneDaemons(run, _topology(model)).start()
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    try:
        daemons.wait_ready()
        order = [("on", "off") if i % 2 == 0 else ("off", "on") for i in range(repeats)]
        for i, pair in enumerate(order):
            for side in pair:
                spec = rs.ServerSpec(
                    f"ready-{side}-{i}",
                    weight_cache_mode="client",
                    rebalance_iterations=ITERATIONS,
                    layers_per_chunk=1,
                    plugins=None if side == "on" else rs.PROTOCOL_OFF,
                )
                server = rs.RealServer(run, _topology(model), spec).start()
                try:
                    seconds[side].append(round(server.wait_ready(), 2))
                finally:
                    server.stop()
                step(f"  ready time, plugin {side}: {seconds[side][-1]:.1f} s")
    finally:
        daemons.stop()
    on, off = _median(seconds["on"]), _median(seconds["off"])
    return {
        "ready_s_plugin_on": seconds["on"],
        "ready_s_plugin_off": seconds["off"],
        "median_on_s": on,
        "median_off_s": off,
        "ratio_on_to_off": _ratio(on, off),
    }


def rebalance_times(model: Path, workdir: Path, rebalances: int, step: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in ("on", "off"):
        run = rs.RunDir(workdir / f"rebalance-{side}")
        # One chunk (no --eplb-rebalance-layers-per-chunk): sglang then times the whole rebalance.
        spec = rs.ServerSpec(
            f"rebalance-{side}",
            weight_cache_mode="daemon",
            rebalance_iterations=ITERATIONS,
            plugins=None if side == "on" else rs.PROTOCOL_OFF,
        )
        server = rs.RealServer(run, _topology(model), spec).start()
        try:
            server.wait_ready()
            for _ in range(4 * rebalances):
                if len(re.findall(REBALANCE_TIME, server.log_text())) >= rebalances:
                    break
                server.generate(list(PROMPTS), 16)
            times = [float(t) for t in re.findall(REBALANCE_TIME, server.log_text())]
        finally:
            server.stop()
        out[f"rebalance_s_protocol_{side}"] = times
        step(f"  rebalance wall time, protocol {side}: {times}")
    on, off = _median(out["rebalance_s_protocol_on"]), _median(out["rebalance_s_protocol_off"])
    out.update({"median_on_s": on, "median_off_s": off, "ratio_on_to_off": _ratio(on, off)})
    return out


def bench_real_servers(workdir: str, repeats: int, rebalances: int, step: Any) -> dict[str, Any]:
    model = build_tiny_qwen3_moe().resolve()
    root = Path(workdir) / "real"
    t0 = time.monotonic()
    step("real servers: ready time with and without the plugin, on the same standalone daemons")
    ready = ready_times(model, root, repeats, step)
    step("real servers: EPLB rebalance wall time with and without the protocol (spawned daemons)")
    rebalance = rebalance_times(model, root, rebalances, step)
    return {"ready": ready, "rebalance": rebalance, "seconds": round(time.monotonic() - t0, 1)}


def markdown_rows(data: dict[str, Any]) -> list[str]:
    r, b = data["ready"], data["rebalance"]
    return [
        "| real server ready time (launch to the first 200 of `/health`, which generates a token), "
        f"TP2/EP2, same standalone daemons | "
        f"{r['median_on_s']} s with the plugin ({r['ready_s_plugin_on']}) | "
        f"{r['median_off_s']} s with `SGLANG_PLUGINS=none` ({r['ready_s_plugin_off']}) | "
        f"{r['ratio_on_to_off']}x | none |",
        f"| real EPLB rebalance wall time (sglang's `rebalance end time=`), spawned daemons | "
        f"{b['median_on_s']} s with the protocol ({b['rebalance_s_protocol_on']}) | "
        f"{b['median_off_s']} s without ({b['rebalance_s_protocol_off']}) | {b['ratio_on_to_off']}x | none |",
    ]


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.bench.real``: this part alone (``make bench`` runs it after the others)."""
    import argparse
    import json
    import tempfile

    from tools.demo.results import machine

    parser = argparse.ArgumentParser(prog="python -m tools.bench.real", description=__doc__)
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("--real-repeats", type=int, default=1, help="servers per side for the ready time")
    parser.add_argument("--real-rebalances", type=int, default=3, help="rebalances timed per side")
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
