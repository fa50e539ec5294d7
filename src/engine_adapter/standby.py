"""A warm standby (docs/protocol.md §10): it parks after its warmup and takes over on the daemons' notice.

``SGLANG_EXPERT_LAYOUT_ROLE=standby`` (``engine_adapter.roles``). The standby starts as any engine
(``engine_adapter.startup``: attach, wait, agree, adopt, load). Then, with sglang's own parts:

- **Park.** When sglang would declare the server up (after its warmup, or at once with
  ``--skip-server-warmup``), the HTTP server's process keeps the status at ``Starting`` (``/health``
  and ``/health_generate`` answer 503 at once) and sends the scheduler sglang's own in-place pause
  (``PauseGenerationReqInput``, marked by its ``rid``). The pause rides the scheduler's broadcast of
  its inputs, so every TP rank pauses on the same iteration; there every rank sends the session's
  park request to its own daemon, rank by rank (each rank's reply is all-gathered before the next
  rank parks), and starts a reader on its attach connection. Requests that arrive are held by the
  paused scheduler, not failed.
- **The notice.** A daemon whose last unparked engine left writes the notice on the attach
  connection. The reader hands it over at once; on the entry rank it also wakes the paused loop
  (the loop sleeps on sglang's own sockets and this reader's pipe: no polling interval), which adds
  the takeover request to its next broadcast: every rank takes over on the same iteration.
- **Takeover.** Every rank waits (bounded) for its own notice, the notices are all-gathered, the
  ranks claim in rank order (each claim's reply all-gathered before the next), and the session's
  ``promote`` decides: promoted (sglang's ``ExpertLocationMetadata.update`` to the records' map, in
  place, then sglang's continue unpauses every rank on that iteration and the HTTP server turns
  ``Up``), failed (the scheduler raises with the reason: sglang ends the server, whose held
  requests could never be served), or park again (another standby won).

A plain ``/continue_generation`` on a parked standby is refused (logged): it would run forward
passes on weights the primary is moving. Every decision is the session's (``layout_sm.session``);
this module only does the I/O and calls sglang.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from sglang.srt.eplb.expert_location import ExpertLocationMetadata, get_global_expert_location_metadata
from sglang.srt.managers.io_struct import HealthCheckOutput
from sglang.srt.runtime_context import get_parallel

from daemon_adapter.client import Attachment
from engine_adapter import roles, state
from engine_adapter.rebalance import ask_daemon
from engine_adapter.standby_server import PARK_RID, PROMOTED_RID
from engine_adapter.startup import all_gather
from layout_sm.engine import Go, Step
from layout_sm.messages import NOTICE

logger = logging.getLogger("engine_adapter")

TAKEOVER_RID = "expert-layout-takeover"  # the takeover request's mark, in the scheduler's own broadcast
# How long a rank waits for its own daemon's notice once the entry rank's came: the primary's ranks
# die together, so the daemons see their EOFs within milliseconds; a rank still without its notice
# then has a primary attached there, and the standby parks on.
NOTICE_WAIT_S = 5.0
# The paused entry rank's sleep between wake-ups, as sglang's own IdleSleeper (--sleep-on-idle).
PAUSED_SLEEP_MS = 1000


class StandbyFailed(RuntimeError):
    """The standby cannot take over (a daemon refused its claim: dirty, repairing, no record)."""


@dataclass
class StandbyLink:
    """What a parked standby's rank holds beside its session: the notice and the wake-up of the loop."""

    attachment: Attachment
    noticed: threading.Event = field(default_factory=threading.Event)
    wake_r: int = -1
    wake_w: int = -1
    wake_pending: bool = False
    times: dict[str, float] = field(default_factory=dict)  # wall-clock marks of the takeover's parts

    def __post_init__(self) -> None:
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        threading.Thread(target=self._read_notices, name="expert-layout-notice", daemon=True).start()

    def _read_notices(self) -> None:
        """Blocks on the attach connection; each notice is handed over at once."""
        while self.attachment.open:
            try:
                message = self.attachment.notice(None)
            except OSError:  # ConnectionError: the daemon went away (its EOF); OSError: the engine closed it
                return
            except Exception:  # a frame that cannot be read: a bug, which would silently stop every takeover
                logger.exception("[expert-layout] the notice reader stopped on an unreadable message")
                return
            if isinstance(message, dict) and message.get("type") == NOTICE:
                self.times["notice"] = time.time()
                self.noticed.set()
                self.wake_pending = True
                os.write(self.wake_w, b"!")

    def drain_wake(self) -> None:
        try:
            while os.read(self.wake_r, 64):
                pass
        except BlockingIOError:
            pass


def _link() -> StandbyLink | None:
    return state.get().standby


def _parked(st: state.EngineLayoutState) -> bool:
    return st.standby is not None and st.session is not None and st.session.standby_parked


# -- the scheduler processes -------------------------------------------------------------------


def around_pause_generation(original: Any, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    result = original(scheduler, recv_req, *args, **kwargs)
    if getattr(recv_req, "rid", None) == PARK_RID and state.enabled():
        park(scheduler)
    return result


def park(scheduler: Any) -> None:
    """Every rank, on the iteration the park request reached them: park on its daemon, rank by rank."""
    st = state.get()
    session, rank = st.session, st.rank
    if session is None or rank is None or st.attachment is None:
        raise StandbyFailed(
            f"{roles.ROLE_ENV}={roles.STANDBY}, but this engine is not attached to a layout-aware weight cache "
            "daemon (--weight-cache-mode client|daemon): a warm standby shares the daemons' weights with its primary"
        )
    # Each rank loaded from its own daemon; the ranks learn each other's load over the all-gather.
    loaded = session.loaded_all(all_gather(rank in session.view().served))
    if loaded.go is not Go.PROCEED:
        raise StandbyFailed(f"[expert-layout] a warm standby parks once it serves: {loaded.message}")
    if st.standby is None:
        st.standby = StandbyLink(st.attachment)
    _park_ranks(scheduler)


def _park_ranks(scheduler: Any) -> None:
    st = state.get()
    session, link = st.session, st.standby
    assert session is not None and link is not None and st.rank is not None
    rank = st.rank
    while (other := session.next_to_park()) is not None:
        if other == rank:  # a notice read before this park is an answer to an older one
            link.noticed.clear()
        reply = ask_daemon(st, session.park_request(rank)) if other == rank else None
        step = session.parked(other, all_gather(reply)[other])
        if other == rank and step.go is Go.PROCEED:  # the park reply was the notice: no primary is attached
            link.noticed.set()
        logger.info("[expert-layout] rank %d: %s", rank, step.message)
    if session.noticed_all().go is Go.PROCEED:
        take_over(scheduler)  # nobody to wait for: claim at once, on this same iteration


def around_poll_timeout_aborts(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """The entry rank's local inputs, which ride the broadcast: the takeover joins them once a notice came."""
    local = original(scheduler, *args, **kwargs)
    link = _link()
    if link is not None and link.wake_pending and state.enabled():
        link.wake_pending = False
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        local = [*local, ContinueGenerationReqInput(rid=TAKEOVER_RID, torch_empty_cache=False)]
    return local


def around_paused_loop(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """A parked entry rank sleeps until a request, an RPC or a notice arrives (the other ranks wait in
    the scheduler's broadcast); sglang's paused loop would otherwise spin."""
    result = original(scheduler, *args, **kwargs)
    st = state.get()
    link = st.standby
    if link is None or not _parked(st) or scheduler.recv_from_tokenizer is None or link.wake_pending:
        return result
    import zmq

    poller = zmq.Poller()
    for sock in (scheduler.ipc_channels.recv_from_tokenizer, scheduler.ipc_channels.recv_from_rpc):
        if isinstance(sock, zmq.Socket):
            poller.register(sock, zmq.POLLIN)
    poller.register(link.wake_r, zmq.POLLIN)
    poller.poll(PAUSED_SLEEP_MS)
    link.drain_wake()
    return result


def around_continue_generation(original: Any, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
    st = state.get()
    if not state.enabled() or st.standby is None:
        return original(scheduler, recv_req, *args, **kwargs)
    if getattr(recv_req, "rid", None) == TAKEOVER_RID:
        if _parked(st):
            take_over(scheduler)
        return None
    if _parked(st):
        st.log_once(
            logging.WARNING,
            "continue-while-parked",
            "[expert-layout] /continue_generation refused: this warm standby is parked (its primary may be "
            "moving experts in the shared weights); it unpauses by itself once it is promoted",
        )
        return None
    return original(scheduler, recv_req, *args, **kwargs)


def take_over(scheduler: Any) -> bool:
    """Every rank, on the same iteration: notices, claims in rank order, promote. True once promoted."""
    st = state.get()
    session, link, rank = st.session, st.standby, st.rank
    assert session is not None and link is not None and rank is not None
    if session.awaits_notice(rank):  # else this rank has its notice (or its grant) already
        link.noticed.wait(NOTICE_WAIT_S)
    ready = session.noticed_all(all_gather(link.noticed.is_set()))
    if ready.go is not Go.PROCEED:
        # Some daemon has not told this standby yet (a primary still attached there, or a repair that
        # outlasts the wait): the next iteration asks again, each rank waiting for its own notice.
        logger.info("[expert-layout] rank %d: %s: parked", rank, ready.message)
        link.wake_pending = True
        return False
    claims = []
    while (other := session.next_to_claim()) is not None:  # rank by rank, each reply all-gathered
        reply = ask_daemon(st, session.claim_request(rank)) if other == rank else None
        claims.append(session.claimed(other, all_gather(reply)[other]))
    step = session.promote()
    link.times["agreed"] = time.time()
    if step.go is Go.STOP:
        refusals = "; ".join(c.message for c in claims if c.go is Go.STOP)
        logger.error("[expert-layout] rank %d: %s (%s)", rank, step.message, refusals)
        raise StandbyFailed(f"[expert-layout] claim refused: {step.message} ({refusals})")
    if step.go is Go.PAUSE:
        logger.info("[expert-layout] rank %d: %s", rank, step.message)
        _park_ranks(scheduler)
        return _promoted_here(scheduler)
    _install(session.layout_to_install())
    link.times["metadata"] = time.time()
    return _promoted_here(scheduler) or _unpark(scheduler, step)


def _promoted_here(scheduler: Any) -> bool:
    """A park again may itself have promoted the standby (its reply was the notice): already unparked."""
    session = state.get().session
    return session is not None and session.standby_promoted and not scheduler._engine_paused


def _install(rows: Any) -> None:
    st = state.get()
    metadata = get_global_expert_location_metadata()
    if rows is None or metadata is None:
        return
    adopted = ExpertLocationMetadata.init_by_mapping(
        st.model_config, torch.tensor(rows, dtype=torch.int64), moe_ep_rank=get_parallel().moe_ep_rank
    )
    # In place, as EPLB's updater does: the recorder and dispatch hold this very object.
    metadata.update(adopted, update_layer_ids=list(range(metadata.num_layers)))


def _unpark(scheduler: Any, step: Step) -> bool:
    from sglang.srt.managers.io_struct import ContinueGenerationReqInput

    st = state.get()
    link = st.standby
    assert link is not None
    # sglang's own continue (the hook passes it on: the session is promoted, no longer parked).
    scheduler.continue_generation(ContinueGenerationReqInput(torch_empty_cache=False))
    link.times["unparked"] = time.time()
    logger.info(
        "[expert-layout] rank %s: %s; takeover times (unix s): %s",
        st.rank,
        step.message,
        " ".join(f"{k}={v:.3f}" for k, v in link.times.items()),
    )
    if scheduler.recv_from_tokenizer is not None:  # the entry rank tells the HTTP server: status Up
        scheduler.ipc_channels.send_to_tokenizer.send_output(HealthCheckOutput(rid=PROMOTED_RID))
    return True
