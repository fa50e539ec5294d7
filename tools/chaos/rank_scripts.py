"""What each engine rank process runs in a chaos schedule (``EngineRanks.run_each`` scripts).

A script may carry a ``KillPoint``: the rank SIGKILLs itself, or its daemon, right after its
``EngineSession`` took the named event for the ``count``-th time in that script, so a kill lands
inside a protocol step (after a begin's answer, after a move, after a commit, in a startup wait)
rather than between the schedule's operations. A daemon takes its engines with it, as on a GPU
where they map its memory (the spec's ``Lose``): every engine rank attached to it is SIGKILLed
first, then the daemon, then this rank.

A script may also carry a ``ReplyFault`` on one of the rank's chunk commits: its reply lost after the
daemon took it, the request never sent, or rows the daemon must refuse, so that the paths where a
commit is not verified run (the rank's daemon client is wrapped here, never in ``src``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tools.demo import memory_probe
from tools.demo.harness import rank_scripts
from tools.harness.engine_ranks import EngineRank, EngineSpec


@dataclass(frozen=True)
class KillPoint:
    """After the ``count``-th ``event``: SIGKILL ``pids`` in order, then this rank process."""

    event: str
    count: int
    pids: tuple[int, ...]  # none for a rank's kill; a daemon's: the other ranks attached to it, then the daemon
    what: str  # "rank" or "daemon", for the report
    marker: str = ""  # a file made before the first SIGKILL: the point fired, whichever death is seen first

    def describe(self) -> str:
        return f"SIGKILL its {self.what} after {self.event} #{self.count}"


# A commit's faults, and a begin's ("begin_": the same fault on the chunk's begin).
COMMIT_FAULTS = ("lost_reply", "lost_request", "bad_rows")
BEGIN_FAULT = "begin_"
BEGIN_FAULTS = (BEGIN_FAULT + "lost_reply", BEGIN_FAULT + "lost_request")
FAULT_KINDS = COMMIT_FAULTS + BEGIN_FAULTS


@dataclass(frozen=True)
class ReplyFault:
    """The ``count``-th commit (or begin) this rank sends in the script: ``kind`` of ``FAULT_KINDS``."""

    kind: str
    count: int
    marker: str = ""  # a file made when the fault is injected: the campaign counts what fired


class _LostReply:
    """A sent request whose reply never reaches the rank: the daemon's answer is read (so it took the
    request whole) and dropped."""

    def __init__(self, sent: Any) -> None:
        self._sent = sent

    def read(self) -> Any:
        if self._sent is not None:
            sent, self._sent = self._sent, None
            with contextlib.suppress(Exception):
                sent.read()
        raise ConnectionError("the harness dropped this request's reply")


_faults: dict[str, Any] = {}  # the reply fault armed now, and how many commits were sent


def _arm_fault(fault: ReplyFault | None) -> None:
    from daemon_adapter import client
    from layout_sm.messages import BEGIN, COMMIT

    if "send" not in _faults:
        send = client.send_request

        def send_with_fault(socket_path: str, message: Any, *args: Any, **kwargs: Any) -> Any:
            point = _faults.get("fault")
            if point is None or not isinstance(message, dict):
                return send(socket_path, message, *args, **kwargs)
            on_begin = point.kind.startswith(BEGIN_FAULT)
            if message.get("type") != (BEGIN if on_begin else COMMIT):
                return send(socket_path, message, *args, **kwargs)
            _faults["seen"] += 1
            if _faults["seen"] != point.count:
                return send(socket_path, message, *args, **kwargs)
            if point.marker:
                with open(point.marker, "a") as f:
                    f.write(point.kind + "\n")
            kind = point.kind.removeprefix(BEGIN_FAULT)
            if kind == "lost_request":
                return _LostReply(None)
            if kind == "lost_reply":
                return _LostReply(send(socket_path, message, *args, **kwargs))
            # bad_rows: an expert id no model has, which the daemon's record refuses
            rows = [list(row) for row in message["rows"]]
            rows[0][0] = -1
            return send(socket_path, {**message, "rows": rows}, *args, **kwargs)

        client.send_request = send_with_fault
        _faults["send"] = send
    _faults.update(fault=fault, seen=0)


_trigger: dict[str, Any] = {}  # the kill point armed now, and how often its event was seen


def _arm(kill: KillPoint | None) -> None:
    """Arm ``kill`` for the script about to run (the session's events pass through here)."""
    from layout_sm.session import EngineSession

    if "fire" not in _trigger:
        fire = EngineSession._fire

        def fire_then_kill(session: Any, table: Any, event: str, **arguments: Any) -> Any:
            result = fire(session, table, event, **arguments)
            point = _trigger.get("kill")
            if point is not None and event == point.event:
                _trigger["seen"] += 1
                if _trigger["seen"] == point.count:
                    if point.marker:
                        open(point.marker, "w").close()
                    for pid in point.pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    os.kill(os.getpid(), signal.SIGKILL)
            return result

        EngineSession._fire = fire_then_kill
        _trigger["fire"] = fire
    _trigger.update(kill=kill, seen=0)


@contextlib.contextmanager
def _armed(kill: KillPoint | None, fault: ReplyFault | None = None) -> Iterator[None]:
    _arm(kill)
    _arm_fault(fault)
    try:
        yield
    finally:
        _arm(None)
        _arm_fault(None)


def start(rank: EngineRank, spec: EngineSpec, kill: KillPoint | None) -> dict[str, Any]:
    with _armed(kill):
        return rank_scripts.start(rank, spec)


def rebalance(rank: EngineRank, phase: int, kill: KillPoint | None, fault: ReplyFault | None = None) -> dict[str, Any]:
    with _armed(kill, fault):
        return rank_scripts.rebalance(rank, phase)


def report(rank: EngineRank, truth: bool) -> dict[str, Any]:
    """What the engine routes with and what its memory holds; with ``truth`` (its memory is its
    daemon's, that daemon still the one it loaded from) the reading goes into its trace as the spec's
    truth, which the checker compares with that daemon's record where it is clean."""
    from engine_adapter import state

    read_ns = time.monotonic_ns()
    out = rank_scripts.report(rank)
    st = state.get()
    if truth and st.trace is not None and st.socket_path is not None and out["slots"]:
        assert rank.spec is not None
        reading = memory_probe.ProbeTrace(st.trace.path.parent, st.socket_path)
        reading.truth(read_ns, rank.rank * rank.spec.cfg.num_local, out["slots"])
    return out


def stop(rank: EngineRank) -> bool:
    return rank_scripts.stop(rank)
