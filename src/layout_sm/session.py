"""The engine side of the protocol as one object: what every rank of an engine runs, and what the mirror drives.

``EngineSession`` plays the part of etcd raft's ``RawNode``: it never touches a socket, a
collective or sglang. Its caller (the plugin's hooks, the mirror, a test) hands it what the ranks
found and what the daemons answered; each step returns one ``Step`` (``layout_sm.engine``):
``proceed`` (go on), ``pause`` (not now: poll again, or end this rebalance) or ``stop`` (for good),
with the reason, a severity and a message for the operator. The requests to send come from
the session too:

- startup (docs/protocol.md §5): the attach request; ``attached`` says proceed (all-gather the
  finding) or pause (poll with ``poll_request`` until ``polled`` says proceed, or ``timed_out``);
  then ``gathered`` and ``agree``: proceed (adopt ``layout_to_install``, or keep the engine's own)
  or stop;
- loading: the ``expert_layout`` claim of each rank's ``fetch_state``; ``fetched`` says stop for a
  refusal; ``loaded_all`` takes the ranks' gathered load results;
- rebalance (§6): ``install_checked`` (hooks sglang did not apply turn it off), ``start_rebalance``
  and each ``rebalance`` say move (``shares``: through the chunk protocol; otherwise sglang's own),
  pause (a warm standby) or stop; per chunk the begin request of each rank, then ``begun_all``
  (with the last chunk's ``owed_answer`` of every rank: one all-gather checks that chunk and
  begins this one): proceed, pause or stop (``abort_request`` for a rank whose begin was ok); the
  commit request of each rank with its rows, ``committed`` and ``chunk_committed`` (no
  collective); at the end of a rebalance that ``owes_check``, ``verify``: proceed or stop;
- a warm standby (§10): the rank that parks next (``next_to_park``) and its park request; the
  gathered notices (``noticed_all``): claim or wait; the rank that claims next (``next_to_claim``,
  None once the round ended) and its claim request; ``promote``.

The session's state is its machines' model, ``EngineState``, whose one frozen ``EngineView``
``view()`` returns and ``restore(view)`` replaces: the mirror explores immutable states with one
reused session, as it does with ``DaemonMachine``. Every step is an event of ``StartupMachine`` or
``RebalanceMachine``, taken from their declarations by ``layout_sm.declared`` (the tests and the
mirror also drive the same classes through python-statemachine's own engine, the reference, with
``tools.mirror.reference.ReferenceEngineSession``); an event their transitions do not allow raises
``TransitionNotAllowed``.

In an engine every rank process keeps its own session for the whole engine. It knows its own
session token only and learns the other ranks' findings and replies from the all-gathers; every
rank hands its session the same gathered lists, so every rank takes the same steps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from statemachine import StateMachine

from layout_sm import messages
from layout_sm.declared import Declared
from layout_sm.engine import (
    AnyReply,
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
from layout_sm.reasons import Status
from layout_sm.record import LayoutRecord, Rows, layout_digest

POLL = messages.QueryRequest(include_map=True)


class SessionError(RuntimeError):
    """The caller asked the session for a request its state does not allow (a bug in the caller)."""


class EngineSession:
    """The protocol state and steps of one engine (see the module docstring)."""

    startup_machine: type[StateMachine] = StartupMachine
    rebalance_machine: type[StateMachine] = RebalanceMachine
    standby_machine: type[StateMachine] = StandbyMachine
    # Told of every event taken (event, its arguments, its result, the view after): the engine's trace.
    observer: Callable[[str, Mapping[str, Any], Any, EngineView], None] | None = None

    def __init__(
        self,
        engine_id: str,
        num_ranks: int,
        layout: EngineLayout | None,
        *,
        standby: bool = False,
    ) -> None:
        """``layout`` is the engine's own (None only for an engine that never attaches); ``standby``:
        started as a warm standby (docs/protocol.md §10)."""
        if num_ranks < 1:
            raise ValueError(f"an engine has at least one rank, not {num_ranks}")
        self.layout = layout
        self.model = EngineState(EngineView.fresh(engine_id, num_ranks), layout)
        self._startup = Declared.of(self.startup_machine, EngineState, "phase")
        self._rebalance = Declared.of(self.rebalance_machine, EngineState, "rebalance")
        self._standby = Declared.of(self.standby_machine, EngineState, "role")
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

    def _fire(self, table: Declared, event: str, **kwargs: Any) -> Any:
        result = table.fire(self.model, event, **kwargs)
        if self.observer is not None:
            self.observer(event, kwargs, result, self.model.view)
        return result

    def take(self, event: str, **arguments: Any) -> Any:
        """Take ``event`` of whichever machine declares it, with its arguments (a trace checker
        replays an engine rank's trace with it); every step method below is one such event."""
        for table in (self._startup, self._rebalance, self._standby):
            if event in table.events:
                return self._fire(table, event, **arguments)
        raise SessionError(f"no engine machine declares event {event!r}")

    def _token(self, rank: int) -> str:
        token = self.model.view.tokens[rank]
        if token is None:
            raise SessionError(f"rank {rank} holds no session token of engine {self.model.view.engine_id!r}")
        return token

    def _require(self, ok: bool, what: str) -> None:
        if not ok:
            raise SessionError(f"engine {self.model.view.engine_id!r}: {what}")

    # -- startup (docs/protocol.md §5) ------------------------------------------------------

    def attach_request(self) -> messages.AttachRequest:
        """What every rank sends its own daemon first (with the digest of the engine's own initial
        layout: a record of that digest needs no map)."""
        layout = self.layout
        return messages.AttachRequest(self.model.view.engine_id, None if layout is None else layout.initial_digest)

    @property
    def poll_request(self) -> messages.QueryRequest:
        """What a rank sends while its step says pause."""
        return POLL

    def attached(self, rank: int, reply: object) -> Step:
        """Rank ``rank``'s daemon answered the attach (``reply`` as it came off the wire)."""
        token = None
        if isinstance(reply, Mapping) and reply.get("status") == Status.OK.value:
            session = reply.get("session")
            token = session if isinstance(session, str) else None
        return self.found(rank, RankFinding.from_attach_reply(rank, reply), token)

    def found(self, rank: int, finding: RankFinding, token: str | None = None) -> Step:
        """What rank ``rank`` found (also without a reply: no daemon, an unreachable one)."""
        return self._fire(self._startup, "attach", rank=rank, finding=finding, token=token)

    def polled(self, rank: int, reply: object) -> Step:
        """A waiting rank's poll (``reply`` to ``poll_request``; None when it could not be sent).

        While the move is still pending the rank keeps the finding it had (the spec's ``Poll``
        changes nothing then); once it ended, the poll is the rank's finding.
        """
        return self._fire(self._startup, "poll", rank=rank, finding=RankFinding.from_query_reply(rank, reply))

    def timed_out(self, rank: int, waited_s: float) -> Step:
        """The wait of rank ``rank`` ran past the timeout."""
        return self._fire(self._startup, "timeout", rank=rank, waited_s=waited_s)

    def finding(self, rank: int) -> RankFinding:
        """Rank ``rank``'s finding, to all-gather once its step says proceed."""
        found = self.model.view.findings[rank]
        self._require(found is not None, f"rank {rank} found nothing yet")
        assert found is not None
        return found

    def gathered(self, findings: Sequence[RankFinding]) -> None:
        """The all-gathered findings, one per rank in rank order (this rank's own among them)."""
        self._fire(self._startup, "gather", findings=tuple(findings))

    def agree(self) -> Step:
        """The one decision every rank takes on the gathered findings: proceed (adopt or keep) or stop."""
        self._require(self.layout is not None, "agree needs the engine's own layout")
        return self._fire(self._startup, "agree")

    def layout_to_install(self) -> Rows | None:
        """The map the engine must route with before it loads, when startup adopted the daemons'
        (None: the engine's own metadata stays as it is)."""
        outcome = self.model.view.outcome
        if outcome is None or outcome.kind != "adopt" or not isinstance(outcome.record, LayoutRecord):
            return None
        return outcome.record.rows

    # -- a fresh daemon's rejoin (docs/protocol.md §5) --------------------------------------

    def rejoin_target(self) -> LayoutRecord | RecordStamp | None:
        """The record the fresh daemons rejoin at, once ``agree`` said so (pause, reason ``rejoin``);
        None when no rank is to rejoin. A stamp when no rank of this process holds its map: the
        caller then gathers the rows from a rank whose daemon holds it (``rejoin_request``'s ``rows``)."""
        targets = [f.record for f in self.model.view.findings if f is not None and f.kind == "rejoin"]
        return targets[0] if targets else None

    def rejoins(self, rank: int) -> bool:
        """Rank ``rank`` is to ask its daemon to rejoin (the startup machine's guard ``to_rejoin``)."""
        return self.model.to_rejoin(rank)

    def rejoin_request(self, rank: int, rows: Rows | None = None) -> messages.RejoinRequest:
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

    def rejoined(self, rank: int, reply: object) -> Step:
        """Rank ``rank``'s daemon answered its rejoin request: pause (granted: poll with ``poll_request``
        until ``polled`` says proceed, as for a repair) or proceed (refused: gather, then ``agree`` fails)."""
        return self._fire(self._startup, "rejoin", rank=rank, reply=reply)

    # -- loading --------------------------------------------------------------------------

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

    def fetched(self, rank: int, reply: object) -> Step:
        """Rank ``rank``'s ``fetch_state`` reply: stop for a ``layout_refused`` one (``fetch_refusal``)."""
        return self._fire(self._startup, "fetch", rank=rank, reply=reply)

    def loaded_all(self, loaded: Sequence[bool]) -> Step:
        """The ranks' gathered load results (all-gathered, in rank order: whether each rank's daemon
        served it): proceed (every rank loaded from its daemon) or pause (some rank did not)."""
        return self._fire(self._startup, "loads", loaded=tuple(bool(flag) for flag in loaded))

    # -- rebalance (docs/protocol.md §6) ----------------------------------------------------

    @property
    def rebalance_started(self) -> bool:
        return self.model.view.mode is not None

    def start_rebalance(self, sources: Sequence[str | None], *, elastic_ep: bool = False) -> Step:
        """How this engine rebalances, from where every rank's weights came (all-gathered; None or
        anything but "daemon" and "disk" is unknown, and fails safe)."""
        return self._fire(self._rebalance, "start", sources=tuple(sources), elastic_ep=elastic_ep)

    def install_checked(self, missing: str | None) -> None:
        """Whether sglang applied every hook of the plugin (``missing``: the error naming the hooks it
        did not apply, None when all are in place). Missing hooks turn rebalancing off for good."""
        self._fire(self._rebalance, "install_checked", missing=missing)

    def rebalance(self) -> Step:
        """One rebalance of sglang's EPLB begins: proceed (``shares`` says through the chunk protocol
        or sglang's own), pause (a warm standby, until it is promoted) or stop (off). It changes
        nothing: the mode is known since ``start_rebalance``."""
        self._require(self.model.view.mode is not None, "a rebalance before start_rebalance")
        return self._fire(self._rebalance, "rebalance_round")

    def begin_chunk(self, layers: Sequence[int]) -> None:
        """The next chunk sglang moves (0-based layers); then every rank sends its begin request."""
        self._fire(self._rebalance, "chunk", layers=tuple(layers))

    def begin_request(self, rank: int) -> messages.BeginRequest:
        v = self.model.view
        self._require(v.rebalance == "beginning" and v.begins[rank] is None, f"rank {rank} has no begin to send")
        return messages.BeginRequest(v.engine_id, self._token(rank), v.version, v.chunk)

    def begun(self, rank: int, reply: AnyReply, owed: RankAnswer | None = None) -> None:
        """Rank ``rank``'s daemon answered its begin (None: no reply); ``owed``: that rank's answer to
        the last chunk's commit, gathered with it (None: the one this session holds, if any)."""
        if owed is None:
            owed = self.owed_answer(rank)
        self._fire(self._rebalance, "begin", rank=rank, answer=RankAnswer.of(reply), owed=owed)

    def begun_all(self, replies: Sequence[AnyReply], owed: Sequence[RankAnswer | None] | None = None) -> Step:
        """Every rank's begin reply (all-gathered, in rank order), then ``decide``. ``owed``: every
        rank's ``owed_answer``, gathered in the same all-gather (the last chunk's commits, checked
        here); None where the caller's session holds every rank's already (the mirror's)."""
        for rank, reply in enumerate(replies):
            self.begun(rank, reply, None if owed is None else owed[rank])
        return self._fire(self._rebalance, "decide")

    def decide(self) -> Step:
        """Move, or abort the ranks whose begin was ok and pause (busy) or stop (refused)."""
        return self._fire(self._rebalance, "decide")

    def abort_request(self, rank: int) -> messages.AbortRequest | None:
        """Rank ``rank``'s abort, when the chunk does not go on and its begin was ok (else None)."""
        if self.model.view.rebalance != "aborting" or not self.model.began_here(rank):
            return None
        return messages.AbortRequest(self.model.view.engine_id, self._token(rank))

    def aborted(self, rank: int) -> None:
        """Rank ``rank`` aborted its begun move (abort is idempotent for its owner: always ok).

        The mirror aborts the ranks one step at a time, as the spec does; an engine's ranks use
        ``aborted_all``.
        """
        self._fire(self._rebalance, "abort", rank=rank)

    def aborted_all(self) -> None:
        """Every rank whose begin was ok aborted its own move (each rank counts its peers': they
        run the same code on the same replies)."""
        for rank in range(self.model.view.num_ranks):
            if self.model.view.rebalance == "aborting" and self.model.began_here(rank):
                self.aborted(rank)

    def moved(self, engine_rows: Sequence[Sequence[int]]) -> None:
        """sglang moved the chunk and the device synchronized; ``engine_rows`` is the whole new map
        (kept as immutable rows: the rows sglang did not move are the ones kept before)."""
        self._fire(self._rebalance, "move", rows=engine_rows)

    def commit_request(
        self, rank: int, moved: Sequence[Sequence[int]] | Mapping[int, Sequence[int]] | None = None
    ) -> messages.CommitRequest:
        """Rank ``rank``'s commit: the chunk's rows of the engine's new map.

        ``moved``: the new map's rows by layer (the chunk's at least), when the commit goes out before
        ``moved`` takes the whole map; the engine then checks and hashes its map while the daemon
        records, instead of before it sends. The steps are the same, in the same order: the commit's
        reply is taken after ``moved``, and ``verify`` compares every daemon's digest with the
        engine's own, so rows that changed in between are a failed verification, never a silent one."""
        v = self.model.view
        rows: Sequence[Sequence[int]] | Mapping[int, Sequence[int]]
        if moved is None:
            self._require(
                v.rebalance == "committing" and v.moved_rows is not None and v.commits[rank] is None,
                f"rank {rank} has no commit to send",
            )
            assert v.moved_rows is not None
            rows = v.moved_rows
        else:
            self._require(
                v.rebalance == "moving" and v.commits[rank] is None,
                f"rank {rank} has no commit to send before the move is taken",
            )
            rows = moved
        return messages.CommitRequest(
            v.engine_id, self._token(rank), v.chunk, tuple(tuple(rows[layer]) for layer in v.chunk)
        )

    def committed(self, rank: int, reply: AnyReply) -> None:
        """Rank ``rank``'s daemon answered its commit (None: no reply)."""
        self._answered("commit", rank, reply)

    def chunk_committed(self) -> Step:
        """The chunk ends with no collective: route with the moved map and claim the next version;
        the check of every daemon's record is owed to the next all-gather (``begun_all``'s, or
        ``verify``'s at the end of the rebalance). Always proceeds: the ranks decide together."""
        return self._fire(self._rebalance, "committed")

    @property
    def owes_check(self) -> bool:
        """A committed chunk's check is owed: the rebalance ends with ``verify``'s all-gather."""
        return bool(self.model.view.owed)

    def owed_answer(self, rank: int) -> RankAnswer | None:
        """What rank ``rank`` brings to the next all-gather: its own answer to the last commit (None:
        no check is owed)."""
        owed = self.model.view.owed
        return owed[rank] if owed else None

    def verify(self, owed: Sequence[RankAnswer | None] | None = None) -> Step:
        """The rebalance's end, with a check owed: every daemon recorded the engine's whole map at the
        version it claims (proceed), or rebalancing is off (stop). The engine routes with the moved
        map either way. ``owed`` as for ``begun_all``."""
        if owed is not None:
            self._fire(self._rebalance, "owed_gathered", answers=tuple(owed))
        return self._fire(self._rebalance, "verify")

    def _answered(self, event: str, rank: int, reply: AnyReply) -> None:
        self._fire(self._rebalance, event, rank=rank, answer=RankAnswer.of(reply))

    # -- a warm standby (docs/protocol.md §10) -----------------------------------------------

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

    def next_to_park(self) -> int | None:
        """The rank that parks next (the ranks park in rank order), or None: no rank has a park to send."""
        return self.model.next_to_park()

    def park_request(self, rank: int) -> messages.ParkRequest:
        """Rank ``rank``'s park, after the warmup (every rank has stopped its forward passes), or again."""
        self._require(self.model.to_park(rank), f"rank {rank} has no park to send")
        return messages.ParkRequest(self.model.view.engine_id, self._token(rank))

    def parked(self, rank: int, reply: object) -> Step:
        """Rank ``rank``'s park reply: proceed (claim: it is the notice) or pause (wait for the notice)."""
        notified = isinstance(reply, Mapping) and self.model.view.engine_id in (reply.get("notified") or ())
        return self._fire(self._standby, "park", rank=rank, notified=notified)

    def noticed(self, rank: int) -> Step:
        """Rank ``rank``'s daemon wrote the notice on its attach connection (no unparked engine is left)."""
        return self._fire(self._standby, "notice", rank=rank)

    def awaits_notice(self, rank: int) -> bool:
        """Whether rank ``rank`` is parked without its notice yet (it waits for its daemon's)."""
        return self.model.parked_here(rank)

    def noticed_all(self, noticed: Sequence[bool] = ()) -> Step:
        """The gathered notices (all-gathered, in rank order: whether each rank's reader has its daemon's
        notice; a rank already told keeps it): proceed (every rank has its notice: claim in rank order,
        ``next_to_claim``) or pause (some daemon has not told this standby: wait for its notice)."""
        for rank, got in enumerate(noticed):
            if got:
                self.noticed(rank)
        return self._fire(self._standby, "notices")

    def next_to_claim(self) -> int | None:
        """The rank that claims next, or None: the round of claims has ended (every rank granted, or a
        claim taken or refused: the ranks after it do not claim); then ``promote``."""
        return self.model.next_to_claim()

    def claim_request(self, rank: int) -> messages.ClaimRequest:
        """Rank ``rank``'s claim, once every rank has its notice and the ranks before it were granted."""
        self._require(self.model.may_claim(rank), f"rank {rank} has no claim to send")
        return messages.ClaimRequest(self.model.view.engine_id, self._token(rank))

    def claimed(self, rank: int, reply: object) -> Step:
        """Rank ``rank``'s claim reply (as it came off the wire)."""
        return self._fire(self._standby, "claim", rank=rank, reply=reply)

    def promote(self) -> Step:
        """The gathered claims: proceed (promoted: ``layout_to_install`` is the map to update the metadata
        to, then unpark), stop (failed: the reason), or pause (park again: ``park_request`` per rank)."""
        return self._fire(self._standby, "promote")


__all__ = [
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
