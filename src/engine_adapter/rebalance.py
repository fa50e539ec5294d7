"""EPLB rebalance (docs/protocol.md §6): every chunk sglang moves goes through the daemons' two phases.

Two hooks on sglang's ``sglang.srt.eplb.eplb_manager``; every step is the rank's
``EngineSession``'s (``layout_sm.session``), the hooks only send, all-gather and call sglang:

- AROUND ``EPLBManager.rebalance`` (a generator): the session takes the hooks sglang did not apply
  (``engine_adapter.install_check``: rebalancing off); at the first rebalance the ranks all-gather
  where their weights came from (None where the loader hook never saw: unknown); the session's
  step says proceed (through the chunk protocol when it ``shares``, else sglang's own rebalance) or
  stop. A rebalance whose last chunk's check is owed ends with one all-gather of the commit answers.
- AROUND ``update_expert_location_with_recovery`` (called once per chunk): each rank sends the
  session's begin request, then one all-gather of the begin replies and the last chunk's commit
  answers, the session's step (a rank whose begin was ok sends the session's abort when it does
  not move); then sglang's move, unchanged; a device synchronize; each rank sends the session's
  commit request with the new rows and returns: the daemon records it while the engine serves, and
  its reply is read when the next all-gather needs it (this rank's answer in it), with no wait and
  no collective in the chunk.

A step that does not move ends the rebalance in ``_end``, the one off path: pause (the next
rebalance retries) or stop (``disable_rebalance``, sglang's own switch, with the reason logged
once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from sglang.srt.eplb.expert_location import get_global_expert_location_metadata
from sglang.srt.runtime_context import get_device, get_exec

from daemon_adapter import client
from daemon_adapter.trace import trace_engine
from engine_adapter import install_check, metrics, state
from engine_adapter.startup import all_gather, world_cpu_group
from layout_sm.engine import Go, Step
from layout_sm.messages import LayoutRequest, request_wire
from layout_sm.session import EngineSession

logger = logging.getLogger("engine_adapter")


class _StopRebalance(Exception):
    """Ends the current ``EPLBManager.rebalance`` between chunks (pause, disable, failed commit)."""


def _end(st: state.EngineLayoutState, manager: Any, step: Step) -> None:
    """The one way a rebalance ends early: pause (logged; the next one retries) or stop (logged
    once per reason, and sglang's own switch turns EPLB's rebalancing off)."""
    if step.go is Go.STOP:
        st.log_once(int(step.severity), f"rebalance-off:{step.reason.value}", f"[expert-layout] {step.message}")
        manager.disable_rebalance(f"expert-layout: {step.message}")
    else:
        logger.log(int(step.severity), "[expert-layout] %s", step.message)


def around_rebalance(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    if not state.enabled():
        yield from original(manager, *args, **kwargs)
        return
    st = state.get()
    if st.session is None:  # no startup ran (no weight cache, no MoE metadata): never attached
        st.session = EngineSession.never_attached(dist.get_world_size(world_cpu_group()))
        st.trace = trace_engine(st.session, dist.get_rank(world_cpu_group()), None)
    session = st.session
    session.install_checked(st.shared_moves_blocked)  # hooks sglang did not apply: rebalancing is off
    if not session.rebalance_started:
        # Once, at the first rebalance: where every rank's weights came from (None: unknown).
        sources = all_gather(st.weights_source)
        session.start_rebalance(sources, elastic_ep=get_exec().moe.elastic_ep_backend is not None)
    step = session.rebalance()
    if step.go is not Go.PROCEED:
        _end(st, manager, step)
        return
    st.active_manager = manager if session.shares else None  # None: sglang's own rebalance, no protocol
    stopped = False
    try:
        yield from original(manager, *args, **kwargs)
    except _StopRebalance:
        stopped = True
    finally:
        st.active_manager = None
        take_commit_reply(st)
        metrics.rebalance_ended()
    if session.owes_check and not stopped:
        # The last chunk's commits were checked by no chunk's begin: this rebalance's one more all-gather.
        step = session.verify(all_gather(session.owed_answer(st.rank)))
        if step.go is not Go.PROCEED:
            _end(st, manager, step)
    _trace_end(st)


def _trace_end(st: state.EngineLayoutState) -> None:
    """The trace's mark of a rebalance's end: no check of a commit may be owed past it."""
    if st.trace is not None:
        st.trace.rebalance_end()


def ask_daemon(st: state.EngineLayoutState, request: LayoutRequest) -> Any:
    """One request to this rank's daemon; None when it cannot be reached (counts as refused)."""
    return send_to_daemon(st, request)()


def send_to_daemon(st: state.EngineLayoutState, request: LayoutRequest) -> Callable[[], Any]:
    """Send one request to this rank's daemon now; the call returned reads its reply (None when the
    daemon cannot be reached or answers nothing: counts as refused)."""
    assert st.socket_path is not None
    try:
        sent = client.send_request(st.socket_path, request_wire(request))
    except Exception as error:
        _unreachable(st, error)
        return lambda: None

    def read() -> Any:
        try:
            return sent.read()
        except Exception as error:
            _unreachable(st, error)
            return None

    return read


def _unreachable(st: state.EngineLayoutState, error: Exception) -> None:
    logger.warning("[expert-layout] rank %s: daemon at %s unreachable: %r", st.rank, st.socket_path, error)


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
    take_commit_reply(st)
    session.begin_chunk([int(layer) for layer in kwargs["update_layer_ids"]])
    # One all-gather per chunk: this chunk's begin replies and the last chunk's commit answers.
    gathered = all_gather((ask_daemon(st, session.begin_request(rank)), session.owed_answer(rank)))
    begins = [begin for begin, _ in gathered]
    step = session.begun_all(begins, owed=[owed for _, owed in gathered])
    abort = session.abort_request(rank)  # None unless the chunk does not go on and this rank began it
    if abort is not None:
        ask_daemon(st, abort)
    session.aborted_all()  # each rank aborts its own move, on the same replies
    st.counters.record_time("begin_s", time.perf_counter() - t0)
    metrics.protocol_time(time.perf_counter() - t0)
    metrics.chunk_begun(step.go, begins, rank)
    if step.go is not Go.PROCEED:
        _end(st, manager, step)
        raise _StopRebalance

    t1 = time.perf_counter()
    result = original(*args, **kwargs)
    # The moved weights must have landed before any other engine can be served them.
    torch.get_device_module(get_device().device).synchronize()
    t2 = time.perf_counter()

    # The commit goes out with the chunk's rows; the engine's whole map is read, checked and hashed
    # while the daemon records it (session.commit_request: the same steps, in the same order). Its
    # reply is read by the next all-gather's caller: sglang's move already routes with the moved map,
    # which is what the daemon's memory holds, whatever the daemon answers.
    moved_map = get_global_expert_location_metadata().physical_to_logical_map_cpu
    chunk = session.view().chunk
    read_reply = send_to_daemon(st, session.commit_request(rank, {layer: moved_map[layer].tolist() for layer in chunk}))
    try:
        session.moved(moved_map.tolist())
    except BaseException:
        read_reply()  # read (and closed) when the map is refused
        raise
    st.commit_reply = read_reply
    st.counters.record_time("move_s", t2 - t1)
    st.counters.record_time("commit_s", time.perf_counter() - t2)
    metrics.protocol_time(time.perf_counter() - t2)
    return result


def take_commit_reply(st: state.EngineLayoutState) -> None:
    """The last chunk's commit reply, read (the daemon answered it while the engine served) and taken
    by the session: the chunk ends, with no collective, and this rank's answer goes into the next
    all-gather (the next chunk's begin, or the rebalance's end)."""
    read, st.commit_reply = st.commit_reply, None
    if read is None:
        return
    session, rank = st.session, st.rank
    assert session is not None and rank is not None
    session.committed(rank, read())
    session.chunk_committed()
    answer = session.owed_answer(rank)
    if answer is not None and answer.ok:  # this rank's daemon recorded it; the next all-gather checks all
        st.counters.chunks_committed += 1
        metrics.committed(session.view().version)
