"""The engine adapter's metrics calls per chunk (``engine_adapter.metrics``), on against off.

A rebalance chunk calls ``protocol_time`` once, and the session tells its metrics observer
(``metrics.ChunkWatch``) of each machine event of the chunk (the chunk, every rank's begin answer, the
decision, the move, this rank's commit answer, the chunk's end). With sglang's metrics off each call
returns at once: that is the floor, timed in the same process right before.
The calls run in a fresh interpreter in prometheus_client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``), as sglang runs them, where every update writes to a per-process file.

    python -m tools.bench.metrics    (the child: prints one JSON line; ``bench_metrics`` starts it)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine_adapter import metrics
from layout_sm.engine import RankAnswer, Step
from layout_sm.reasons import Reason, Status

ROOT = Path(__file__).resolve().parents[2]
BEGUN = RankAnswer(Status.OK, text="begun", reason="begun")
COMMITTED = RankAnswer(Status.OK, 7, "d" * 64, "committed", "committed")
PROCEED = Step.proceed(Reason.BEGUN, "every daemon accepted the move")
# A two-rank chunk that moves, as rank 0's session tells its observers: (event, its arguments, its result).
CHUNK_EVENTS: list[tuple[str, dict[str, Any], Any]] = [
    ("chunk", {"layers": (0,)}, None),
    ("begin", {"rank": 0, "answer": BEGUN, "owed": None}, None),
    ("begin", {"rank": 1, "answer": BEGUN, "owed": None}, None),
    ("decide", {}, PROCEED),
    ("move", {"rows": ()}, None),
    ("commit", {"rank": 0, "answer": COMMITTED}, None),
    ("committed", {}, PROCEED),
]
WATCH = metrics.ChunkWatch(0)


def _chunk() -> None:
    """What the metrics add to one chunk that moves."""
    metrics.protocol_time(0.002)
    for event, arguments, result in CHUNK_EVENTS:
        WATCH(event, arguments, result, None)


def _per_chunk_ns(n: int, rounds: int = 5) -> float:
    """The best of ``rounds`` loops of ``n`` chunks: the calls are sub-microsecond, so a loop, not a median."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            _chunk()
        best = min(best, (time.perf_counter_ns() - t0) / n)
    return best


def measure(n: int) -> dict[str, Any]:
    """In this process: the calls with metrics off (the floor), then on."""
    metrics.use(None)
    off = _per_chunk_ns(n)
    metrics.use(metrics.EngineMetrics({"model_name": "m", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}))
    on = _per_chunk_ns(n)
    metrics.use(None)
    return {"off_ns": round(off, 1), "on_ns": round(on, 1)}


def bench_metrics(workdir: str, n: int = 20000) -> dict[str, Any]:
    """The per-chunk cost in a fresh interpreter in multiprocess mode; the ratio on to off beside it."""
    files = Path(workdir) / "prometheus-multiproc"
    files.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(files), "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.metrics", str(n)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the metrics bench failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["multiprocess_files"] = len(list(files.iterdir()))
    out["ratio_on_to_off"] = round(out["on_ns"] / out["off_ns"], 1)
    return out


def add_chunk_share(out: dict[str, Any], chunk_us: float) -> None:
    """What the calls add to a chunk measured in the same run (begin + commit on 2 ranks)."""
    out["chunk_us"] = chunk_us
    out["share_of_chunk"] = round((out["on_ns"] - out["off_ns"]) / (1000 * chunk_us), 5)


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)))
