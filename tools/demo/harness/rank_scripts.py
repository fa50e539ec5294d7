"""What each engine rank process runs for the demo (``EngineRanks.run`` scripts).

Module-level functions, so the ``spawn``-started rank processes find them by name. Each one
takes the rank's ``EngineRank`` first and returns plain values (they travel through a pipe).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from tools.harness import toy_moe
from tools.harness.engine_ranks import EngineRank, EngineSpec

# How long a rank parked at a kill point waits for the SIGKILL before giving up.
PARK_S = 120.0


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _adapter_stats() -> dict[str, Any]:
    """What the engine adapter's state says about rebalancing (read-only; {} without the plugin)."""
    try:
        from engine_adapter import state as adapter_state
    except ImportError:
        return {}
    st = adapter_state.get()
    view = None if st.session is None else st.session.view()
    started = view is not None and view.mode is not None
    off = None if view is None else view.off
    return {
        "enabled": adapter_state.enabled(),
        "begins": len(st.counters.timings.get("begin_s", [])),  # one per chunk the protocol began
        "commits": st.counters.chunks_committed,
        "phase": view.rebalance if started else None,
        "off_reason": None if off is None else off.reason.value,
        "off_message": None if off is None else off.message,
        "version": None if view is None or view.outcome is None else view.version,
    }


def start(rank: EngineRank, spec: EngineSpec, load: bool = True) -> dict[str, Any]:
    """An engine incarnation starts (sglang's startup with the plugin's hooks) and loads."""
    t0 = time.perf_counter()
    try:
        rank.start(spec)
    except Exception as exc:  # a startup failure is the outcome some cases expect
        rank.stop()
        return {"started": False, "error": _error(exc), "seconds": time.perf_counter() - t0}
    out: dict[str, Any] = {"started": True, "map": rank.map()}
    if load:
        try:
            out["source"] = rank.load()
        except Exception as exc:  # sglang's loader refuses (config mismatch, layout_refused)
            out["source"] = None
            out["load_error"] = _error(exc)
    out["seconds"] = time.perf_counter() - t0
    return out


def forward(rank: EngineRank, token_ids: Any) -> list[int]:
    """Greedy tokens of the toy MoE, routed by this engine's metadata, on the mapped weights."""
    assert rank.spec is not None
    return toy_moe.forward(rank.spec.cfg, rank.state, rank.metadata(), token_ids, rank.rank)


def report(rank: EngineRank) -> dict[str, Any]:
    """What the engine believes (its map) and what its memory holds (read from the tensors)."""
    meta = rank.metadata()
    digest = hashlib.sha256()
    for name in sorted(rank.state):
        if ".experts." in name:
            digest.update(name.encode())
            digest.update(rank.state[name].contiguous().numpy().tobytes())
    return {
        "map": rank.map(),
        "slots": rank.slots() if rank.state else [],
        "logical_to_all_physical": [] if meta is None else meta.logical_to_all_physical_map_cpu.tolist(),
        "experts_sha256": digest.hexdigest(),
        "source": rank.source,
    }


def rebalance(rank: EngineRank, phase: int) -> dict[str, Any]:
    """One real EPLBManager.rebalance() with the phase's skewed routing statistics."""
    assert rank.spec is not None
    before = rank.map()
    stats_before = _adapter_stats()
    try:
        chunks = rank.rebalance(toy_moe.skewed_logical_count(rank.spec.cfg, phase))
    except Exception as exc:
        return {"error": _error(exc), "moved": False}
    return {
        "chunks": chunks,
        "moved": rank.map() != before,
        "stats_before": stats_before,
        "stats": _adapter_stats(),
    }


def stop(rank: EngineRank) -> bool:
    rank.stop()
    return True


def _park(marker_dir: str, rank: EngineRank, what: str) -> None:
    # Tell the orchestrator this rank is at the kill point, then wait for its SIGKILL.
    with open(os.path.join(marker_dir, f"rank{rank.rank}.{what}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(PARK_S)
    raise TimeoutError(f"rank {rank.rank} parked at {what} for {PARK_S}s without being killed")


def rebalance_until(rank: EngineRank, phase: int, chunks_done: int, marker_dir: str, pending: bool) -> None:
    """Drive the real EPLBManager's rebalance generator to a kill point and park there.

    ``pending=False``: after ``chunks_done`` chunks are committed and before the next begin.
    ``pending=True``: inside chunk ``chunks_done``, after its begin and its move, before its
    commit (the updater's ``update`` is wrapped to park once it has moved the weights).
    The manager must exist: call ``rebalance`` once before.
    """
    assert rank.manager is not None and rank.recorder is not None and rank.spec is not None
    rank.recorder.logical_count = toy_moe.skewed_logical_count(rank.spec.cfg, phase)
    updater = rank.manager._get_expert_location_updater()
    if pending:
        real_update = updater.update
        calls = {"n": 0}

        def update_then_park(*args: Any, **kwargs: Any) -> Any:
            result = real_update(*args, **kwargs)
            calls["n"] += 1
            if calls["n"] == chunks_done + 1:
                _park(marker_dir, rank, "pending")
            return result

        updater.update = update_then_park
    generator = rank.manager.rebalance()
    next(generator)  # parked before the first chunk (EPLBManager yields between chunks)
    for _ in range(chunks_done if not pending else chunks_done + 1):
        next(generator)
    _park(marker_dir, rank, "between")
