"""The engine side of the protocol (docs/protocol.md §5 and §6): pure decisions and phase machines.

Every rank all-gathers what it saw, then calls the same pure function on the same list, so
every rank reaches the same outcome without another round of messages: no rank can be left
waiting in a collective that the others skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from statemachine import State, StateMachine

from layout_sm.messages import is_older_daemon_reply
from layout_sm.reasons import RESTART_DAEMONS, Reason, Reply, Status
from layout_sm.record import LayoutError, LayoutRecord, layout_digest

FindingKind = Literal["record", "no_record", "pending", "dirty", "unreadable", "timeout"]
FINDING_KINDS: tuple[str, ...] = ("record", "no_record", "pending", "dirty", "unreadable", "timeout")

# -- startup ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankFinding:
    """What one rank learned from attaching to its own daemon (all-gathered as a dict)."""

    rank: int
    kind: FindingKind
    record: LayoutRecord | None = None
    detail: str = ""  # for people: what the rank saw (the other engine's move, the error)
    # A layout-aware daemon without a record: loaded without EPLB metadata (no --enable-eplb).
    # For the warning in ``startup_decision`` only; the spec's finding is kind and record.
    without_eplb: bool = False

    @property
    def version(self) -> int | None:
        return None if self.record is None else self.record.version

    @property
    def digest(self) -> str | None:
        return None if self.record is None else self.record.digest

    @classmethod
    def from_attach_reply(cls, rank: int, wire: object) -> RankFinding:
        """Classify a daemon's answer to ``expert_layout_attach`` (or its absence)."""
        if not isinstance(wire, Mapping):
            return cls(rank, "unreadable", detail=f"no usable reply from the daemon ({type(wire).__name__})")
        if is_older_daemon_reply(wire):
            return cls(rank, "no_record", detail="older daemon without the expert-layout requests")
        try:
            reply = Reply.from_wire(wire)
        except ValueError as error:
            return cls(rank, "unreadable", detail=f"unexpected reply: {error}")
        if not reply.ok:
            return cls(rank, "unreadable", detail=f"attach refused: {reply}")
        if reply.data.get("dirty"):
            dirty = reply.data["dirty"]
            return cls(rank, "dirty", detail=_describe_move("went away while moving", dirty))
        if reply.data.get("record") is None:
            detail = "daemon started without --enable-eplb keeps no record"
            return cls(rank, "no_record", detail=detail, without_eplb=True)
        try:
            record = LayoutRecord.from_wire(reply.data["record"])
        except LayoutError as error:
            return cls(rank, "unreadable", detail=f"the daemon's record is invalid: {error}")
        if reply.data.get("pending"):
            pending = reply.data["pending"]
            return cls(rank, "pending", record, _describe_move("is moving", pending))
        return cls(rank, "record", record)

    @classmethod
    def no_daemon(cls, rank: int, detail: str) -> RankFinding:
        """No daemon at the loader's socket path: sglang loads from disk, so there is no record."""
        return cls(rank, "no_record", detail=f"no weight cache daemon: {detail}")

    @classmethod
    def unreachable(cls, rank: int, detail: str) -> RankFinding:
        """A daemon is there but could not be read (crashed, refused, timed out): fail startup."""
        return cls(rank, "unreadable", detail=f"cannot read the daemon: {detail}")

    @classmethod
    def from_query_reply(cls, rank: int, wire: object) -> RankFinding:
        """Re-classify a waiting rank from its poll, ``query_request(include_map=True)``.

        The map is read again: the move it waited for may have been committed meanwhile.
        ``wire`` is None when the poll could not be sent.
        """
        if wire is None:
            return cls.unreachable(rank, "the poll could not be sent")
        if not isinstance(wire, Mapping) or wire.get("status") != Status.OK.value:
            return cls(rank, "unreadable", detail=f"query failed: {wire!r}")
        if wire.get("dirty"):
            return cls(rank, "dirty", detail=_describe_move("went away while moving", wire["dirty"]))
        if not wire.get("has_record"):
            return cls(rank, "no_record", detail="daemon keeps no record", without_eplb=True)
        try:
            record = LayoutRecord.from_wire(wire)
        except LayoutError as error:
            return cls(rank, "unreadable", detail=f"the daemon's record is invalid: {error}")
        if wire.get("pending"):
            pending = wire["pending"]
            return cls(rank, "pending", record, _describe_move("is moving", pending))
        return cls(rank, "record", record)

    def without_detail(self) -> RankFinding:
        """The finding as the spec keeps it (kind and record); no decision reads the detail."""
        return RankFinding(self.rank, self.kind, self.record) if self.detail else self

    def timed_out(self, waited_s: float) -> RankFinding:
        """A rank whose wait for another engine's move ran past the timeout."""
        return RankFinding(
            self.rank,
            "timeout",
            self.record,
            f"waited {waited_s:.0f} s for a move that did not end: {self.detail}",
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "kind": self.kind,
            "record": None if self.record is None else self.record.to_wire(include_map=True),
            "detail": self.detail,
            "without_eplb": self.without_eplb,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankFinding:
        record = None if wire["record"] is None else LayoutRecord.from_wire(wire["record"])
        if wire["kind"] not in FINDING_KINDS:
            raise ValueError(f"finding.kind: {wire['kind']!r} is not one of {FINDING_KINDS}")
        return cls(int(wire["rank"]), wire["kind"], record, str(wire["detail"]), bool(wire.get("without_eplb")))


def _describe_move(verb: str, move: Mapping[str, Any]) -> str:
    return (
        f"engine {move.get('engine_id')!r} {verb} layers {move.get('layers')} from version {move.get('base_version')}"
    )


def needs_wait(finding: RankFinding) -> bool:
    """A rank waits (polling, up to the timeout) only while another engine's move is pending."""
    return finding.kind == "pending"


@dataclass(frozen=True)
class EngineLayout:
    """The engine's own view: the shape of its metadata and its initial layout."""

    num_layers: int
    num_physical: int
    num_logical: int
    initial_digest: str
    routes_by_metadata: bool  # --enable-eplb or --init-expert-location


StartupKind = Literal["adopt", "keep_own", "fail"]


@dataclass(frozen=True)
class StartupOutcome:
    kind: StartupKind
    reason: Reason
    message: str
    record: LayoutRecord | None = None  # the layout the engine routes with, when known
    shared_rebalance: bool = False  # whether this engine may move shared experts later
    warning: str = ""  # for the operator; changes nothing of the outcome (see unwritten_slots_warning)

    @property
    def failed(self) -> bool:
        return self.kind == "fail"


def _fail(reason: Reason, message: str) -> StartupOutcome:
    return StartupOutcome("fail", reason, f"expert-layout startup check failed: {message}")


def _by_rank(findings: Sequence[RankFinding], kind: str) -> list[RankFinding]:
    return [f for f in sorted(findings, key=lambda f: f.rank) if f.kind == kind]


def unwritten_slots_warning(without_record: Sequence[RankFinding], engine: EngineLayout) -> str:
    """sglang 0.5.23 loads a daemon started without --enable-eplb without EPLB metadata
    (weight_cache/daemon.py:476 returns early), so its loader writes each logical expert into its
    local slot only and never the redundant slots (layers/moe/fused_moe_triton/layer.py:1188-1203).
    An engine with redundant experts routes tokens there, to memory nobody wrote, with or without
    this plugin. Not the protocol's to refuse (such daemons serve as sglang does); said loudly."""
    ranks = [f.rank for f in without_record if f.without_eplb]
    redundant = engine.num_physical - engine.num_logical
    if not ranks or redundant <= 0:
        return ""
    return (
        f"the daemons of ranks {ranks} were started without --enable-eplb: sglang loads them without "
        f"EPLB metadata and never writes the engine's {redundant} redundant expert slot(s) per layer, so "
        f"tokens routed there meet weights nobody wrote (outputs differ from a server loaded from disk); "
        f"restart the daemons with the servers' --enable-eplb and --ep-num-redundant-experts"
    )


def startup_decision(findings: Sequence[RankFinding], engine: EngineLayout) -> StartupOutcome:
    """docs/protocol.md §5: adopt the daemons' common record, keep the engine's own layout, or fail."""
    for kind, reason, what in (
        ("unreadable", Reason.UNREADABLE, "could not read its daemon's layout"),
        ("timeout", Reason.WAIT_TIMEOUT, "timed out waiting for another engine's move"),
        ("pending", Reason.WAIT_TIMEOUT, "still sees another engine's move pending"),
        ("dirty", Reason.DIRTY, "found its daemon dirty"),
    ):
        bad = _by_rank(findings, kind)
        if bad:
            details = "; ".join(f"rank {f.rank}: {f.detail}" for f in bad)
            advice = f"; {RESTART_DAEMONS}" if kind == "dirty" else ""
            return _fail(reason, f"{len(bad)} rank(s) {what} ({details}){advice}")
    records = _by_rank(findings, "record")
    without = _by_rank(findings, "no_record")
    warning = unwritten_slots_warning(without, engine)
    if not records:
        return StartupOutcome(
            "keep_own",
            Reason.NO_RECORD,
            "no daemon keeps an expert-layout record; starting with the engine's "
            "own initial layout; rebalancing of shared weights stays off",
            warning=warning,
        )
    if without:
        moved = [f for f in records if f.version != 0 or f.digest != engine.initial_digest]
        if moved:
            ranks = [f.rank for f in moved]
            return _fail(
                Reason.MIXED_AFTER_MOVE,
                f"ranks {[f.rank for f in without]} have daemons without a record but the daemons of ranks "
                f"{ranks} hold a layout other than the engine's initial one (versions "
                f"{[f.version for f in moved]}); the weights cannot be trusted; {RESTART_DAEMONS}",
            )
        return StartupOutcome(
            "keep_own",
            Reason.MIXED_INITIAL,
            f"ranks {[f.rank for f in without]} have daemons without a record and "
            "the others are at the initial layout; starting with the engine's own initial layout; "
            "rebalancing of shared weights stays off",
            warning=warning,
        )
    first = records[0].record
    assert first is not None
    # Version and digest both: equal maps at different versions mean a daemon was restarted
    # under the others, and its next begin would be refused as stale (AgreedVersions, §7).
    disagree = [f for f in records if (f.version, f.digest) != (first.version, first.digest)]
    if disagree:
        listing = ", ".join(f"rank {f.rank}: version {f.version}" for f in records)
        return _fail(Reason.DISAGREE, f"the daemons hold different layouts ({listing}); {RESTART_DAEMONS}")
    if first.shape != (engine.num_layers, engine.num_physical) or first.num_logical != engine.num_logical:
        return _fail(
            Reason.SHAPE_MISMATCH,
            f"the daemons' map is {first.num_layers} layers x {first.num_physical} physical slots of "
            f"{first.num_logical} experts, the engine's is {engine.num_layers} x {engine.num_physical} of "
            f"{engine.num_logical}; start the engine with the same --ep-num-redundant-experts as the daemons",
        )
    if first.digest == engine.initial_digest:
        return StartupOutcome(
            "keep_own",
            Reason.INITIAL_LAYOUT,
            f"daemons at version {first.version} hold the engine's initial layout",
            first,
            shared_rebalance=True,
        )
    if not engine.routes_by_metadata:
        return _fail(
            Reason.NOT_ROUTING_BY_METADATA,
            f"the daemons' experts were moved (version {first.version}) but this engine routes by the "
            f"static layout; start it with --enable-eplb (or --init-expert-location)",
        )
    return StartupOutcome(
        "adopt",
        Reason.ADOPT,
        f"adopting the daemons' layout version {first.version}",
        first,
        shared_rebalance=True,
    )


# -- rebalance ----------------------------------------------------------------------------

LoadSource = Literal["daemon", "disk"]


@dataclass(frozen=True)
class RebalanceMode:
    enabled: bool  # whether EPLB may rebalance at all
    shared: bool  # whether moves go through the daemons' chunk protocol
    reason: Reason
    message: str


def rebalance_mode(
    startup: StartupOutcome | None,
    load_sources: Sequence[LoadSource],
    *,
    elastic_ep: bool = False,
) -> RebalanceMode:
    """docs/protocol.md §6: rebalance as sglang does, through the daemons, or not at all (and why).

    ``startup`` is None when the engine did not attach; ``load_sources`` is one per rank.
    """
    if all(source == "disk" for source in load_sources):
        return RebalanceMode(True, False, Reason.LOCAL, "weights from disk on every rank: rebalancing as sglang does")
    if any(source == "disk" for source in load_sources):
        return RebalanceMode(
            False,
            False,
            Reason.MIXED_SOURCES,
            "some ranks loaded weights from disk and others from the weight cache daemons; rebalancing of "
            "shared weights stays off",
        )
    if elastic_ep:
        return RebalanceMode(
            False, False, Reason.ELASTIC_EP, "elastic EP is on; rebalancing of shared weights stays off"
        )
    if startup is None:
        return RebalanceMode(
            False,
            False,
            Reason.NOT_ATTACHED,
            "the engine did not attach to its daemons; rebalancing of shared weights stays off",
        )
    if not startup.shared_rebalance:
        return RebalanceMode(
            False, False, startup.reason, f"rebalancing of shared weights stays off: {startup.message}"
        )
    return RebalanceMode(True, True, Reason.SHARED, "rebalancing through the daemons' chunk protocol")


ChunkKind = Literal["proceed", "pause", "disable"]


@dataclass(frozen=True)
class RankAnswer:
    """One rank's reply to begin or commit, as the engine keeps it until every rank has answered.

    The status decides (None: no readable reply, so the daemon's state is unknown and counts as
    refused); ``version`` and ``digest`` are what an ok commit recorded; ``text`` only explains.
    """

    status: Status | None
    version: int | None = None
    digest: str | None = None
    text: str = "no reply"

    @classmethod
    def of(cls, reply: RankAnswer | Reply | Mapping[str, Any] | None) -> RankAnswer:
        if isinstance(reply, RankAnswer):
            return reply
        if reply is not None and not isinstance(reply, Reply):
            try:
                reply = Reply.from_wire(reply)
            except ValueError as error:
                return cls(None, text=f"unreadable reply: {error}")
        if reply is None:
            return cls(None)
        version, digest = reply.data.get("version"), reply.data.get("digest")
        return cls(
            reply.status,
            version if isinstance(version, int) and reply.ok else None,
            digest if isinstance(digest, str) and reply.ok else None,
            str(reply),
        )

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def without_text(self) -> RankAnswer:
        """The answer as the spec keeps it; no decision reads the text."""
        return RankAnswer(self.status, self.version, self.digest, "")


AnyReply = RankAnswer | Reply | Mapping[str, Any] | None


@dataclass(frozen=True)
class ChunkDecision:
    kind: ChunkKind
    abort_ranks: tuple[int, ...]
    reason: Reason
    message: str


def chunk_decision(begin_replies: Sequence[AnyReply]) -> ChunkDecision:
    """docs/protocol.md §6 step 1 over the all-gathered begin replies (one per rank, in rank order).

    A rank with no readable reply counts as refused: its daemon's state is unknown.
    """
    answers = [RankAnswer.of(r) for r in begin_replies]
    ok_ranks = tuple(rank for rank, a in enumerate(answers) if a.ok)
    refused = [(rank, a) for rank, a in enumerate(answers) if a.status in (None, Status.REFUSED)]
    if refused:
        detail = "; ".join(f"rank {rank}: {a.text}" for rank, a in refused)
        return ChunkDecision(
            "disable",
            ok_ranks,
            Reason.BEGIN_REFUSED,
            f"a daemon refused the move for good ({detail}); rebalancing of shared weights is off",
        )
    busy = [(rank, a) for rank, a in enumerate(answers) if a.status is Status.BUSY]
    if busy:
        detail = "; ".join(f"rank {rank}: {a.text}" for rank, a in busy)
        return ChunkDecision(
            "pause", ok_ranks, Reason.BEGIN_BUSY, f"rebalance paused, the next interval retries ({detail})"
        )
    return ChunkDecision("proceed", (), Reason.BEGUN, "every daemon accepted the move")


@dataclass(frozen=True)
class CommitVerdict:
    ok: bool
    version: int | None
    digest: str
    reason: Reason
    message: str


def verify_commits(
    commit_replies: Sequence[AnyReply],
    engine_rows: Sequence[Sequence[int]],
    expected_version: int | None = None,
) -> CommitVerdict:
    """docs/protocol.md §6 step 4: every daemon recorded the engine's whole map at one new version.

    The engine computes its own digest of its own map: a daemon's word for it is never taken.
    """
    digest = layout_digest(engine_rows)
    answers = [RankAnswer.of(r) for r in commit_replies]
    problems = []
    for rank, answer in enumerate(answers):
        if not answer.ok:
            problems.append(f"rank {rank}: commit not recorded ({answer.text})")
        elif answer.digest != digest:
            problems.append(f"rank {rank}: daemon's digest differs from the engine's map")
    versions = {a.version for a in answers if a.ok}
    if not problems and len(versions) != 1:
        problems.append(f"daemons report different versions {sorted(versions, key=str)}")
    if not problems and expected_version is not None and versions != {expected_version}:
        problems.append(f"daemons report version {versions.pop()}, expected {expected_version}")
    if problems:
        return CommitVerdict(
            False,
            None,
            digest,
            Reason.COMMIT_UNVERIFIED,
            "expert move committed inconsistently: "
            + "; ".join(problems)
            + f". The engine keeps serving but rebalances no more; {RESTART_DAEMONS} before starting another "
            "engine on them.",
        )
    version = versions.pop()
    return CommitVerdict(True, version, digest, Reason.COMMITTED, f"every daemon recorded version {version}")


# -- phase machines -----------------------------------------------------------------------


class StartupMachine(StateMachine):
    """One rank's startup: attach, wait out another engine's move, then the shared decision."""

    attaching = State(initial=True)
    waiting = State()
    agreeing = State()
    adopted = State(final=True)
    kept = State(final=True)
    failed = State(final=True)

    found = attaching.to(waiting, cond="must_wait") | attaching.to(agreeing)
    polled = waiting.to(agreeing, cond="move_ended") | waiting.to.itself(internal=True)
    timed_out = waiting.to(agreeing)
    decided = agreeing.to(adopted, cond="adopts") | agreeing.to(kept, cond="keeps") | agreeing.to(failed)

    def must_wait(self, finding: RankFinding) -> bool:
        return needs_wait(finding)

    def move_ended(self, finding: RankFinding) -> bool:
        return not needs_wait(finding)

    def adopts(self, outcome: StartupOutcome) -> bool:
        return outcome.kind == "adopt"

    def keeps(self, outcome: StartupOutcome) -> bool:
        return outcome.kind == "keep_own"


class RebalanceMachine(StateMachine):
    """The engine's rebalancing phase, one chunk at a time; ``off`` is for good (docs/protocol.md §6).

    Its states are the spec's ``reb[e].step`` (idle, begin, abort, move, commit), plus whether
    the engine rebalances at all (starting, local, off). Guards read the event's mode, decision
    or verdict; ``EngineSession`` keeps the data (replies, chunk, why it is off).
    """

    starting = State(initial=True)
    local = State()  # weights from disk: sglang's own rebalance, no protocol
    idle = State()  # shared weights, between chunks
    beginning = State()
    aborting = State()  # the chunk does not go on: the ranks whose begin was ok abort it
    moving = State()
    committing = State()
    off = State(final=True)

    start = starting.to(idle, cond="shared_mode") | starting.to(local, cond="local_mode") | starting.to(off)
    chunk = idle.to(beginning)
    begun = (
        beginning.to(moving, cond="proceeds")
        | beginning.to(aborting, cond="some_ranks_begun")
        | beginning.to(idle, cond="pauses")
        | beginning.to(off)
    )
    aborted = (
        aborting.to.itself(internal=True, cond="begun_ranks_left") | aborting.to(idle, cond="pauses") | aborting.to(off)
    )
    moved = moving.to(committing)
    committed = committing.to(idle, cond="verified") | committing.to(off)
    local_rebalance = local.to.itself(internal=True)
    # The engine shuts down (or an operator turns EPLB off): no more rebalances.
    shutdown = local.to(off) | idle.to(off)

    def shared_mode(self, mode: RebalanceMode) -> bool:
        return mode.enabled and mode.shared

    def local_mode(self, mode: RebalanceMode) -> bool:
        return mode.enabled and not mode.shared

    def proceeds(self, decision: ChunkDecision) -> bool:
        return decision.kind == "proceed"

    def some_ranks_begun(self, decision: ChunkDecision) -> bool:
        return bool(decision.abort_ranks)

    def pauses(self, decision: ChunkDecision) -> bool:
        return decision.kind == "pause"

    def begun_ranks_left(self, left: int) -> bool:
        return left > 0

    def verified(self, verdict: CommitVerdict) -> bool:
        return verdict.ok

    @property
    def phase(self) -> str:
        return str(self.current_state_value)

    @property
    def may_rebalance(self) -> bool:
        return self.phase in ("local", "idle")


__all__ = [
    "ChunkDecision",
    "CommitVerdict",
    "EngineLayout",
    "RankAnswer",
    "RankFinding",
    "Reason",
    "RebalanceMachine",
    "RebalanceMode",
    "StartupMachine",
    "StartupOutcome",
    "chunk_decision",
    "needs_wait",
    "rebalance_mode",
    "startup_decision",
    "verify_commits",
]
