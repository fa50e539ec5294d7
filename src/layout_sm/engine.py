"""The engine side of the protocol (docs/protocol.md §5 and §6): what it knows and what it says.

- ``RankFinding`` and ``RankAnswer``: what one rank learned from its daemon (attach, poll, begin,
  commit), as the state keeps it;
- ``EngineView``: everything the engine knows, one immutable value (the state of the machines of
  ``layout_sm.engine_machines``, which hold it in their model, ``EngineState``);
- ``Step``: the one output of a step: proceed, pause or stop, with the reason, a severity and a
  message for the operator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Any, Literal

from layout_sm.messages import is_older_daemon_reply
from layout_sm.reasons import Reason, Reply, Status, repair_failed
from layout_sm.record import LayoutError, LayoutRecord, Rows

# "rejoin": the rank's daemon started again from disk and is to rejoin at the record the finding now
# carries (the one every other daemon holds); "rejoin_refused": that daemon refused (the detail says why).
FindingKind = Literal["record", "no_record", "pending", "dirty", "unreadable", "timeout", "rejoin", "rejoin_refused"]
FINDING_KINDS: tuple[str, ...] = (
    "record",
    "no_record",
    "pending",
    "dirty",
    "unreadable",
    "timeout",
    "rejoin",
    "rejoin_refused",
)

# -- startup ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordStamp:
    """A daemon's record without its map: what the all-gather carries of a rank's finding. The
    guards read the version, the digest and the shape; the map to adopt is the rank's own (every
    rank found the same digest, or nothing is adopted)."""

    num_layers: int
    num_physical: int
    num_logical: int
    version: int
    digest: str

    @classmethod
    def of_any(cls, record: LayoutRecord | RecordStamp) -> RecordStamp:
        if isinstance(record, RecordStamp):
            return record
        return cls(record.num_layers, record.num_physical, record.num_logical, record.version, record.digest)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_layers, self.num_physical)

    def to_wire(self, include_map: bool = False) -> dict[str, Any]:
        return {
            "version": self.version,
            "digest": self.digest,
            "num_logical": self.num_logical,
            "shape": [self.num_layers, self.num_physical],
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RecordStamp:
        try:
            num_layers, num_physical = (int(x) for x in wire["shape"])
            return cls(num_layers, num_physical, int(wire["num_logical"]), int(wire["version"]), str(wire["digest"]))
        except (KeyError, TypeError, ValueError) as error:
            raise LayoutError(f"record stamp: {error!r}") from None


@dataclass(frozen=True)
class RankFinding:
    """What one rank learned from attaching to its own daemon (all-gathered as a dict)."""

    rank: int
    kind: FindingKind
    record: LayoutRecord | RecordStamp | None = None  # a stamp: another rank's, as all-gathered
    detail: str = ""  # for people: what the rank saw (the other engine's move, the error)
    # A layout-aware daemon without a record: loaded without EPLB metadata (no --enable-eplb).
    # For the warning of ``unwritten_slots_warning`` only; the spec's finding is kind and record.
    without_eplb: bool = False

    @property
    def version(self) -> int | None:
        return None if self.record is None else self.record.version

    @property
    def dirty(self) -> bool:
        """The rank found its daemon dirty (a torn move, or a repair that failed)."""
        return self.kind == "dirty"

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
            return cls(rank, "dirty", detail=_describe_dirty(reply.data))
        if reply.data.get("record") is None:
            detail = "daemon started without --enable-eplb keeps no record"
            return cls(rank, "no_record", detail=detail, without_eplb=True)
        try:
            raw = reply.data["record"]
            # Without its map: the daemon's record has the digest of the engine's own initial layout.
            record: LayoutRecord | RecordStamp = (
                LayoutRecord.from_wire(raw) if "map" in raw else RecordStamp.from_wire(raw)
            )
        except (LayoutError, TypeError) as error:
            return cls(rank, "unreadable", detail=f"the daemon's record is invalid: {error}")
        if reply.data.get("repairing"):  # spec: MustWait, the daemon repairs a torn move
            return cls(rank, "pending", record, _describe_repair(reply.data["repairing"]))
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
        """A daemon is there but did not answer (it crashed, or went away mid-request): fail startup, saying
        which socket and the way back."""
        return cls(
            rank,
            "unreadable",
            detail=f"cannot read the daemon: {detail}; start the daemon at that socket again (`python -m "
            "daemon_adapter` with the servers' arguments; alone, --expert-layout-start-alone, where the other "
            "daemons of the set run), then start this server: its startup has that daemon rejoin at the record "
            "the others keep",
        )

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
            return cls(rank, "dirty", detail=_describe_dirty(wire))
        if not wire.get("has_record"):
            return cls(rank, "no_record", detail="daemon keeps no record", without_eplb=True)
        try:
            record = LayoutRecord.from_wire(wire)
        except LayoutError as error:
            return cls(rank, "unreadable", detail=f"the daemon's record is invalid: {error}")
        if wire.get("repairing"):  # still repairing: the rank keeps waiting (spec: Poll needs ~MustWait)
            return cls(rank, "pending", record, _describe_repair(wire["repairing"]))
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

    def to_rejoin(self, target: LayoutRecord | RecordStamp, behind_ranks: Sequence[int]) -> RankFinding:
        """The rank of a daemon behind, marked to have it rejoin at ``target`` (spec: Agree's rejoin branch)."""
        return RankFinding(
            self.rank,
            "rejoin",
            target,
            f"its daemon is at version {self.version} (ranks {list(behind_ranks)} are behind) beside daemons "
            f"at version {target.version}: it rejoins at that version",
        )

    def rejoin_answered(self, reply: object) -> RankFinding:
        """The daemon's answer to this rank's rejoin request (spec: AskRejoin): granted, the rank waits
        for the reload as for a repair; refused, the startup fails with the daemon's words."""
        assert self.record is not None, "a rank to rejoin carries the record to rejoin at"
        if isinstance(reply, Mapping) and reply.get("status") == Status.OK.value:
            return RankFinding(
                self.rank, "pending", self.record, f"its daemon rejoins at version {self.record.version}"
            )
        why = reply.get("message") if isinstance(reply, Mapping) else f"no usable reply ({type(reply).__name__})"
        return RankFinding(self.rank, "rejoin_refused", None, f"its daemon did not rejoin: {why}")

    def same_as(self, other: RankFinding) -> bool:
        """The same finding, as far as any guard can tell (a record and its stamp are the same)."""
        mine, theirs = self.record, other.record
        return (self.rank, self.kind, self.without_eplb) == (other.rank, other.kind, other.without_eplb) and (
            mine is theirs
            or (mine is not None and theirs is not None and RecordStamp.of_any(mine) == RecordStamp.of_any(theirs))
        )

    def to_wire(self) -> dict[str, Any]:
        """For the all-gather: the record as its stamp (no map; the decision needs none)."""
        return {
            "rank": self.rank,
            "kind": self.kind,
            "record": None if self.record is None else self.record.to_wire(include_map=False),
            "detail": self.detail,
            "without_eplb": self.without_eplb,
        }

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> RankFinding:
        raw = wire["record"]
        record: LayoutRecord | RecordStamp | None = None
        if raw is not None:
            record = LayoutRecord.from_wire(raw) if "map" in raw else RecordStamp.from_wire(raw)
        if wire["kind"] not in FINDING_KINDS:
            raise ValueError(f"finding.kind: {wire['kind']!r} is not one of {FINDING_KINDS}")
        return cls(int(wire["rank"]), wire["kind"], record, str(wire["detail"]), bool(wire.get("without_eplb")))


def _describe_move(verb: str, move: Mapping[str, Any]) -> str:
    return (
        f"engine {move.get('engine_id')!r} {verb} layers {move.get('layers')} from version {move.get('base_version')}"
    )


def _describe_dirty(reply: Mapping[str, Any]) -> str:
    """A dirty daemon's torn move (or failed rejoin), and its failed repair's cause when it has one."""
    dirty = reply["dirty"]
    if dirty.get("rejoin"):
        asker = dirty.get("engine_id")
        what = f"its rejoin at version {dirty.get('base_version')} (asked by engine {asker!r}) did not end"
        return what + repair_failed(reply.get("repair_failed"))
    return _describe_move("went away while moving", dirty) + repair_failed(reply.get("repair_failed"))


def _describe_repair(move: Mapping[str, Any]) -> str:
    if move.get("rejoin"):
        return (
            f"the daemon started again from disk and rejoins at version {move.get('base_version')} (asked by "
            f"engine {move.get('engine_id')!r})"
        )
    return (
        f"the daemon is repairing layers {move.get('layers')} back to version {move.get('base_version')} "
        f"(engine {move.get('engine_id')!r} went away mid-move)"
    )


def needs_wait(finding: RankFinding) -> bool:
    """A rank waits (polling, up to the timeout) only while another engine's move is pending or its
    daemon repairs a torn move (spec: MustWait)."""
    return finding.kind == "pending"


@dataclass(frozen=True)
class EngineLayout:
    """The engine's own view: the shape of its metadata and its initial layout."""

    num_layers: int
    num_physical: int
    num_logical: int
    initial_digest: str
    routes_by_metadata: bool  # --enable-eplb or --init-expert-location
    # Fresh daemons beside moved ones rejoin at the moved record (spec: the constant Rejoins).
    rejoins: bool = True


# -- what the session says: one typed output per step ---------------------------------------


class Go(StrEnum):
    """What the caller does next."""

    PROCEED = "proceed"  # go on: gather, load, rebalance, move the chunk, keep the commit
    PAUSE = "pause"  # not now: poll again (startup), or end this rebalance and let the next retry
    STOP = "stop"  # for good: startup fails, or rebalancing of shared weights is off


class Severity(IntEnum):
    """How loudly to say it (the values are the ``logging`` levels)."""

    INFO = 20
    WARNING = 30
    ERROR = 40


@dataclass(frozen=True)
class Step:
    """The session's answer to one step: what to do next, why, and the words for the operator."""

    go: Go
    reason: Reason
    message: str
    severity: Severity = Severity.INFO

    def bare(self) -> Step:
        """Without the message (the spec keeps none, no guard reads it)."""
        return Step(self.go, self.reason, "", self.severity) if self.message else self

    @classmethod
    def proceed(cls, reason: Reason, message: str, severity: Severity = Severity.INFO) -> Step:
        return cls(Go.PROCEED, reason, message, severity)

    @classmethod
    def pause(cls, reason: Reason, message: str) -> Step:
        return cls(Go.PAUSE, reason, message, Severity.INFO)

    @classmethod
    def stop(cls, reason: Reason, message: str, severity: Severity = Severity.WARNING) -> Step:
        return cls(Go.STOP, reason, message, severity)


StartupKind = Literal["adopt", "keep_own", "fail"]


@dataclass(frozen=True)
class StartupOutcome:
    """What startup agreed, as the session keeps it (read by tests and probes; no adapter branches on it)."""

    kind: StartupKind
    reason: Reason
    message: str
    # The daemons' record the engine routes with, when known (a stamp: the engine's own initial layout).
    record: LayoutRecord | RecordStamp | None = None
    shared_rebalance: bool = False  # whether this engine may move shared experts later
    warning: str = ""  # for the operator; changes nothing of the outcome (see unwritten_slots_warning)

    @property
    def failed(self) -> bool:
        return self.kind == "fail"


@dataclass(frozen=True)
class HooksVerdict:
    """What an engine does when sglang did not apply every hook of the plugin (its install check)."""

    moves_blocked: bool  # shared experts must not move: the rebalance is off, a move outside it is skipped
    refuse_start: str | None  # nothing could stop sglang moving shared experts: why this engine does not start

    SKIPPED_MOVE = (
        "an EPLB move outside the plugin's rebalance hook was skipped: the plugin is not fully installed (see "
        "the error above), so nothing is moved in the daemons' shared memory"
    )


def hooks_verdict(
    missing_error: str | None,
    rebalance_hook_missing: bool,
    chunk_hook_missing: bool,
    weight_cache_on: bool,
    eplb_on: bool,
) -> HooksVerdict:
    """``missing_error``: the install check's error, None when every hook is in place. Without the
    weight cache an engine's experts are its own, so a missing hook endangers nobody else."""
    if missing_error is None or not weight_cache_on:
        return HooksVerdict(moves_blocked=False, refuse_start=None)
    if eplb_on and rebalance_hook_missing and chunk_hook_missing:
        return HooksVerdict(
            moves_blocked=True,
            refuse_start=(
                f"{missing_error}. Neither EPLB hook is in place, so nothing could stop sglang moving experts in the "
                "daemons' shared memory: this engine does not start"
            ),
        )
    return HooksVerdict(moves_blocked=True, refuse_start=None)


def unwritten_slots_warning(without_record: Sequence[RankFinding], engine: EngineLayout) -> str:
    """sglang loads a daemon started without --enable-eplb without EPLB metadata, so its loader
    writes each logical expert into its local slot only and never the redundant slots. An engine
    with redundant experts routes tokens there, to memory nobody wrote, with or without this
    plugin. Not the protocol's to refuse (such daemons serve as sglang does); said loudly."""
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
    reason: str | None = None  # the daemon's reason code (None: no readable reply)

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
            reply.reason.value,
        )

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def busy(self) -> bool:
        """Busy: the same request can succeed later."""
        return self.status is Status.BUSY

    @property
    def refused(self) -> bool:
        """Refused, or no readable reply (the daemon's state is unknown)."""
        return self.status is None or self.status is Status.REFUSED

    def without_text(self) -> RankAnswer:
        """The answer as the spec keeps it: no guard reads the text or the reason code, nor tells a
        refusal from a missing reply (both are the spec's "commit_refused")."""
        if not self.ok:
            return RankAnswer(Status.REFUSED, text="")
        return RankAnswer(self.status, self.version, self.digest, "") if self.text or self.reason else self


AnyReply = RankAnswer | Reply | Mapping[str, Any] | None
LoadSource = Literal["daemon", "disk"]  # where a rank's weights came from (anything else: unknown)

# -- the state ------------------------------------------------------------------------------

EnginePhase = Literal["start", "load", "run", "failed"]  # StartupMachine's states: the spec's ephase
# RebalanceMachine's states: the spec's reb[e].step (beginning ... committing), and whether the engine
# rebalances at all (starting: not known yet; local: sglang's own rebalance; off: for good).
RebalancePhase = Literal["starting", "local", "idle", "beginning", "aborting", "moving", "committing", "off"]


@dataclass(frozen=True)
class EngineView:
    """Everything the engine knows about the protocol, as one immutable value: the state of
    both machines (``phase``, ``rebalance``) and what their guards read.

    Per rank (index = rank): the session token of its attachment, its startup finding, its
    answers to begin and commit.
    """

    engine_id: str
    tokens: tuple[str | None, ...]
    findings: tuple[RankFinding | None, ...]
    phase: EnginePhase = "start"
    rebalance: RebalancePhase = "starting"
    shares: bool = False  # the spec's eshare: this engine may move shared experts now or later
    outcome: StartupOutcome | None = None
    rows: Rows | None = None  # the map the engine routes with; None: its own initial layout
    version: int = 0  # the layout version it routes with
    digest: str | None = None  # the digest of that map, known once startup agreed
    served: frozenset[int] = frozenset()  # ranks whose fetch_state was served
    mode: Step | None = None  # how it rebalances, once known
    chunk: tuple[int, ...] = ()  # the layers of the current chunk (0-based)
    begins: tuple[RankAnswer | None, ...] = ()
    aborted: frozenset[int] = frozenset()
    moved_rows: Rows | None = None  # the engine's whole map after sglang's move of this chunk
    moved_digest: str | None = None  # its digest (the engine's own, never a daemon's word)
    commits: tuple[RankAnswer | None, ...] = ()
    # The check the last committed chunk owes (the spec's reb[e].owed): every rank's commit answer,
    # taken at the next all-gather (a rank's process knows its own until then); empty: none owed.
    owed: tuple[RankAnswer | None, ...] = ()
    off: Step | None = None  # why rebalancing of shared weights is off for good
    # A warm standby (docs/protocol.md §10): StandbyMachine's state ("primary" for an engine started as one), and
    # per rank its role on that rank's daemon, in the spec's words (eclaim[e][r]; empty: a primary).
    role: str = "primary"
    claims: tuple[str, ...] = ()

    @classmethod
    def fresh(cls, engine_id: str, num_ranks: int) -> EngineView:
        nothing = (None,) * num_ranks
        return cls(engine_id, nothing, nothing, begins=nothing, commits=nothing)

    @property
    def num_ranks(self) -> int:
        return len(self.findings)

    def bare(self) -> EngineView:
        """This view without what only explains: finding details, reply texts, messages, and why
        rebalancing is off. The spec's engine variables keep none of it and no guard reads it
        (tests/layout_sm/test_session.py), so the mirror keeps bare views and one spec state is
        one mirror state."""
        return replace(
            self,
            findings=tuple(None if f is None else f.without_detail() for f in self.findings),
            outcome=None if self.outcome is None else replace(self.outcome, message="", warning=""),
            mode=None if self.mode is None else self.mode.bare(),
            # No reply and a refusal are one answer to every guard (the spec's "refused").
            begins=tuple(
                None if a is None else RankAnswer(Status.REFUSED if a.refused else a.status, text="")
                for a in self.begins
            ),
            commits=tuple(None if a is None else a.without_text() for a in self.commits),
            owed=tuple(None if a is None else a.without_text() for a in self.owed),
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


__all__ = [
    "FINDING_KINDS",
    "AnyReply",
    "EngineLayout",
    "EnginePhase",
    "EngineView",
    "Go",
    "LoadSource",
    "RankAnswer",
    "RankFinding",
    "Reason",
    "RebalancePhase",
    "RecordStamp",
    "Severity",
    "StartupOutcome",
    "Step",
    "fetch_refusal",
    "needs_wait",
    "unwritten_slots_warning",
]
