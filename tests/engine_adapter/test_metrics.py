"""The plugin's series (engine_adapter.metrics) after real protocol events: 2 engine rank processes
with sglang's real EPLBManager on layout-aware daemons, sglang's metrics on (``enable_metrics``).

Counters only grow within a process (the pool outlives tests), so each step is read as a change.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import ea_scripts
from ea_helpers import OtherEngine
from prometheus_client.parser import text_string_to_metric_families

P = "sglang:expert_layout_"


def _ok(results):
    assert all(r.ok for r in results), [r.trace or r.error for r in results]
    return [r.value for r in results]


def _series(text: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def _value(text: str, name: str, rank: int, **labels: str) -> float:
    want = {"tp_rank": str(rank), "moe_ep_rank": str(rank), **labels}
    found = [v for (n, ls), v in _series(text).items() if n == name and want.items() <= dict(ls).items()]
    return sum(found)


def _delta(before: list[dict], after: list[dict], name: str, **labels: str) -> list[float]:
    return [
        _value(a["metrics"], name, rank, **labels) - _value(b["metrics"], name, rank, **labels)
        for rank, (b, a) in enumerate(zip(before, after, strict=True))
    ]


def test_series_after_startup_rebalance_pause_refusal_and_dirty(ranks, daemons, cache_configs):
    d = daemons()
    cfg = d.cfg
    spec = ea_scripts.spec(d.sockets, enable_metrics=True)
    start = _ok(ranks.run(ea_scripts.start_load_metrics, spec))
    for rank, s in enumerate(start):
        labels = dict(
            next(
                ls
                for (n, ls) in _series(s["metrics"])
                if n == f"{P}record_version" and dict(ls)["tp_rank"] == str(rank)
            )
        )
        assert {"model_name", "tp_rank", "pp_rank", "moe_ep_rank"} <= labels.keys()  # sglang's labels
        assert _value(s["metrics"], f"{P}record_version", rank) == 0
        assert _value(s["metrics"], f"{P}hooks_missing", rank) == 0
        assert _value(s["metrics"], f"{P}startups_total", rank, outcome="keep_own", reason="initial") >= 1

    moved = _ok(ranks.run(ea_scripts.rebalance_metrics, 1))
    assert _delta(start, moved, f"{P}chunks_committed_total") == [cfg.num_layers] * 2
    assert [_value(m["metrics"], f"{P}record_version", r) for r, m in enumerate(moved)] == [cfg.num_layers] * 2
    assert _delta(start, moved, f"{P}rebalance_protocol_seconds_count") == [1, 1]
    assert all(x > 0 for x in _delta(start, moved, f"{P}rebalance_protocol_seconds_sum"))

    standby = OtherEngine(d.paths[1:], engine_id="engine-standby")  # rank 1's daemon is busy
    paused = _ok(ranks.run(ea_scripts.rebalance_metrics, 2))
    assert [p["chunks_committed"] for p in paused] == [m["chunks_committed"] for m in moved]  # none more
    assert _delta(moved, paused, f"{P}rebalances_paused_total", reason="other_engine_attached") == [1, 1]
    assert _delta(moved, paused, f"{P}chunks_committed_total") == [0, 0]
    standby.detach()

    ranks.run(ea_scripts.stop)

    # New daemons at version 0; an engine without the plugin fetched rank 0's weights there: that
    # daemon refuses every begin now (counted on rank 0, whose daemon refused).
    fresh = daemons()
    again = _ok(ranks.run(ea_scripts.start_load_metrics, ea_scripts.spec(fresh.sockets, enable_metrics=True)))
    served = _fetch_without_claim(fresh, cache_configs, 0)
    assert served["status"] == "ok"
    refused = _ok(ranks.run(ea_scripts.rebalance_metrics, 3))
    assert all(r["phase"] == "off" for r in refused)
    assert _delta(again, refused, f"{P}begins_refused_total", reason="non_following_seen") == [1, 0]
    ranks.run(ea_scripts.stop)

    # A mover left mid-move: both daemons dirty; the next startup fails and counts it.
    dirty = daemons()
    other = OtherEngine(dirty.paths)
    assert all(r["status"] == "ok" for r in other.begin([0]))
    other.detach()
    failed = _ok(ranks.run(ea_scripts.start_failing_metrics, ea_scripts.spec(dirty.sockets, enable_metrics=True)))
    assert all(f["error"] is not None and "dirty" in f["error"] for f in failed)
    assert _delta(refused, failed, f"{P}dirty_seen_total") == [1, 1]
    assert _delta(refused, failed, f"{P}startups_total", outcome="fail", reason="dirty") == [1, 1]
    ranks.run(ea_scripts.stop)


def _fetch_without_claim(d, cache_configs, rank: int) -> dict:
    from tools.harness import daemon_proc

    return daemon_proc.request(d.paths[rank], {"type": "fetch_state", "config": cache_configs[rank]})


def test_no_series_without_sglang_metrics(ranks, daemons):
    d = daemons()
    out = _ok(ranks.run(ea_scripts.start_load_metrics, ea_scripts.spec(d.sockets)))
    ranks.run(ea_scripts.stop)
    # The pool may hold series from a test with metrics on; none is made here, and none recorded.
    for o in out:
        assert o["kind"] == "keep_own"
    assert _ok(ranks.run(ea_scripts_active)) == [False, False]


def ea_scripts_active(rank) -> bool:
    from engine_adapter import metrics

    return metrics.active() is not None


CHUNK = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[1])
    from engine_adapter import metrics
    metrics.use(metrics.EngineMetrics({"model_name": "m", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}))
    sys.path.insert(0, sys.argv[2])
    from tools.bench.metrics import _chunk
    _chunk()  # what the chunk hook and the session's metrics observer call per chunk
    print(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    """
)


def test_chunk_series_go_to_sglangs_per_process_files(tmp_path):
    """A fresh interpreter in prometheus_client's multiprocess mode, as sglang runs it. What the calls
    cost per chunk is `make bench`'s metrics row (against the same calls with metrics off)."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    argv = [sys.executable, "-c", CHUNK, src, repo]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path) and os.listdir(tmp_path)  # the series went to per-process files
