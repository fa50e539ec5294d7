"""The engine side of the protocol as one object: what every rank of an engine runs, and what the mirror drives.

``EngineSession`` plays the part of etcd raft's ``RawNode``: it never touches a socket, a
collective or sglang. Its one step function, ``step(event)``, takes what happened to a rank
(``layout_sm.ready``: a daemon's reply, a gathered list, sglang asking for a rebalance or a chunk)
and returns a ``Ready``: what that rank does next, in order (the request to send, its part of the
next all-gather, whether sglang moves, the map to install, the attachment to close) and the event
to hand back with what came of it; ``done`` is the ``Step`` a sequence ends with (``layout_sm.engine``:
proceed, pause or stop, with the reason, a severity and the words for the operator).

- startup (docs/protocol.md §5): ``Started`` attaches; a rank that waits polls (``Polled``) until
  the move it waits for ends or the wait times out; every rank's finding is gathered
  (``FindingsGathered``), and the ranks agree: adopt (``install``), keep their own layout, or stop;
  some daemons started again from disk first rejoin at the others' record (``RejoinRowsGathered``,
  ``RejoinAnswered``), and the ranks agree again;
- loading: ``fetch_claim`` is each rank's ``fetch_state`` field; ``Fetched`` stops on a refusal;
- rebalance (§6): ``RebalanceAsked`` (hooks sglang did not apply turn it off; at the first, where the
  weights came from is gathered: ``SourcesGathered``); per chunk (``ChunkAsked``) the begin, its
  answer and the last chunk's commit answer in one all-gather (``BeginsGathered``), the decision,
  the aborts, sglang's move (``Moved``), the commit (its answer read later: ``CommitAnswered``), the
  chunk's end with no collective (``ChunkEnded``); at the rebalance's end (``RebalanceEnded``) the
  last commit's check, when owed (``OwedGathered``);
- a warm standby (§10): ``ParkAsked``: the ranks park in rank order, each reply gathered
  (``ParksGathered``); a notice (``Noticed``, ``TakeOverAsked``): the notices are gathered, the ranks
  claim in rank order (``ClaimsGathered``) and the standby is promoted (``install``), fails, or
  parks again.

The mirror hands the session the spec's finer steps (one rank's begin answer, ``Decided``, one
rank's abort, ``ClaimsEnded``) through the same function. ``take`` runs one machine event by its
name: a trace checker replays an engine's trace with it.

The session's state is its machines' model, ``EngineState``, whose one frozen ``EngineView``
``view()`` returns and ``restore(view)`` replaces: the mirror explores immutable states with one
reused session, as it does with ``DaemonMachine``. Every step fires events of ``StartupMachine``,
``RebalanceMachine`` or ``StandbyMachine``, taken from their declarations by ``layout_sm.declared``
(python-statemachine's own engine runs the same classes in the tests:
``tools.mirror.reference.ReferenceEngineSession``); an event their transitions do not allow raises
``TransitionNotAllowed``.

In an engine every rank process keeps its own session for the whole engine. It knows its own
session token only and learns the other ranks' findings and replies from the all-gathers; every
rank hands its session the same gathered lists, so every rank takes the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from layout_sm import messages
from layout_sm.declared import Declared
from layout_sm.engine import (
    EngineLayout,
    EnginePhase,
    EngineView,
    Go,
    RankAnswer,
    RankFinding,
    RebalancePhase,
    RecordStamp,
    Step,
    fetch_refusal,
)
from layout_sm.engine_machines import EngineState, RebalanceMachine, StandbyMachine, StartupMachine
from layout_sm.ready import (
    NOTHING,
    Aborted,
    Attached,
    BeginAnswered,
    BeginsGathered,
    ChunkAsked,
    ChunkEnded,
    ClaimAnswered,
    ClaimsEnded,
    ClaimsGathered,
    CommitAnswered,
    Decided,
    Event,
    Failed,
    Fetched,
    FindingsGathered,
    LoadsGathered,
    Moved,
    NoticeAwaited,
    Noticed,
    NoticesGathered,
    OwedGathered,
    ParkAnswered,
    ParkAsked,
    ParksGathered,
    Polled,
    Ready,
    RebalanceAsked,
    RebalanceEnded,
    RejoinAnswered,
    RejoinRowsGathered,
    SourcesGathered,
    Started,
    TakeOverAsked,
    Unanswered,
    gathering,
    sending,
)
from layout_sm.reasons import Status
from layout_sm.record import LayoutRecord, Rows, layout_digest

POLL = messages.QueryRequest(include_map=True)
DEFAULT_WAIT_TIMEOUT_S = 300.0  # a rank waits this long for another engine's move (or a repair) to end
DEFAULT_POLL_INTERVAL_S = 0.5  # and polls its daemon this often meanwhile
# How long a parked standby's rank waits for its own daemon's notice once the entry rank's came: the
# primary's ranks die together, so the daemons see their EOFs within milliseconds; a rank still without
# its notice then has a primary attached there, and the standby parks on.
NOTICE_WAIT_S = 5.0


class SessionError(RuntimeError):
    """The caller asked the session for a request its state does not allow (a bug in the caller)."""


class EngineSession:
    """The protocol state and steps of one engine (see the module docstring)."""

    def __init__(
        self,
        engine_id: str,
        num_ranks: int,
        layout: EngineLayout | None,
        *,
        standby: bool = False,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        socket: str = "",
    ) -> None:
        """``layout`` is the engine's own (None only for an engine that never attaches); ``standby``:
        started as a warm standby (docs/protocol.md §10); ``wait_timeout_s`` and ``poll_interval_s``:
        how long a rank waits out another engine's move or a repair, polling how often; ``socket``:
        the rank's daemon socket, for the words of a refusal."""
        if num_ranks < 1:
            raise ValueError(f"an engine has at least one rank, not {num_ranks}")
        self.layout = layout
        self.model = EngineState(EngineView.fresh(engine_id, num_ranks), layout)
        self._startup = Declared.of(StartupMachine, EngineState, "phase")
        self._rebalance = Declared.of(RebalanceMachine, EngineState, "rebalance")
        self._standby = Declared.of(StandbyMachine, EngineState, "role")
        self.wait_timeout_s = wait_timeout_s
        self.poll_interval_s = poll_interval_s
        self.socket = socket
        # What only this rank's process holds, outside the protocol's state: when each wait began
        # (monotonic seconds), the engine's own initial map, the chunk's moved map until its commit's
        # answer is taken, and the step a chunk ends with while its aborts go out.
        self._wait_since: dict[int, float] = {}
        self._initial_rows: Rows | None = None
        self._moved: Sequence[Sequence[int]] | None = None
        # Told of every machine event taken (event, its arguments, its result, the view after): the
        # engine's trace, its metrics.
        self.observers: list[Callable[[str, Mapping[str, Any], Any, EngineView], None]] = []
        if standby:
            self._fire(self._standby, "standby")

    @classmethod
    def never_attached(cls, num_ranks: int) -> EngineSession:
        """The session of an engine whose startup never ran (no weight cache, or no MoE metadata):
        it only learns how to rebalance, from where the weights came."""
        return cls("", num_ranks, None)

    # -- reading and loading --------------------------------------------------------------

    def view(self) -> EngineView:
        return self.model.view

    def restore(self, view: EngineView) -> None:
        """Put the session in ``view``'s state (its machines read it from the model)."""
        if view.num_ranks != self.model.view.num_ranks:
            raise ValueError(f"a view of {view.num_ranks} ranks does not fit a session of {self.model.view.num_ranks}")
        self.model.view = view

    @property
    def phase(self) -> EnginePhase:
        return self.model.view.phase

    @property
    def rebalance_phase(self) -> RebalancePhase:
        return self.model.view.rebalance

    @property
    def shares(self) -> bool:
        """Whether moves go through the daemons' chunk protocol (the spec's ``eshare``)."""
        return self.model.view.shares

    @property
    def role(self) -> str:
        """``primary``, or a standby's ``warming``, ``parked``, ``promoted``, ``failed``."""
        return self.model.view.role

    @property
    def standby_parked(self) -> bool:
        """A warm standby that is parked (or claiming): it runs no forward pass."""
        return self.model.is_parked()

    @property
    def standby_promoted(self) -> bool:
        """A warm standby that took over: the primary now."""
        return self.model.is_promoted()

    def layout_to_install(self) -> Rows | None:
        """The map the engine routes with when startup adopted the daemons' (None: its own metadata
        stays as it is); a ``Ready``'s ``install`` carries it where the engine must act on it."""
        outcome = self.model.view.outcome
        if outcome is None or outcome.kind != "adopt" or not isinstance(outcome.record, LayoutRecord):
            return None
        return outcome.record.rows

    def fetch_claim(self, rank: int) -> messages.FetchLayoutField | None:
        """The ``expert_layout`` field of rank ``rank``'s ``fetch_state``: the layout the engine
        routes with, when that rank holds a session of a daemon that keeps a record."""
        v = self.model.view
        finding = v.findings[rank]
        if v.phase != "load" or v.tokens[rank] is None or v.digest is None:
            return None
        if finding is None or finding.record is None:
            return None
        return messages.FetchLayoutField(v.engine_id, self._token(rank), v.version, v.digest)

    def next_request(self, rank: int, rows: Rows | None = None) -> messages.LayoutRequest | None:
        """What rank ``rank`` sends its daemon next, in the session's state now (None: nothing now); the
        ``send`` of the ranks' ``Ready``. ``rows``: a rejoin's map, when the record to rejoin came as a
        stamp (the ranks gather it: ``RejoinRowsGathered``)."""
        v, m = self.model.view, self.model
        if v.phase == "start":
            finding = v.findings[rank]
            if finding is None:
                layout = self.layout
                return messages.AttachRequest(v.engine_id, None if layout is None else layout.initial_digest)
            if m.waits(rank):
                return POLL
            if m.to_rejoin(rank):
                return self._rejoin_request(rank, rows)
            return None
        if v.rebalance == "beginning" and v.begins[rank] is None:
            return messages.BeginRequest(v.engine_id, self._token(rank), v.version, v.chunk)
        if v.rebalance == "aborting" and m.began_here(rank):
            return messages.AbortRequest(v.engine_id, self._token(rank))
        if v.rebalance in ("moving", "committing") and m.to_commit(rank):
            moved = v.moved_rows if v.rebalance == "committing" else self._moved
            if moved is None:
                return None
            return messages.CommitRequest(
                v.engine_id, self._token(rank), v.chunk, tuple(tuple(moved[layer]) for layer in v.chunk)
            )
        if v.claims and m.next_to_park() == rank:  # a warm standby's (its role on every rank's daemon)
            return messages.ParkRequest(v.engine_id, self._token(rank))
        if v.claims and m.may_claim(rank):
            return messages.ClaimRequest(v.engine_id, self._token(rank))
        return None

    def _sent(self, rank: int, then: Callable[[Any, float], Event], **kwargs: Any) -> Ready:
        """Rank ``rank``'s next request (``next_request``), its reply made into ``then``'s event."""
        request = self.next_request(rank)
        self._require(request is not None, f"rank {rank} has no request to send")
        assert request is not None
        return sending(request, then, **kwargs)

    # -- the one step function ----------------------------------------------------------------

    def step(self, event: Event) -> Ready:
        """Take what happened (``event``) and say what this rank does next."""
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise SessionError(f"not an event of the engine's session: {type(event).__name__}")
        return handler(self, event)

    def take(self, event: str, **arguments: Any) -> Any:
        """Take one event of whichever machine declares it, with its arguments: a trace checker
        replays an engine rank's trace with it (its lines are the machines' events ``step`` fired)."""
        for table in (self._startup, self._rebalance, self._standby):
            if event in table.events:
                return self._fire(table, event, **arguments)
        raise SessionError(f"no engine machine declares event {event!r}")

    def _fire(self, table: Declared, event: str, **kwargs: Any) -> Any:
        result = table.fire(self.model, event, **kwargs)
        for observer in self.observers:
            observer(event, kwargs, result, self.model.view)
        return result

    def _token(self, rank: int) -> str:
        token = self.model.view.tokens[rank]
        if token is None:
            raise SessionError(f"rank {rank} holds no session token of engine {self.model.view.engine_id!r}")
        return token

    def _require(self, ok: bool, what: str) -> None:
        if not ok:
            raise SessionError(f"engine {self.model.view.engine_id!r}: {what}")

    # -- startup (docs/protocol.md §5) ------------------------------------------------------

    def _on_started(self, e: Started) -> Ready:
        self._rank = e.rank
        self._initial_rows = e.initial_rows
        then = lambda reply, now: Attached(e.rank, reply, now)  # noqa: E731
        return self._sent(e.rank, then, attach=True, on_error=self._failed(e.rank))

    @staticmethod
    def _failed(rank: int) -> Callable[[str], Event]:
        return lambda detail: Failed(rank, detail)

    def _on_attached(self, e: Attached) -> Ready:
        reply = e.reply
        if isinstance(reply, Unanswered):
            detail = f"{self.socket or 'its socket'}: {reply.detail}"
            finding = RankFinding.no_daemon(e.rank, detail) if reply.absent else RankFinding.unreachable(e.rank, detail)
            return self._found(e.rank, finding, None, e.now_s)
        token = None
        if isinstance(reply, Mapping) and reply.get("status") == Status.OK.value:
            session = reply.get("session")
            token = session if isinstance(session, str) else None
        return self._found(e.rank, RankFinding.from_attach_reply(e.rank, reply), token, e.now_s)

    def _found(self, rank: int, finding: RankFinding, token: str | None, now_s: float) -> Ready:
        step = self._fire(self._startup, "attach", rank=rank, finding=finding, token=token)
        self._wait_since[rank] = now_s
        return self._waiting_or_gathering(rank, step)

    def _waiting_or_gathering(self, rank: int, step: Step) -> Ready:
        """A rank that waits polls again; one whose finding is made joins the all-gather of findings."""
        if step.go is Go.PAUSE:
            return sending(
                POLL,
                lambda reply, now: Polled(rank, reply, now),
                after_s=self.poll_interval_s,
                done=step,
                on_error=self._failed(rank),
            )
        return self._gather_finding(rank)

    def _gather_finding(self, rank: int) -> Ready:
        found = self.model.view.findings[rank]
        self._require(found is not None, f"rank {rank} found nothing yet")
        assert found is not None
        return gathering(found.to_wire(), lambda findings, now: FindingsGathered(_findings(findings)))

    def _on_polled(self, e: Polled) -> Ready:
        waited = e.now_s - self._wait_since.get(e.rank, 0.0)
        if waited >= self.wait_timeout_s:
            self._fire(self._startup, "timeout", rank=e.rank, waited_s=waited)
            return self._gather_finding(e.rank)
        reply = None if isinstance(e.reply, Unanswered) else e.reply
        finding = RankFinding.from_query_reply(e.rank, reply)
        if isinstance(e.reply, Unanswered):
            finding = RankFinding.unreachable(e.rank, f"{self.socket or 'its socket'}: {e.reply.detail}")
        step = self._fire(self._startup, "poll", rank=e.rank, finding=finding)
        return self._waiting_or_gathering(e.rank, step)

    def _on_failed(self, e: Failed) -> Ready:
        """An error in the rank's own steps: an unreadable finding, taken over the one it had, and gathered."""
        finding = RankFinding(e.rank, "unreadable", detail=f"engine-side error: {e.detail}")
        if self.model.view.findings[e.rank] is None:
            self._fire(self._startup, "attach", rank=e.rank, finding=finding, token=None)
            return self._gather_finding(e.rank)
        return gathering(finding.to_wire(), lambda findings, now: FindingsGathered(_findings(findings)))

    def _on_findings_gathered(self, e: FindingsGathered) -> Ready:
        self._fire(self._startup, "gather", findings=tuple(e.findings))
        self._require(self.layout is not None, "agree needs the engine's own layout")
        step = self._fire(self._startup, "agree")
        if step.go is Go.STOP:
            return Ready(close=True, done=step)
        if step.go is Go.PAUSE:  # some daemons started again from disk: they rejoin at the others' record
            return gathering(self._rejoin_rows_held(), lambda rows, now: RejoinRowsGathered(tuple(rows)), done=step)
        return Ready(install=self.layout_to_install(), done=step)

    def _rejoin_target(self) -> LayoutRecord | RecordStamp | None:
        targets = [f.record for f in self.model.view.findings if f is not None and f.kind == "rejoin"]
        return targets[0] if targets else None

    def _rejoin_rows_held(self) -> Rows | None:
        """The map of the record to rejoin at, when this process holds it (its daemon's record is it): the
        all-gathered findings carry only its digest, so the ranks gather it from one that does."""
        target = self._rejoin_target()
        held = [f.record for f in self.model.view.findings if f is not None and isinstance(f.record, LayoutRecord)]
        return next((r.rows for r in held if target is not None and r.digest == target.digest), None)

    def _on_rejoin_rows_gathered(self, e: RejoinRowsGathered) -> Ready:
        rank = self._this_rank()
        rows = next((r for r in e.rows if r is not None), None)
        target = self._rejoin_target()
        initial = self.layout is not None and target is not None and target.digest == self.layout.initial_digest
        if rows is None and initial:
            rows = self._initial_rows  # a daemon leaves the map out when it is the engine's own initial one
        request = self.next_request(rank, rows)
        if request is None:  # this rank's daemon keeps its record: it gathers its finding again
            return self._gather_finding(rank)
        return sending(request, lambda reply, now: RejoinAnswered(rank, reply, now), on_error=self._failed(rank))

    def _rejoin_request(self, rank: int, rows: Rows | None) -> messages.RejoinRequest:
        """Rank ``rank``'s rejoin request: the target's version, digest and map (``rows``, needed only
        when the target came as a stamp; checked against its digest)."""
        target = self.model.view.findings[rank]
        self._require(target is not None and target.kind == "rejoin", f"rank {rank} has no rejoin to ask")
        assert target is not None and target.record is not None
        record = target.record
        if isinstance(record, LayoutRecord):
            rows = record.rows
        self._require(rows is not None, f"rank {rank}: the rows of version {record.version} are needed to rejoin")
        assert rows is not None
        self._require(
            layout_digest(rows) == record.digest,
            f"rank {rank}: the rows given do not have the digest of version {record.version}",
        )
        return messages.RejoinRequest(self.model.view.engine_id, self._token(rank), record.version, record.digest, rows)

    def _on_rejoin_answered(self, e: RejoinAnswered) -> Ready:
        reply = None if isinstance(e.reply, Unanswered) else e.reply
        step = self._fire(self._startup, "rejoin", rank=e.rank, reply=reply)
        self._wait_since[e.rank] = e.now_s
        return self._waiting_or_gathering(e.rank, step)

    # -- loading -------------------------------------------------------------------------

    def _on_fetched(self, e: Fetched) -> Ready:
        return Ready(done=self._fire(self._startup, "fetch", rank=e.rank, reply=e.reply))

    def _on_loads_gathered(self, e: LoadsGathered) -> Ready:
        """The ranks' gathered load results: a warm standby parks once every rank serves (then its ranks
        park in rank order)."""
        step = self._fire(self._startup, "loads", loaded=tuple(bool(flag) for flag in e.loaded))
        if not self.model.view.claims:  # a primary: nothing parks
            return Ready(done=step)
        if step.go is not Go.PROCEED:
            return Ready(done=Step.stop(step.reason, f"a warm standby parks once it serves: {step.message}"))
        return self._park_round()

    # -- rebalance (docs/protocol.md §6) ----------------------------------------------------

    def _on_rebalance_asked(self, e: RebalanceAsked) -> Ready:
        self._rank = e.rank
        self._fire(self._rebalance, "install_checked", missing=e.missing_hooks)
        if self.model.view.mode is None:  # the first rebalance: where every rank's weights came from
            return gathering(e.source, lambda sources, now: SourcesGathered(tuple(sources), e.elastic_ep))
        return Ready(done=self._fire(self._rebalance, "rebalance_round"))

    def _on_sources_gathered(self, e: SourcesGathered) -> Ready:
        self._fire(self._rebalance, "start", sources=tuple(e.sources), elastic_ep=e.elastic_ep)
        return Ready(done=self._fire(self._rebalance, "rebalance_round"))

    def _on_chunk_asked(self, e: ChunkAsked) -> Ready:
        self._rank = e.rank
        self._fire(self._rebalance, "chunk", layers=tuple(int(layer) for layer in e.layers))
        return self._sent(e.rank, lambda reply, now: BeginAnswered(e.rank, reply))

    def _on_begin_answered(self, e: BeginAnswered) -> Ready:
        """Rank ``rank``'s begin answer and its answer to the last commit travel in one all-gather."""
        owed = self._owed_answer(e.rank)
        answer = RankAnswer.of(None if isinstance(e.reply, Unanswered) else e.reply)
        self._fire(self._rebalance, "begin", rank=e.rank, answer=answer, owed=owed)
        return gathering((answer, owed), lambda answers, now: BeginsGathered(tuple(answers)))

    def _owed_answer(self, rank: int) -> RankAnswer | None:
        owed = self.model.view.owed
        return owed[rank] if owed else None

    def _on_begins_gathered(self, e: BeginsGathered) -> Ready:
        """Every rank's begin answer (each rank took its own), then the one decision; a rank whose begin
        was ok sends its abort when the chunk does not move (each rank counts its peers' aborts: they run
        the same code on the same answers)."""
        for rank, (answer, owed) in enumerate(e.answers):
            if self.model.view.begins[rank] is None:
                self._fire(self._rebalance, "begin", rank=rank, answer=RankAnswer.of(answer), owed=owed)
        step = self._fire(self._rebalance, "decide")
        if step.go is Go.PROCEED:
            return Ready(move=True, then=lambda rows, now: Moved(self._this_rank(), rows), done=step)
        abort = self.next_request(self._this_rank())
        for other in range(self.model.view.num_ranks):
            if self.model.view.rebalance == "aborting" and self.model.began_here(other):
                self._fire(self._rebalance, "abort", rank=other)
        return Ready(send=abort, done=step)

    def _on_decided(self, e: Decided) -> Ready:
        """The one decision on the begin answers taken one by one (the spec's Decide: the mirror's)."""
        return Ready(done=self._fire(self._rebalance, "decide"))

    def _on_aborted(self, e: Aborted) -> Ready:
        """One rank's abort, as the spec takes them: one step each (the mirror's)."""
        self._fire(self._rebalance, "abort", rank=e.rank)
        return NOTHING

    def _on_moved(self, e: Moved) -> Ready:
        """The commit goes out with the chunk's rows, and the engine's whole map is read, checked and
        hashed when its answer is taken (``CommitAnswered``): while the daemon records it. sglang's move
        already routes with the moved map, which is what the daemon's memory holds, whatever it answers."""
        self._require(self.model.view.rebalance == "moving", f"rank {e.rank}: a move outside a chunk")
        self._moved = e.rows
        return self._sent(e.rank, lambda reply, now: CommitAnswered(e.rank, reply), read_later=True)

    def _on_commit_answered(self, e: CommitAnswered) -> Ready:
        """The commit's answer: the move taken first (once per chunk), then this rank's answer; the chunk
        ends at once on a rank, which knows only its own answer until the next all-gather."""
        if self.model.view.rebalance == "moving":
            moved, self._moved = self._moved, None
            self._require(moved is not None, "a commit's answer before the chunk moved")
            assert moved is not None
            self._fire(self._rebalance, "move", rows=moved)
        answer = RankAnswer.of(None if isinstance(e.reply, Unanswered) else e.reply)
        self._fire(self._rebalance, "commit", rank=e.rank, answer=answer)
        return Ready(next=ChunkEnded())

    def _on_chunk_ended(self, e: ChunkEnded) -> Ready:
        return Ready(done=self._fire(self._rebalance, "committed"))

    def _on_rebalance_ended(self, e: RebalanceEnded) -> Ready:
        """The rebalance's end: the last chunk's commits, when a check is owed, get their all-gather."""
        if not self.model.view.owed:
            return NOTHING
        return gathering(self._owed_answer(e.rank), lambda answers, now: OwedGathered(tuple(answers)))

    def _on_owed_gathered(self, e: OwedGathered) -> Ready:
        self._fire(self._rebalance, "owed_gathered", answers=tuple(e.answers))
        return Ready(done=self._fire(self._rebalance, "verify"))

    # -- a warm standby (docs/protocol.md §10) -----------------------------------------------

    def _on_park_asked(self, e: ParkAsked) -> Ready:
        self._rank = e.rank
        return gathering(e.rank in self.model.view.served, lambda loaded, now: LoadsGathered(tuple(loaded)))

    def _park_round(self) -> Ready:
        """The ranks park in rank order, each rank's reply all-gathered before the next parks; then the
        gathered notices say whether to claim at once."""
        rank = self._this_rank()
        parker = self.model.next_to_park()
        if parker is None:
            step = self._fire(self._standby, "notices")
            if step.go is Go.PROCEED:  # nobody to wait for: claim at once
                return self._claim_round()
            return Ready(done=step)
        if parker != rank:
            return gathering(None, lambda replies, now: ParksGathered(parker, tuple(replies)))
        # A notice read before this park answers an older one: the reader forgets it.
        return self._sent(rank, lambda reply, now: ParkAnswered(rank, reply), forget_notices=True)

    def _on_park_answered(self, e: ParkAnswered) -> Ready:
        reply = None if isinstance(e.reply, Unanswered) else e.reply
        step = self._take_park(e.rank, reply)
        return gathering(reply, lambda replies, now: ParksGathered(e.rank, tuple(replies)), done=step)

    def _take_park(self, rank: int, reply: object) -> Step:
        notified = isinstance(reply, Mapping) and self.model.view.engine_id in (reply.get("notified") or ())
        return self._fire(self._standby, "park", rank=rank, notified=notified)

    def _on_parks_gathered(self, e: ParksGathered) -> Ready:
        if self.model.next_to_park() == e.parker:  # the parker's own process took its reply already
            self._take_park(e.parker, e.replies[e.parker])
        return self._park_round()

    def _on_noticed(self, e: Noticed) -> Ready:
        return Ready(done=self._fire(self._standby, "notice", rank=e.rank))

    def _on_take_over_asked(self, e: TakeOverAsked) -> Ready:
        """Every rank waits (bounded) for its own notice, then the notices are all-gathered."""
        self._rank = e.rank
        if not self.model.parked_here(e.rank):  # this rank has its notice (or its grant) already
            return gathering(True, lambda noticed, now: NoticesGathered(tuple(noticed)))
        return Ready(await_notice_s=NOTICE_WAIT_S, then=lambda got, now: NoticeAwaited(e.rank, bool(got)))

    def _on_notice_awaited(self, e: NoticeAwaited) -> Ready:
        return gathering(e.got, lambda noticed, now: NoticesGathered(tuple(noticed)))

    def _on_notices_gathered(self, e: NoticesGathered) -> Ready:
        for rank, got in enumerate(e.noticed):
            if got:
                self._fire(self._standby, "notice", rank=rank)
        step = self._fire(self._standby, "notices")
        if step.go is not Go.PROCEED:  # some daemon has not told this standby yet: ask again, each rank waiting
            return Ready(done=step, repeat=True)
        return self._claim_round()

    def _claim_round(self) -> Ready:
        """The ranks claim in rank order, each reply all-gathered before the next claims; then promote."""
        rank = self._this_rank()
        claimer = self.model.next_to_claim()
        if claimer is None:
            return self._promote()
        if claimer != rank:
            return gathering(None, lambda replies, now: ClaimsGathered(claimer, tuple(replies)))
        return self._sent(rank, lambda reply, now: ClaimAnswered(rank, reply))

    def _on_claim_answered(self, e: ClaimAnswered) -> Ready:
        reply = None if isinstance(e.reply, Unanswered) else e.reply
        step = self._fire(self._standby, "claim", rank=e.rank, reply=reply)
        return gathering(reply, lambda replies, now: ClaimsGathered(e.rank, tuple(replies)), done=step)

    def _on_claims_gathered(self, e: ClaimsGathered) -> Ready:
        if self.model.next_to_claim() == e.claimer:  # the claimer's own process took its reply already
            self._fire(self._standby, "claim", rank=e.claimer, reply=e.replies[e.claimer])
        return self._claim_round()

    def _on_claims_ended(self, e: ClaimsEnded) -> Ready:
        """The claims taken one by one, then the promotion (the spec's Promote: the mirror's)."""
        return Ready(done=self._fire(self._standby, "promote"))

    def _promote(self) -> Ready:
        """The gathered claims: promoted (route with the records' map, then unpark), failed (the reason), or
        park again (another standby won)."""
        step = self._fire(self._standby, "promote")
        if step.go is Go.PAUSE:
            return self._park_round()
        if step.go is Go.STOP:
            return Ready(done=step)
        return Ready(install=self.layout_to_install(), done=step)

    # -- which rank this process is --------------------------------------------------------

    _rank: int | None = None

    def _this_rank(self) -> int:
        assert self._rank is not None, "the session's rank is known from its first event"
        return self._rank


def _findings(wires: Sequence[object]) -> tuple[RankFinding, ...]:
    return tuple(w if isinstance(w, RankFinding) else RankFinding.from_wire(w) for w in wires)  # type: ignore[arg-type]


_HANDLERS: dict[type, Callable[[EngineSession, Any], Ready]] = {
    Started: EngineSession._on_started,
    Attached: EngineSession._on_attached,
    Polled: EngineSession._on_polled,
    Failed: EngineSession._on_failed,
    FindingsGathered: EngineSession._on_findings_gathered,
    RejoinRowsGathered: EngineSession._on_rejoin_rows_gathered,
    RejoinAnswered: EngineSession._on_rejoin_answered,
    Fetched: EngineSession._on_fetched,
    LoadsGathered: EngineSession._on_loads_gathered,
    RebalanceAsked: EngineSession._on_rebalance_asked,
    SourcesGathered: EngineSession._on_sources_gathered,
    ChunkAsked: EngineSession._on_chunk_asked,
    BeginAnswered: EngineSession._on_begin_answered,
    BeginsGathered: EngineSession._on_begins_gathered,
    Decided: EngineSession._on_decided,
    Aborted: EngineSession._on_aborted,
    Moved: EngineSession._on_moved,
    CommitAnswered: EngineSession._on_commit_answered,
    ChunkEnded: EngineSession._on_chunk_ended,
    RebalanceEnded: EngineSession._on_rebalance_ended,
    OwedGathered: EngineSession._on_owed_gathered,
    ParkAsked: EngineSession._on_park_asked,
    ParkAnswered: EngineSession._on_park_answered,
    ParksGathered: EngineSession._on_parks_gathered,
    Noticed: EngineSession._on_noticed,
    TakeOverAsked: EngineSession._on_take_over_asked,
    NoticeAwaited: EngineSession._on_notice_awaited,
    NoticesGathered: EngineSession._on_notices_gathered,
    ClaimAnswered: EngineSession._on_claim_answered,
    ClaimsGathered: EngineSession._on_claims_gathered,
    ClaimsEnded: EngineSession._on_claims_ended,
}


__all__ = [
    "DEFAULT_POLL_INTERVAL_S",
    "DEFAULT_WAIT_TIMEOUT_S",
    "NOTICE_WAIT_S",
    "POLL",
    "EnginePhase",
    "EngineSession",
    "EngineView",
    "Go",
    "RebalancePhase",
    "SessionError",
    "Step",
    "fetch_refusal",
]
