"""``make bench``'s real-server part: the plugin's cost on ``python -m sglang.launch_server``.

Measured side by side in one run, each as a ratio with the protocol on against off:

1. **ready time**: seconds from launching a server to its first answered ``/health_generate``,
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

import os
import re
import statistics
import time
from typing import Any

from expert_layout_demo.real import servers
from expert_layout_demo.real.lab import PROMPTS, Chain

REBALANCE_TIME = r"\[EPLBManager\] rebalance end time=([0-9.]+)s"


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3) if values else float("nan")


def _ratio(on: float, off: float) -> float:
    return round(on / off, 3) if off else float("nan")


def ready_times(model: str, workdir: str, repeats: int, step: Any) -> dict[str, Any]:
    chain = Chain("bench-ready", os.path.join(workdir, "sockets-ready"))
    os.makedirs(chain.socket_dir, exist_ok=True)
    daemons = servers.start_daemons(
        model, layout_aware=True, enable_eplb=True, env=chain.env, log_path=os.path.join(workdir, "daemons-ready.log")
    )
    seconds: dict[str, list[float]] = {"on": [], "off": []}
    try:
        order = [("on", "off") if i % 2 == 0 else ("off", "on") for i in range(repeats)]
        for i, pair in enumerate(order):
            for side in pair:
                server = servers.start_server(
                    f"bench-ready-{side}-{i}",
                    model,
                    plugin=side == "on",
                    weight_cache="client",
                    enable_eplb=True,
                    init_expert_location=None,
                    env=chain.env,
                    log_path=os.path.join(workdir, f"server-ready-{side}-{i}.log"),
                )
                seconds[side].append(round(server.ready_s, 2))
                step(f"  ready time, plugin {side}: {server.ready_s:.1f} s")
                server.stop()
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


def rebalance_times(model: str, workdir: str, rebalances: int, step: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for side in ("on", "off"):
        chain = Chain(f"bench-rebalance-{side}", os.path.join(workdir, f"sockets-rebalance-{side}"))
        os.makedirs(chain.socket_dir, exist_ok=True)
        server = servers.start_server(
            f"bench-rebalance-{side}",
            model,
            plugin=side == "on",
            weight_cache="daemon",
            enable_eplb=True,
            init_expert_location=None,
            env=chain.env,
            log_path=os.path.join(workdir, f"server-rebalance-{side}.log"),
            chunked=False,  # one chunk: sglang then times the whole rebalance itself
        )
        try:
            deadline = time.monotonic() + 180
            i = 0
            while len(re.findall(REBALANCE_TIME, server.log_text())) < rebalances and time.monotonic() < deadline:
                server.generate(PROMPTS[i % len(PROMPTS)], 16)
                i += 1
            times = [float(t) for t in re.findall(REBALANCE_TIME, server.log_text())]
        finally:
            server.stop()
        out[f"rebalance_s_protocol_{side}"] = times
        step(f"  rebalance wall time, protocol {side}: {times}")
    on, off = _median(out["rebalance_s_protocol_on"]), _median(out["rebalance_s_protocol_off"])
    out.update({"median_on_s": on, "median_off_s": off, "ratio_on_to_off": _ratio(on, off)})
    return out


def bench_real_servers(workdir: str, repeats: int, rebalances: int, step: Any) -> dict[str, Any]:
    model = servers.model_dir()
    t0 = time.monotonic()
    step("real servers: ready time with and without the plugin, on the same standalone daemons")
    ready = ready_times(model, workdir, repeats, step)
    step("real servers: EPLB rebalance wall time with and without the protocol (spawned daemons)")
    rebalance = rebalance_times(model, workdir, rebalances, step)
    return {
        "ready": ready,
        "rebalance": rebalance,
        "seconds": round(time.monotonic() - t0, 1),
        "servers": servers.timings(),
    }


def markdown_rows(data: dict[str, Any]) -> list[str]:
    r, b = data["ready"], data["rebalance"]
    return [
        f"| real server ready time (launch to first `/health_generate`), TP2/EP2, same standalone daemons | "
        f"{r['median_on_s']} s with the plugin ({r['ready_s_plugin_on']}) | "
        f"{r['median_off_s']} s with `SGLANG_PLUGINS=none` ({r['ready_s_plugin_off']}) | "
        f"{r['ratio_on_to_off']}x | none |",
        f"| real EPLB rebalance wall time (sglang's `rebalance end time=`), spawned daemons | "
        f"{b['median_on_s']} s with the protocol ({b['rebalance_s_protocol_on']}) | "
        f"{b['median_off_s']} s without ({b['rebalance_s_protocol_off']}) | {b['ratio_on_to_off']}x | none |",
    ]
