"""An engine's ranks in one test process, each with its own ``EngineSession``, carrying out what the
sessions say as the adapter does (``engine_adapter.runner``): each ``Ready``'s request goes to that
rank's ``DaemonMachine`` (as a wire reply back), an all-gather waits for every rank to reach it and
hands each the same list, sglang's move is the map the test gives, a reply read later is handed over
before the rank's next step, a daemon's reload (a rejoin's) ends before its reply is read. What the
sessions installed and how each sequence ended are kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from layout_sm.daemon import DaemonMachine, RepairDone
from layout_sm.engine import EngineLayout, Step
from layout_sm.messages import AttachRequest, LayoutRequest
from layout_sm.ready import NOTHING, Event, Ready, Unanswered
from layout_sm.session import EngineSession


@dataclass
class Rank:
    session: EngineSession
    daemon: DaemonMachine | None  # None: no daemon at its socket
    token: str
    ready: Ready = NOTHING
    ended: Ready = NOTHING  # the last Ready that said how the sequence ended
    installed: Any = None
    pending: tuple[Callable[[], object], Callable[[Any, float], Event]] | None = None
    sent: list[LayoutRequest] = field(default_factory=list)


class Ranks:
    """``len(daemons)`` ranks of engine ``engine_id`` (see the module docstring)."""

    def __init__(
        self,
        daemons: Sequence[DaemonMachine | None],
        layout: EngineLayout,
        engine_id: str = "A",
        session_class: type[EngineSession] = EngineSession,
        **session_kwargs: Any,
    ) -> None:
        n = len(daemons)
        self.ranks = [
            Rank(session_class(engine_id, n, layout, **session_kwargs), daemon, f"s{engine_id}{r}")
            for r, daemon in enumerate(daemons)
        ]
        self.noticed = [False] * n  # whether each rank's reader has its notice (a test sets it)
        # A request of a rank's kind as its daemon gets it: a test changes it on its way (by rank).
        self.on_the_way: dict[int, Callable[[LayoutRequest], LayoutRequest]] = {}
        self.now = 0.0  # the monotonic clock the ranks read (a test moves it)
        self.gone: set[int] = set()  # ranks whose daemon's socket is there but refuses connections (it died)
        # Request kinds whose reply is lost on the way back, by rank: the daemon takes the request.
        self.replies_lost: dict[int, type[LayoutRequest]] = {}
        self.reloads = True  # a daemon's reload (a rejoin's) ends at once; False: it never ends

    @property
    def session(self) -> EngineSession:
        """Rank 0's session (every rank's takes the same decisions)."""
        return self.ranks[0].session

    def step(self, make: Callable[[int], Event], move: Any = None) -> list[Step | None]:
        """Every rank steps the event ``make(rank)`` and carries out what follows, until every rank is
        done; each rank's last ``done`` step. ``move``: the engine's whole map after sglang's move."""
        for r, rank in enumerate(self.ranks):
            self._flush(rank)
            rank.ended = NOTHING
            rank.ready = rank.session.step(make(r))
        while True:
            for rank in self.ranks:
                self._carry_out(rank, move)
            waiting = [rank for rank in self.ranks if rank.ready.gathers]
            if not waiting:
                return [rank.ended.done for rank in self.ranks]
            assert len(waiting) == len(self.ranks), "a rank reached an all-gather its peers did not"
            parts = [rank.ready.gather for rank in self.ranks]
            for rank in self.ranks:
                then = rank.ready.then
                assert then is not None
                rank.ready = rank.session.step(then(list(parts), self.now))

    def _carry_out(self, rank: Rank, move: Any) -> None:
        """Carry out the rank's Ready until it gathers or has nothing more to hand back."""
        while True:
            ready = rank.ready
            if ready.install is not None:
                rank.installed = ready.install
            if ready.done is not None:
                rank.ended = ready
            if ready.gathers:
                return
            event = self._act(rank, ready, move)
            if event is None:
                event = ready.next
            if event is None:
                rank.ready = NOTHING
                return
            rank.ready = rank.session.step(event)

    def _act(self, rank: Rank, ready: Ready, move: Any) -> Event | None:
        then = ready.then
        if ready.send is not None:
            rank.sent.append(ready.send)
            if ready.read_later:
                assert then is not None
                rank.pending = (lambda request=ready.send: self._ask(rank, request), then)
                return None
            reply = self._ask(rank, ready.send)
            return None if then is None else then(reply, self.now)
        if ready.move:
            assert then is not None and move is not None, "the test gives the map sglang moves to"
            return then([list(row) for row in move], self.now)
        if ready.await_notice_s is not None:
            assert then is not None
            return then(self.noticed[self.ranks.index(rank)], self.now)
        return None

    def _ask(self, rank: Rank, request: LayoutRequest) -> object:
        change = self.on_the_way.get(self.ranks.index(rank))
        if change is not None:
            request = change(request)
        if self.ranks.index(rank) in self.gone:
            return Unanswered("ConnectionRefusedError")
        if rank.daemon is None:
            return Unanswered("no weight cache daemon socket", absent=isinstance(request, AttachRequest))
        if isinstance(request, AttachRequest):
            return rank.daemon.handle(request, session=rank.token).reply.to_wire()
        step = rank.daemon.handle(request)
        if step.reload is not None and self.reloads:  # the daemon's adapter reloads the plan's layers
            rank.daemon.handle(RepairDone(step.reload.layers, "reloaded"))
        if isinstance(request, self.replies_lost.get(self.ranks.index(rank), ())):
            return Unanswered("the reply was lost")
        return step.reply.to_wire()

    def _flush(self, rank: Rank) -> None:
        pending, rank.pending = rank.pending, None
        if pending is not None:
            read, then = pending
            rank.ready = rank.session.step(then(read(), self.now))
            self._carry_out(rank, None)

    def flush(self) -> None:
        """Every rank reads the reply it left unread (a chunk's commit) and takes it."""
        for rank in self.ranks:
            self._flush(rank)

    def time_passes(self) -> None:
        """The ranks' clock runs past any wait's timeout."""
        self.now = math.inf


__all__ = ["Rank", "Ranks"]
