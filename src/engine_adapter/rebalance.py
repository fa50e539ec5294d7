"""EPLB rebalance (docs/protocol.md §6): every chunk sglang moves goes through the daemons' two phases.

Two hooks on sglang's ``sglang.srt.eplb.eplb_manager``; every step is the rank's
``EngineSession``'s (``layout_sm.session``), the hooks only send, all-gather and call sglang:

- AROUND ``EPLBManager.rebalance`` (a generator): at the first rebalance the ranks all-gather
  where their weights came from and the session picks sglang's own rebalance (disk everywhere),
  the chunk protocol (shared weights), or none (``disable_rebalance``, sglang's own switch, with
  the reason logged once). A paused or stopped rebalance ends here, quietly.
- AROUND ``update_expert_location_with_recovery`` (called once per chunk): each rank sends the
  session's begin request, all-gather, the session decides (move, or abort the begun ranks and
  pause or switch off); then sglang's move, unchanged; a device synchronize; each rank sends the
  session's commit request with the new rows, all-gather, the session verifies.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist
from sglang.srt.eplb.expert_location import get_global_expert_location_metadata
from sglang.srt.runtime_context import get_device, get_exec

from daemon_adapter import client
from engine_adapter import install_check, metrics, state
from engine_adapter.startup import world_cpu_group
from layout_sm.messages import LayoutRequest, request_wire
from layout_sm.session import EngineSession

logger = logging.getLogger("engine_adapter")


class _StopRebalance(Exception):
    """Ends the current ``EPLBManager.rebalance`` between chunks (pause, disable, failed commit)."""


def _all_gather(obj: Any) -> list[Any]:
    group = world_cpu_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _turn_off(st: state.EngineLayoutState, session: EngineSession, manager: Any, level: int) -> None:
    off = session.view().off
    reason = "off" if off is None else off.reason.value
    message = "rebalancing of shared weights is off" if off is None else off.message
    st.log_once(level, f"rebalance-off:{reason}", f"[expert-layout] {message}")
    manager.disable_rebalance(f"expert-layout: {message}")


def around_rebalance(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    if not state.enabled():
        yield from original(manager, *args, **kwargs)
        return
    st = state.get()
    if install_check.stop_rebalance(st, manager):  # sglang did not apply every hook: no moves at all
        return
    if st.session is None:  # no startup ran (no weight cache, no daemon at all): never attached
        st.session = EngineSession("", dist.get_world_size(world_cpu_group()), None)
    session = st.session
    if not session.rebalance_started:
        # Once, at the first rebalance: where every rank's weights came from.
        sources = _all_gather(st.weights_source or "disk")
        session.start_rebalance(sources, elastic_ep=get_exec().moe.elastic_ep_backend is not None)
    run = session.rebalance()
    if run == "off":
        _turn_off(st, session, manager, logging.WARNING)
        return
    if run == "local":
        yield from original(manager, *args, **kwargs)
        return
    st.active_manager = manager
    try:
        yield from original(manager, *args, **kwargs)
    except _StopRebalance:
        return
    finally:
        st.active_manager = None
        metrics.rebalance_ended()


def _ask(st: state.EngineLayoutState, request: LayoutRequest) -> Any:
    """One request to this rank's daemon; None when it cannot be reached (counts as refused)."""
    assert st.socket_path is not None
    try:
        return client.request(st.socket_path, request_wire(request))
    except Exception as error:
        logger.warning("[expert-layout] rank %s: daemon at %s unreachable: %r", st.rank, st.socket_path, error)
        return None


def around_update_expert_location_with_recovery(original: Any, *args: Any, **kwargs: Any) -> Any:
    st = state.get()
    manager = st.active_manager
    if manager is None:  # sglang's own rebalance (disk weights) or another caller
        if install_check.skip_unprotected_move(st):  # or sglang's, its rebalance hook missing
            return None
        return original(*args, **kwargs)
    session, rank = st.session, st.rank
    assert session is not None and rank is not None

    t0 = time.perf_counter()
    session.begin_chunk([int(layer) for layer in kwargs["update_layer_ids"]])
    begins = _all_gather(_ask(st, session.begin_request(rank)))
    decision = session.begun_all(begins)
    if rank in decision.abort_ranks:
        _ask(st, session.abort_request(rank))
    for begun in decision.abort_ranks:  # each rank aborts its own move, on the same decision
        session.aborted(begun)
    st.counters.record_time("begin_s", time.perf_counter() - t0)
    metrics.protocol_time(time.perf_counter() - t0)
    metrics.chunk_begun(decision.kind, begins, rank)
    if decision.kind == "pause":
        logger.info("[expert-layout] %s", decision.message)
        raise _StopRebalance
    if decision.kind == "disable":
        _turn_off(st, session, manager, logging.WARNING)
        raise _StopRebalance

    t1 = time.perf_counter()
    result = original(*args, **kwargs)
    # The moved weights must have landed before any other engine can be served them.
    torch.get_device_module(get_device().device).synchronize()
    session.moved(get_global_expert_location_metadata().physical_to_logical_map_cpu.tolist())
    t2 = time.perf_counter()

    verdict = session.committed_all(_all_gather(_ask(st, session.commit_request(rank))))
    st.counters.record_time("move_s", t2 - t1)
    st.counters.record_time("commit_s", time.perf_counter() - t2)
    metrics.protocol_time(time.perf_counter() - t2)
    if not verdict.ok:
        st.log_once(logging.ERROR, "rebalance-off:commit", f"[expert-layout] {verdict.message}")
        manager.disable_rebalance(f"expert-layout: {verdict.message}")
        raise _StopRebalance
    st.counters.chunks_committed += 1
    metrics.committed(verdict.version)
    return result
