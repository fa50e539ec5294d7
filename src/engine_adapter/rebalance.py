"""EPLB rebalance (docs/protocol.md §6): every chunk sglang moves goes through the daemons' two phases.

Two hooks on sglang's ``sglang.srt.eplb.eplb_manager``:

- AROUND ``EPLBManager.rebalance`` (a generator): at the first rebalance the ranks all-gather
  where their weights came from and ``rebalance_mode`` picks sglang's own rebalance (disk
  everywhere), the chunk protocol (shared weights), or none (``disable_rebalance``, sglang's own
  switch, with the reason logged once). A paused or stopped rebalance ends here, quietly.
- AROUND ``update_expert_location_with_recovery`` (called once per chunk): begin on every rank,
  all-gather, ``chunk_decision``; then sglang's move, unchanged; a device synchronize; commit on
  every rank, all-gather, ``verify_commits``. ``RebalanceMachine`` holds the phase; ``off`` is for
  good.
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
from engine_adapter import state
from engine_adapter.startup import world_cpu_group
from layout_sm.engine import RebalanceMachine, chunk_decision, rebalance_mode, verify_commits
from layout_sm.messages import abort_request, begin_request, commit_request

logger = logging.getLogger("engine_adapter")


class _StopRebalance(Exception):
    """Ends the current ``EPLBManager.rebalance`` between chunks (pause, disable, failed commit)."""


def _all_gather(obj: Any) -> list[Any]:
    group = world_cpu_group()
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _machine(st: state.EngineLayoutState) -> RebalanceMachine:
    if st.rebalance_mode is None:
        sources = _all_gather(st.weights_source or "disk")
        elastic = get_exec().moe.elastic_ep_backend is not None
        st.rebalance_mode = rebalance_mode(st.startup, sources, elastic_ep=elastic)
        st.machine = RebalanceMachine()
        st.machine.send("start", mode=st.rebalance_mode)
    return st.machine


def _turn_off(st: state.EngineLayoutState, manager: Any, level: int) -> None:
    machine = st.machine
    reason = machine.off_reason or "off"
    message = machine.off_message or "rebalancing of shared weights is off"
    st.log_once(level, f"rebalance-off:{reason}", f"[expert-layout] {message}")
    manager.disable_rebalance(f"expert-layout: {message}")


def around_rebalance(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    st = state.get()
    if not st.enabled:
        yield from original(manager, *args, **kwargs)
        return
    machine = _machine(st)
    if machine.phase == "off":
        _turn_off(st, manager, logging.WARNING)
        return
    if machine.phase == "local":
        machine.send("local_rebalance")
        yield from original(manager, *args, **kwargs)
        return
    st.active_manager = manager
    try:
        yield from original(manager, *args, **kwargs)
    except _StopRebalance:
        return
    finally:
        st.active_manager = None


def _ask(st: state.EngineLayoutState, msg: dict[str, Any]) -> Any:
    """One request to this rank's daemon; None when it cannot be reached (counts as refused)."""
    assert st.socket_path is not None
    try:
        return client.request(st.socket_path, msg)
    except Exception as error:
        logger.warning("[expert-layout] rank %s: daemon at %s unreachable: %r", st.rank, st.socket_path, error)
        return None


def around_update_expert_location_with_recovery(original: Any, *args: Any, **kwargs: Any) -> Any:
    st = state.get()
    manager = st.active_manager
    if manager is None:  # sglang's own rebalance (disk weights) or another caller
        return original(*args, **kwargs)
    machine = st.machine
    layers = [int(layer) for layer in kwargs["update_layer_ids"]]
    assert st.engine_id is not None and st.session is not None and st.version is not None

    t0 = time.perf_counter()
    machine.send("chunk")
    begun = _all_gather(_ask(st, begin_request(st.engine_id, st.session, st.version, layers)))
    decision = chunk_decision(begun)
    if st.rank in decision.abort_ranks:
        _ask(st, abort_request(st.engine_id, st.session))
    machine.send("begun", decision=decision)
    st.record_time("begin_s", time.perf_counter() - t0)
    if decision.kind == "pause":
        logger.info("[expert-layout] %s", decision.message)
        raise _StopRebalance
    if machine.phase == "off":
        _turn_off(st, manager, logging.WARNING)
        raise _StopRebalance

    t1 = time.perf_counter()
    result = original(*args, **kwargs)
    # The moved weights must have landed before any other engine can be served them.
    torch.get_device_module(get_device().device).synchronize()
    machine.send("moved")
    t2 = time.perf_counter()

    engine_rows = get_global_expert_location_metadata().physical_to_logical_map_cpu.tolist()
    rows = [engine_rows[layer] for layer in layers]
    committed = _all_gather(_ask(st, commit_request(st.engine_id, st.session, layers, rows)))
    verdict = verify_commits(committed, engine_rows, expected_version=st.version + 1)
    machine.send("committed", verdict=verdict)
    st.record_time("move_s", t2 - t1)
    st.record_time("commit_s", time.perf_counter() - t2)
    if not verdict.ok:
        st.log_once(logging.ERROR, "rebalance-off:commit", f"[expert-layout] {verdict.message}")
        manager.disable_rebalance(f"expert-layout: {verdict.message}")
        raise _StopRebalance
    st.version, st.digest = verdict.version, verdict.digest
    st.chunks_committed += 1
    return result
