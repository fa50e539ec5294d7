"""The engine adapter's one loop: a rank carries out what its session says to do next (``layout_sm.ready``).

Each ``Ready`` is executed in its order: close the attachment, install a map, then its one action
(a request to this rank's daemon, an all-gather over every rank, sglang's move, a wait for the
notice), whose outcome goes back to the session as the event the ``Ready`` names; and so on until a
``Ready`` has nothing more to hand back. The loop decides nothing: it only does I/O and calls
sglang. A request whose reply is read later (a chunk's commit) is sent and left; its reply is read,
and handed to the session, before the rank's next step (``flush``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from sglang.srt.eplb.expert_location import ExpertLocationMetadata, get_global_expert_location_metadata
from sglang.srt.runtime_context import get_device, get_parallel

from daemon_adapter import client
from engine_adapter import state
from engine_adapter.collective import all_gather
from layout_sm.messages import FETCH_CLAIMS_FIELD, LayoutRequest, request_wire
from layout_sm.ready import NOTHING, Event, Moved, Ready, Unanswered

logger = logging.getLogger("engine_adapter")


def run(ready: Ready, move: Callable[[], Any] | None = None) -> Ready:
    """Carry out ``ready`` and whatever the session says after it; the last ``Ready`` that said how the
    sequence ended (its ``done``; ``NOTHING`` when none did). ``move``: sglang's move of the chunk (its
    result is kept in ``state.get().move_result``)."""
    st = state.get()
    assert st.session is not None
    session = st.session
    done = NOTHING
    while True:
        if ready.close and st.attachment is not None:
            st.attachment.close()
            st.attachment = None
        if ready.install is not None:
            install(ready.install)
            if st.trace is not None:
                metadata = get_global_expert_location_metadata()
                if metadata is not None:
                    st.trace.routes(metadata.physical_to_logical_map_cpu.tolist())
        if ready.done is not None:
            if done.done is not None:  # a step the sequence went past: said, as the operator reads it
                logger.log(int(done.done.severity), "[expert-layout] rank %s: %s", st.rank, done.done.message)
            done = ready
        try:
            event = _act(st, ready, move) or ready.next
            if event is None:
                return done
            following = session.step(event)
            if isinstance(event, Moved) and st.trace is not None:  # the map sglang routes with after its move
                st.trace.routes(event.rows)
        except Exception as error:
            if ready.on_error is None:
                raise
            following = session.step(ready.on_error(repr(error)))
        ready = following


def flush() -> Ready:
    """The reply of a request sent earlier and not read yet (a chunk's commit), handed to the session,
    and what it says after it: before anything else of this rank's."""
    st = state.get()
    pending, st.pending_reply = st.pending_reply, None
    if pending is None:
        return NOTHING
    read, then = pending
    assert st.session is not None
    return run(st.session.step(then(read(), time.monotonic())))


def _act(st: state.EngineLayoutState, ready: Ready, move: Callable[[], Any] | None) -> Event | None:
    then = ready.then
    if ready.send is not None:
        if ready.forget_notices and st.standby is not None:
            st.standby.noticed.clear()
        if ready.after_s:
            time.sleep(ready.after_s)
        if ready.attach:
            reply = _attach(st, ready.send)
        elif ready.read_later:
            assert then is not None, "a reply read later goes back to the session"
            st.pending_reply = (_send(st, ready.send), then)
            return None
        else:
            reply = _send(st, ready.send)()
        return None if then is None else then(reply, time.monotonic())
    if ready.gathers:
        assert then is not None
        return then(all_gather(ready.gather), time.monotonic())
    if ready.move:
        assert then is not None and move is not None, "sglang's move runs inside its own call"
        started = time.perf_counter()
        st.move_result = move()
        # The moved weights must have landed before any other engine can be served them.
        torch.get_device_module(get_device().device).synchronize()
        st.moved_at = (started, time.perf_counter())
        rows = get_global_expert_location_metadata().physical_to_logical_map_cpu.tolist()
        return then(rows, time.monotonic())
    if ready.await_notice_s is not None:
        assert then is not None and st.standby is not None
        return then(st.standby.noticed.wait(ready.await_notice_s), time.monotonic())
    return None


def _attach(st: state.EngineLayoutState, request: LayoutRequest) -> object:
    """The attach, over the connection that stays open as the attachment; its reply, or why none came."""
    assert st.socket_path is not None
    # fetch_claims: this process sends its claim with every fetch_state (the daemon refuses one without)
    try:
        st.attachment = client.Attachment(st.socket_path, {**request_wire(request), FETCH_CLAIMS_FIELD: True})
    except client.DaemonAbsent as error:  # sglang's loader then loads from disk: no record either
        return Unanswered(str(error), absent=True)
    except Exception as error:
        return Unanswered(f"the attach was not answered ({error!r})")
    return st.attachment.reply


def _send(st: state.EngineLayoutState, request: LayoutRequest) -> Callable[[], object]:
    """Send one request to this rank's daemon now; the call returned reads its reply (``Unanswered`` when
    the daemon cannot be reached or answers nothing)."""
    assert st.socket_path is not None
    wire = request_wire(request)
    kind = wire["type"]
    try:
        sent = client.send_request(st.socket_path, wire)
    except Exception as error:
        unanswered = _unanswered(st, kind, error)
        return lambda: unanswered

    def read() -> object:
        try:
            return sent.read()
        except Exception as error:
            return _unanswered(st, kind, error)

    return read


def _unanswered(st: state.EngineLayoutState, kind: str, error: Exception) -> Unanswered:
    logger.warning("[expert-layout] rank %s: daemon at %s unreachable: %r", st.rank, st.socket_path, error)
    return Unanswered(f"its {kind} was not answered ({error!r})")


def install(rows: Any) -> None:
    """Route with ``rows``: sglang's ``ExpertLocationMetadata`` built from it, copied into the live
    metadata in place, as EPLB's updater does (the recorder and dispatch hold this very object)."""
    metadata = get_global_expert_location_metadata()
    if metadata is None:
        return
    adopted = ExpertLocationMetadata.init_by_mapping(
        state.get().model_config, torch.tensor(rows, dtype=torch.int64), moe_ep_rank=get_parallel().moe_ep_rank
    )
    metadata.update(adopted, update_layer_ids=list(range(metadata.num_layers)))


__all__ = ["flush", "install", "run"]
