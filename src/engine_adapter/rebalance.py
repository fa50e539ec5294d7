"""EPLB rebalance (docs/protocol.md §6): every chunk sglang moves goes through the daemons' two phases.

Two hooks on sglang's ``sglang.srt.eplb.eplb_manager``. Each hands the rank's ``EngineSession``
(``layout_sm.session``) what sglang asks for and carries out what it returns
(``engine_adapter.runner``); the session says what to send, what to all-gather, whether sglang moves
and how the rebalance ends:

- AROUND ``EPLBManager.rebalance`` (a generator): ``RebalanceAsked`` (the hooks sglang did not apply,
  where this rank's weights came from): proceed (through the chunk protocol when the session
  ``shares``, else sglang's own rebalance), or the rebalance ends; when sglang's generator ends,
  ``RebalanceEnded`` (the last chunk's check, when owed, gets its all-gather);
- AROUND ``update_expert_location_with_recovery`` (once per chunk): ``ChunkAsked`` with the chunk's
  layers; the session's begin, the one all-gather of the begin answers and the last chunk's commit
  answers, the decision (an abort where this rank began), sglang's move, unchanged, the device
  synchronize, and the commit, whose reply is read before the rank's next step: the daemon records it
  while the engine serves.

A sequence that ends with a step other than proceed ends the rebalance in ``_end``, the one off
path: pause (the next rebalance retries) or stop (``disable_rebalance``, sglang's own switch, with
the reason logged once).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch.distributed as dist
from sglang.srt.runtime_context import get_exec

from engine_adapter import install_check, metrics, runner, state
from engine_adapter.collective import world_cpu_group
from engine_adapter.trace import trace_engine
from layout_sm.engine import Go, Step
from layout_sm.ready import ChunkAsked, RebalanceAsked, RebalanceEnded
from layout_sm.session import EngineSession

logger = logging.getLogger("engine_adapter")


class _StopRebalance(Exception):
    """Ends the current ``EPLBManager.rebalance`` between chunks (pause, disable, failed commit)."""


def _end(st: state.EngineLayoutState, manager: Any, step: Step | None) -> None:
    """The one way a rebalance ends early: pause (logged; the next one retries) or stop (logged
    once per reason, and sglang's own switch turns EPLB's rebalancing off)."""
    if step is None or step.go is Go.PROCEED:
        return
    if step.go is Go.STOP:
        st.log_once(int(step.severity), f"rebalance-off:{step.reason.value}", f"[expert-layout] {step.message}")
        manager.disable_rebalance(f"expert-layout: {step.message}")
    else:
        logger.log(int(step.severity), "[expert-layout] %s", step.message)


def _rebalance_ended(st: state.EngineLayoutState, manager: Any, session: EngineSession, rank: int) -> None:
    """sglang's rebalance ended: the session says whether the last chunk's check is owed first."""
    _end(st, manager, runner.run(session.step(RebalanceEnded(rank))).done)


def around_rebalance(original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
    if not state.enabled():
        yield from original(manager, *args, **kwargs)
        return
    st = state.get()
    if st.session is None:  # no startup ran (no weight cache, no MoE metadata): never attached
        group = world_cpu_group()
        st.session, st.rank = EngineSession.never_attached(dist.get_world_size(group)), dist.get_rank(group)
        st.trace = trace_engine(st.session, st.rank, None)
        metrics.watch(st.session, st.rank)
        st.counters.watch(st.session, st.rank)
    session, rank = st.session, st.rank
    assert rank is not None
    runner.flush()
    elastic_ep = get_exec().moe.elastic_ep_backend is not None
    step = runner.run(session.step(RebalanceAsked(rank, st.shared_moves_blocked, elastic_ep, st.weights_source))).done
    if step is None or step.go is not Go.PROCEED:
        _end(st, manager, step)
        return
    st.active_manager = manager if session.shares else None  # None: sglang's own rebalance, no protocol
    # An error out of sglang's rebalance (a peer rank died mid-chunk: its collective broke) did not end
    # the rebalance: the chunk is neither committed nor aborted, and the error takes the scheduler down.
    # The session is not told it ended, and the trace does not say it did.
    ended = False
    try:
        yield from original(manager, *args, **kwargs)
        ended = True
    except _StopRebalance:
        ended = True
    except GeneratorExit:  # sglang dropped the generator between two steps: nothing broke
        ended = True
        raise
    finally:
        st.active_manager = None
        runner.flush()
        metrics.rebalance_ended()
        if ended:
            _rebalance_ended(st, manager, session, rank)
            if st.trace is not None:  # the trace's mark of a rebalance's end: no check of a commit may be owed
                st.trace.rebalance_end()


def around_update_expert_location_with_recovery(original: Any, *args: Any, **kwargs: Any) -> Any:
    st = state.get()
    manager = st.active_manager
    if manager is None:  # sglang's own rebalance (disk weights) or another caller
        if install_check.skip_unprotected_move(st):  # or sglang's, its rebalance hook missing
            return None
        return original(*args, **kwargs)
    session, rank = st.session, st.rank
    assert session is not None and rank is not None
    runner.flush()  # the last chunk's commit reply: its answer goes into this chunk's all-gather
    t0 = time.perf_counter()
    layers = [int(layer) for layer in kwargs["update_layer_ids"]]
    st.moved_at = None
    step = runner.run(session.step(ChunkAsked(rank, layers)), move=lambda: original(*args, **kwargs)).done
    t3 = time.perf_counter()
    if st.moved_at is not None:  # the begin phase, sglang's move and the synchronize, the commit going out
        t1, t2 = st.moved_at
        st.counters.record_time("begin_s", t1 - t0)
        st.counters.record_time("move_s", t2 - t1)
        st.counters.record_time("commit_s", t3 - t2)
        metrics.protocol_time((t1 - t0) + (t3 - t2))
    else:
        st.counters.record_time("begin_s", t3 - t0)
        metrics.protocol_time(t3 - t0)
    if step is None or step.go is not Go.PROCEED:
        _end(st, manager, step)
        raise _StopRebalance
    return st.move_result
