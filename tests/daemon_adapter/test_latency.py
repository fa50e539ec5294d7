"""Request latency of the layout-aware daemon against sglang's plain daemon (one connection
per request, as sglang's clients do). Printed with ``-s``; the bound only catches a daemon
that stalls (a lock held across I/O, a blocked serve loop)."""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, fetch_state, query

ROUNDS = 150
STALL_BOUND_S = 0.25


def _timings(action: Callable[[], object]) -> tuple[float, float]:
    samples = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))]


def test_request_latency(make_daemon):
    import torch

    from layout_testkit.daemon_proc import request

    tensors = {f"w{i}": torch.zeros(64) for i in range(32)}
    aware = make_daemon("aware", tensors=tensors)
    plain = make_daemon("plain", tensors=tensors, plain_sglang=True)
    engine = Engine(aware.socket_path, "A")
    engine.attach()
    digest = layout_digest(INITIAL_MAP)

    def begin_abort() -> None:
        assert engine.begin([0])["status"] == "ok"
        assert engine.abort()["status"] == "ok"

    counter = itertools.count()

    def attach_detach() -> None:
        other = Engine(aware.socket_path, f"B{next(counter)}")
        other.attach()
        other.detach()

    results = {
        "ping (plain sglang)": _timings(lambda: request(plain.socket_path, {"type": "ping"})),
        "ping (layout-aware)": _timings(lambda: request(aware.socket_path, {"type": "ping"})),
        "fetch_state 32 tensors (plain sglang)": _timings(lambda: fetch_state(plain.socket_path)),
        "fetch_state 32 tensors + layout check": _timings(lambda: engine.fetch(0, digest)),
        "expert_layout_query": _timings(lambda: query(aware.socket_path)),
        "begin + abort (2 requests)": _timings(begin_abort),
        "attach (+ close)": _timings(attach_detach),
    }
    print()
    for name, (median, p99) in results.items():
        print(f"{name:40s} median {median * 1e3:6.2f} ms   p99 {p99 * 1e3:6.2f} ms")
    assert all(median < STALL_BOUND_S for median, _ in results.values()), results
