"""The engine side of the protocol as one object: what every rank of an engine runs, and what the mirror drives.

``EngineSession`` plays the part of etcd raft's ``RawNode``: it never touches a socket, a
collective or sglang. Its caller (the plugin's hooks, the mirror, a test) hands it what the ranks
found and what the daemons answered; it says what to do next, as typed values:

- startup (docs/protocol.md §5): the attach request; then ``Wait`` (poll with this query) or
  ``Gather`` (all-gather this finding); then ``agree``: adopt, keep or fail, with the reason;
- loading: the ``expert_layout`` claim of each rank's ``fetch_state``, and whether a reply
  stops the engine;
- rebalance (§6): how a rebalance runs (sglang's own, the chunk protocol, or not at all, and
  why); per chunk the begin request of each rank, then the decision (move, or abort these ranks
  and pause or switch off, with the reason), the commit request of each rank with its rows, and
  the verdict.

It owns one ``StartupMachine`` per rank and the engine's ``RebalanceMachine``; an event that
their transitions do not allow raises ``TransitionNotAllowed``. Everything else it knows is one
frozen ``EngineView``: ``view()`` reads it and ``restore(view)`` loads it, so the mirror explores
immutable states with one reused session, as it does with ``DaemonMachine``.

In an engine every rank process keeps its own session for the whole engine. It knows its own
session token only and learns the other ranks' findings and replies from the all-gathers; every
rank hands its session the same gathered lists, so every rank takes the same steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

from layout_sm.engine import (
    AnyReply,
    ChunkDecision,
    CommitVerdict,
    EngineLayout,
    LoadSource,
    RankAnswer,
    RankFinding,
    RebalanceMachine,
    RebalanceMode,
    StartupMachine,
    StartupOutcome,
    chunk_decision,
    needs_wait,
    rebalance_mode,
    startup_decision,
    verify_commits,
)
from layout_sm.messages import (
    AbortRequest,
    AttachRequest,
    BeginRequest,
    CommitRequest,
    FetchLayoutField,
    QueryRequest,
)
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import Rows

EnginePhase = Literal["start", "load", "run", "failed"]
# The RebalanceMachine's states.
RebalancePhase = Literal["starting", "local", "idle", "beginning", "aborting", "moving", "committing", "off"]
RebalanceRun = Literal["local", "shared", "off"]


class SessionError(RuntimeError):
    """The caller asked the session for a step its state does not allow (a bug in the caller)."""


# -- what the session says to do ------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """Another engine's move is pending on this rank's daemon: send ``poll`` until it ends."""

    rank: int
    poll: QueryRequest
    detail: str


@dataclass(frozen=True)
class Gather:
    """This rank's finding is final: all-gather it, hand the list to ``gathered``, then ``agree``."""

    finding: RankFinding


StartupStep = Wait | Gather


@dataclass(frozen=True)
class Off:
    """Why rebalancing of shared weights is off, for good."""

    reason: Reason
    message: str


# -- the state ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineView:
    """Everything the engine knows about the protocol, as one immutable value.

    Per rank (index = rank): the session token of its attachment, its startup finding, its
    answers to begin and commit. ``rebalance`` is the ``RebalanceMachine`` state.
    """

    engine_id: str
    tokens: tuple[str | None, ...]
    findings: tuple[RankFinding | None, ...]
    phase: EnginePhase = "start"
    outcome: StartupOutcome | None = None
    rows: Rows | None = None  # the map the engine routes with; None: its own initial layout
    version: int = 0  # the layout version it routes with
    digest: str | None = None  # the digest of that map, known once startup agreed
    served: frozenset[int] = frozenset()  # ranks whose fetch_state was served
    mode: RebalanceMode | None = None
    rebalance: RebalancePhase = "starting"
    chunk: tuple[int, ...] = ()  # the layers of the current chunk (0-based)
    begins: tuple[RankAnswer | None, ...] = ()
    decision: ChunkDecision | None = None
    aborted: frozenset[int] = frozenset()
    moved_rows: Rows | None = None  # the engine's whole map after sglang's move of this chunk
    commits: tuple[RankAnswer | None, ...] = ()
    off: Off | None = None

    @classmethod
    def fresh(cls, engine_id: str, num_ranks: int) -> EngineView:
        nothing = (None,) * num_ranks
        return cls(engine_id, nothing, nothing, begins=nothing, commits=nothing)

    @property
    def num_ranks(self) -> int:
        return len(self.findings)

    @property
    def shares(self) -> bool:
        """Whether this engine may move shared experts now or later (the spec's ``eshare``)."""
        if self.rebalance == "starting":
            return self.outcome is not None and self.outcome.shared_rebalance
        if self.rebalance == "aborting":
            return self.decision is not None and self.decision.kind == "pause"
        return self.rebalance not in ("local", "off")

    def bare(self) -> EngineView:
        """This view without what only explains: finding details, reply texts, the messages of
        the outcome, mode and decision, and why rebalancing is off. The spec's engine variables
        keep none of it and no decision reads it (tests/layout_sm/test_session.py), so the mirror
        keeps bare views and one spec state is one mirror state."""
        return replace(
            self,
            findings=tuple(None if f is None else f.without_detail() for f in self.findings),
            outcome=None if self.outcome is None else replace(self.outcome, message=""),
            mode=None if self.mode is None else replace(self.mode, message=""),
            begins=tuple(None if a is None else RankAnswer(a.status, text="") for a in self.begins),
            decision=None if self.decision is None else replace(self.decision, message=""),
            commits=tuple(None if a is None else a.without_text() for a in self.commits),
            off=None,
        )


def fetch_refusal(reply: object) -> str | None:
    """Why a ``fetch_state`` reply stops the engine, or None: a ``layout_refused`` one does (and the
    engine must not load from disk instead: the daemon holds this GPU's weights)."""
    if not isinstance(reply, Mapping) or reply.get("status") != Status.LAYOUT_REFUSED.value:
        return None
    try:
        parsed = Reply.from_wire(reply)
    except ValueError:
        return repr(dict(reply))
    return f"({parsed.reason.value}) {parsed.message}"


def _put(values: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*values[:i], value, *values[i + 1 :])


_DECIDED = {"adopt": "adopted", "keep_own": "kept", "fail": "failed"}


def _startup_state(view: EngineView, rank: int) -> str:
    if view.outcome is not None:
        return _DECIDED[view.outcome.kind]
    finding = view.findings[rank]
    if finding is None:
        return "attaching"
    return "waiting" if needs_wait(finding) else "agreeing"


M = TypeVar("M", StartupMachine, RebalanceMachine)


def _load(machine: M, state: str) -> M:
    """``machine`` put in ``state``. A machine that reached a final state takes no more events,
    so one leaving it is made anew, in that state (python-statemachine's ``start_value``)."""
    if machine.current_state_value == state:
        return machine
    if any(s.final for s in machine.configuration):
        return type(machine)(start_value=state)
    machine.current_state_value = state
    return machine


# -- the session ----------------------------------------------------------------------------


class EngineSession:
    """The protocol state and steps of one engine (see the module docstring)."""

    def __init__(self, engine_id: str, num_ranks: int, layout: EngineLayout | None) -> None:
        """``layout`` is the engine's own (None only for an engine that never attaches)."""
        if num_ranks < 1:
            raise ValueError(f"an engine has at least one rank, not {num_ranks}")
        self.layout = layout
        self._startup = [StartupMachine() for _ in range(num_ranks)]
        self._rebalance = RebalanceMachine()
        self._view = EngineView.fresh(engine_id, num_ranks)

    # -- reading and loading --------------------------------------------------------------

    def view(self) -> EngineView:
        return self._view

    def restore(self, view: EngineView) -> None:
        """Put the session and its machines in ``view``'s state."""
        if view.num_ranks != len(self._startup):
            raise ValueError(f"a view of {view.num_ranks} ranks does not fit a session of {len(self._startup)}")
        self._view = view
        self._startup = [_load(machine, _startup_state(view, rank)) for rank, machine in enumerate(self._startup)]
        self._rebalance = _load(self._rebalance, view.rebalance)

    def _set(self, **changes: Any) -> None:
        self._view = replace(self._view, **changes)

    def _send(self, event: str, **kwargs: Any) -> None:
        """An event of the rebalance machine; its state is what the view keeps."""
        self._rebalance.send(event, **kwargs)
        self._set(rebalance=self._rebalance.current_state_value)

    def _token(self, rank: int) -> str:
        token = self._view.tokens[rank]
        if token is None:
            raise SessionError(f"rank {rank} holds no session token of engine {self._view.engine_id!r}")
        return token

    def _require(self, ok: bool, what: str) -> None:
        if not ok:
            raise SessionError(f"engine {self._view.engine_id!r}: {what}")

    # -- startup (docs/protocol.md §5) ------------------------------------------------------

    def attach_request(self) -> AttachRequest:
        """What every rank sends its own daemon first."""
        return AttachRequest(self._view.engine_id)

    def attached(self, rank: int, reply: object) -> StartupStep:
        """Rank ``rank``'s daemon answered the attach (``reply`` as it came off the wire)."""
        token = None
        if isinstance(reply, Mapping) and reply.get("status") == Status.OK.value:
            session = reply.get("session")
            token = session if isinstance(session, str) else None
        return self.found(rank, RankFinding.from_attach_reply(rank, reply), token)

    def found(self, rank: int, finding: RankFinding, token: str | None = None) -> StartupStep:
        """What rank ``rank`` found (also without a reply: no daemon, an unreachable one)."""
        self._startup[rank].send("found", finding=finding)
        v = self._view
        self._set(tokens=_put(v.tokens, rank, token), findings=_put(v.findings, rank, finding))
        return self._next(rank)

    def polled(self, rank: int, reply: object) -> StartupStep:
        """A waiting rank's poll (``reply`` to the ``Wait``'s query; None when it could not be sent).

        While the move is still pending the rank keeps the finding it had (the spec's ``Poll``
        changes nothing then); once it ended, the poll is the rank's finding.
        """
        finding = RankFinding.from_query_reply(rank, reply)
        self._startup[rank].send("polled", finding=finding)
        if needs_wait(finding):
            return Wait(rank, QueryRequest(include_map=True), finding.detail)
        self._set(findings=_put(self._view.findings, rank, finding))
        return Gather(finding)

    def timed_out(self, rank: int, waited_s: float) -> Gather:
        """The wait of rank ``rank`` ran past the timeout."""
        self._startup[rank].send("timed_out")
        finding = self._view.findings[rank]
        assert finding is not None
        timed = finding.timed_out(waited_s)
        self._set(findings=_put(self._view.findings, rank, timed))
        return Gather(timed)

    def _next(self, rank: int) -> StartupStep:
        finding = self._view.findings[rank]
        assert finding is not None
        if needs_wait(finding):
            return Wait(rank, QueryRequest(include_map=True), finding.detail)
        return Gather(finding)

    def gathered(self, findings: Sequence[RankFinding]) -> None:
        """The all-gathered findings, one per rank in rank order (this rank's own among them).

        What was gathered wins: a rank whose own steps broke off (an error mid-wait) gathered an
        ``unreadable`` finding, and every rank must decide on the same list.
        """
        self._require(len(findings) == len(self._startup), f"{len(findings)} findings for {len(self._startup)} ranks")
        for rank, finding in enumerate(findings):
            if self._view.findings[rank] is None:
                self.found(rank, finding)
            elif self._view.findings[rank] != finding:
                if self._startup[rank].current_state_value == "waiting":
                    self._startup[rank].send("timed_out")  # its wait ended without a poll
                self._set(findings=_put(self._view.findings, rank, finding))

    @property
    def may_agree(self) -> bool:
        """Every rank found something final (none waits): the spec's enabling of ``Agree``."""
        v = self._view
        return v.phase == "start" and all(f is not None and not needs_wait(f) for f in v.findings)

    def agree(self) -> StartupOutcome:
        """The one decision every rank takes on the gathered findings: adopt, keep or fail."""
        self._require(self.may_agree, "agree needs every rank's final finding")
        self._require(self.layout is not None, "agree needs the engine's own layout")
        assert self.layout is not None
        findings = [f for f in self._view.findings if f is not None]
        outcome = startup_decision(findings, self.layout)
        for machine in self._startup:
            machine.send("decided", outcome=outcome)
        if outcome.failed:
            self._set(outcome=outcome, phase="failed")
            return outcome
        record = outcome.record
        self._set(
            outcome=outcome,
            phase="load",
            rows=None if record is None else record.rows,
            version=0 if record is None else record.version,
            digest=self.layout.initial_digest if record is None else record.digest,
        )
        return outcome

    # -- loading --------------------------------------------------------------------------

    def fetch_claim(self, rank: int) -> FetchLayoutField | None:
        """The ``expert_layout`` field of rank ``rank``'s ``fetch_state``: the layout the engine
        routes with, when that rank holds a session of a daemon that keeps a record."""
        v = self._view
        finding = v.findings[rank]
        if v.phase != "load" or v.tokens[rank] is None or v.digest is None:
            return None
        if finding is None or finding.record is None:
            return None
        return FetchLayoutField(v.engine_id, self._token(rank), v.version, v.digest)

    def fetched(self, rank: int, reply: object) -> str | None:
        """Rank ``rank``'s ``fetch_state`` reply; returns why the engine must stop (``fetch_refusal``), or None."""
        refusal = fetch_refusal(reply)
        if refusal is not None:
            self._set(phase="failed")
            return refusal
        status = reply.get("status") if isinstance(reply, Mapping) else None
        if status == Status.OK.value and self._view.phase == "load":
            served = self._view.served | {rank}
            self._set(served=served, phase="run" if len(served) == self._view.num_ranks else "load")
        return None

    # -- rebalance (docs/protocol.md §6) ----------------------------------------------------

    def start_rebalance(self, sources: Sequence[LoadSource], *, elastic_ep: bool = False) -> RebalanceMode:
        """How this engine rebalances, from where every rank's weights came (all-gathered)."""
        mode = rebalance_mode(self._view.outcome, sources, elastic_ep=elastic_ep)
        self._send("start", mode=mode)
        self._set(mode=mode, off=Off(mode.reason, mode.message) if self._view.rebalance == "off" else None)
        return mode

    @property
    def rebalance_started(self) -> bool:
        return self._view.mode is not None

    def rebalance(self) -> RebalanceRun:
        """One rebalance of sglang's EPLB begins: run sglang's own, run the chunk protocol, or none."""
        phase = self._view.rebalance
        if phase == "local":
            self._send("local_rebalance")
            return "local"
        if phase == "off":
            return "off"
        self._require(phase == "idle", f"a rebalance cannot begin while the rebalance phase is {phase}")
        return "shared"

    def begin_chunk(self, layers: Sequence[int]) -> None:
        """The next chunk sglang moves (0-based layers); then every rank sends its begin request."""
        self._send("chunk")
        nothing = (None,) * self._view.num_ranks
        self._set(chunk=tuple(layers), begins=nothing, decision=None, aborted=frozenset(), commits=nothing)

    def begin_request(self, rank: int) -> BeginRequest:
        v = self._view
        self._require(v.rebalance == "beginning" and v.begins[rank] is None, f"rank {rank} has no begin to send")
        return BeginRequest(v.engine_id, self._token(rank), v.version, v.chunk)

    def begun(self, rank: int, reply: AnyReply) -> None:
        """Rank ``rank``'s daemon answered its begin (None: no reply)."""
        v = self._view
        self._require(v.rebalance == "beginning" and v.begins[rank] is None, f"rank {rank} did not send a begin")
        self._set(begins=_put(v.begins, rank, RankAnswer.of(reply)))

    def begun_all(self, replies: Sequence[AnyReply]) -> ChunkDecision:
        """Every rank's begin reply (all-gathered, in rank order), then ``decide``."""
        for rank, reply in enumerate(replies):
            self.begun(rank, reply)
        return self.decide()

    @property
    def may_decide(self) -> bool:
        v = self._view
        return v.rebalance == "beginning" and all(a is not None for a in v.begins)

    def decide(self) -> ChunkDecision:
        """Move, or abort the ranks whose begin was ok and pause (busy) or switch off (refused)."""
        self._require(self.may_decide, "decide needs every rank's begin reply")
        decision = chunk_decision(self._view.begins)
        self._send("begun", decision=decision)
        self._set(decision=decision, off=Off(decision.reason, decision.message) if decision.kind == "disable" else None)
        if self._view.rebalance in ("idle", "off"):
            self._end_chunk()
        return decision

    def _require_begun(self, rank: int) -> None:
        v = self._view
        answer = v.begins[rank]
        self._require(
            v.rebalance == "aborting" and answer is not None and answer.ok and rank not in v.aborted,
            f"rank {rank} has no begun move to abort",
        )

    def abort_request(self, rank: int) -> AbortRequest:
        self._require_begun(rank)
        return AbortRequest(self._view.engine_id, self._token(rank))

    def aborted(self, rank: int) -> None:
        """Rank ``rank`` aborted its begun move (abort is idempotent for its owner: always ok).

        In an engine each rank aborts its own move and counts its peers' (they run the same code
        on the same decision); the mirror aborts them one step at a time, as the spec does.
        """
        self._require_begun(rank)
        v = self._view
        aborted = v.aborted | {rank}
        left = sum(1 for r, a in enumerate(v.begins) if a is not None and a.ok and r not in aborted)
        self._set(aborted=aborted)
        self._send("aborted", decision=v.decision, left=left)
        if left == 0:
            self._end_chunk()

    def moved(self, engine_rows: Sequence[Sequence[int]]) -> None:
        """sglang moved the chunk and the device synchronized; ``engine_rows`` is the whole new map."""
        self._send("moved")
        self._set(moved_rows=tuple(map(tuple, engine_rows)))

    def commit_request(self, rank: int) -> CommitRequest:
        """Rank ``rank``'s commit: the chunk's rows of the engine's new map."""
        v = self._view
        self._require(
            v.rebalance == "committing" and v.moved_rows is not None and v.commits[rank] is None,
            f"rank {rank} has no commit to send",
        )
        assert v.moved_rows is not None
        return CommitRequest(v.engine_id, self._token(rank), v.chunk, tuple(v.moved_rows[layer] for layer in v.chunk))

    def committed(self, rank: int, reply: AnyReply) -> None:
        v = self._view
        self._require(v.rebalance == "committing" and v.commits[rank] is None, f"rank {rank} did not send a commit")
        self._set(commits=_put(v.commits, rank, RankAnswer.of(reply)))

    def committed_all(self, replies: Sequence[AnyReply]) -> CommitVerdict:
        """Every rank's commit reply (all-gathered, in rank order), then ``verify``."""
        for rank, reply in enumerate(replies):
            self.committed(rank, reply)
        return self.verify()

    @property
    def may_verify(self) -> bool:
        v = self._view
        return v.rebalance == "committing" and all(a is not None for a in v.commits)

    def verify(self) -> CommitVerdict:
        """Every daemon recorded the engine's whole new map at one new version, or rebalancing is off.

        The engine routes with the moved map either way.
        """
        self._require(self.may_verify, "verify needs every rank's commit reply")
        v = self._view
        assert v.moved_rows is not None
        verdict = verify_commits(v.commits, v.moved_rows, expected_version=v.version + 1)
        self._send("committed", verdict=verdict)
        self._set(
            rows=v.moved_rows,
            version=verdict.version if verdict.ok and verdict.version is not None else v.version,
            digest=verdict.digest,
            off=None if verdict.ok else Off(verdict.reason, verdict.message),
        )
        self._end_chunk()
        return verdict

    def _end_chunk(self) -> None:
        nothing = (None,) * self._view.num_ranks
        self._set(chunk=(), begins=nothing, decision=None, aborted=frozenset(), moved_rows=None, commits=nothing)


__all__ = [
    "EnginePhase",
    "EngineSession",
    "EngineView",
    "Gather",
    "Off",
    "RebalancePhase",
    "RebalanceRun",
    "SessionError",
    "StartupStep",
    "Wait",
    "fetch_refusal",
]
