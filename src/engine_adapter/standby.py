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

from sglang.srt.managers.io_struct import HealthCheckOutput

from daemon_adapter.client import Attachment
from engine_adapter import roles, runner, state
from engine_adapter.standby_server import PARK_RID, PROMOTED_RID
from layout_sm.engine import Go, Step
from layout_sm.messages import is_notice
from layout_sm.ready import ParkAsked, Ready, TakeOverAsked
from layout_sm.reasons import standby_lost_its_daemon

logger = logging.getLogger("engine_adapter")

TAKEOVER_RID = "expert-layout-takeover"  # the takeover request's mark, in the scheduler's own broadcast
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
            except ConnectionError:  # the daemon went away (its EOF): this standby cannot outlive it
                if self.attachment.open:
                    st = state.get()
                    logger.error("[expert-layout] %s", standby_lost_its_daemon(st.rank, st.socket_path))
                return
            except OSError:  # the engine closed its attachment
                return
            except Exception:  # a frame that cannot be read: a bug, which would silently stop every takeover
                logger.exception("[expert-layout] the notice reader stopped on an unreadable message")
                return
            if is_notice(message):
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
    """Every rank, on the iteration the park request reached them: the session parks the ranks in rank
    order (each reply all-gathered), and claims at once when nobody is left to wait for."""
    st = state.get()
    session, rank = st.session, st.rank
    if session is None or rank is None or st.attachment is None:
        raise StandbyFailed(
            f"{roles.ROLE_ENV}={roles.STANDBY}, but this engine is not attached to a layout-aware weight cache "
            "daemon (--weight-cache-mode client|daemon): a warm standby shares the daemons' weights with its primary"
        )
    if st.standby is None:
        st.standby = StandbyLink(st.attachment)
    _carry_out(scheduler, runner.run(session.step(ParkAsked(rank))))


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


def take_over(scheduler: Any) -> None:
    """Every rank, on the same iteration: the session gathers the notices, claims in rank order and
    promotes, fails, or parks again."""
    st = state.get()
    assert st.session is not None and st.rank is not None
    _carry_out(scheduler, runner.run(st.session.step(TakeOverAsked(st.rank))))


def _carry_out(scheduler: Any, ended: Ready) -> None:
    """What a standby's sequence ended with: promoted (the map is installed: unpark), failed (sglang ends
    the server, whose held requests could never be served), or parked (on a notice still to come; asked
    again at the next iteration where the session says so)."""
    st = state.get()
    link = st.standby
    step = ended.done
    assert link is not None and step is not None, "a standby's sequence ends with a step"
    if step.go is Go.STOP:
        logger.error("[expert-layout] rank %s: %s", st.rank, step.message)
        raise StandbyFailed(f"[expert-layout] {step.message}")
    if step.go is Go.PAUSE:
        logger.info("[expert-layout] rank %s: %s", st.rank, step.message)
        link.wake_pending = link.wake_pending or ended.repeat
        return
    link.times["agreed"] = time.time()
    _unpark(scheduler, step)


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
