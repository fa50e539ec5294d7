"""The engine side of the protocol (docs/protocol.md §5 and §6): its state, its machines, its outputs.

- ``RankFinding`` and ``RankAnswer``: what one rank learned from its daemon (attach, poll, begin,
  commit), as the state keeps it;
- ``EngineView``: everything the engine knows, one immutable value; ``EngineState`` holds it as
  the model of both machines: its methods are the guards (the spec's conjuncts, over the view
  and the event's arguments) and the actions (they replace the view and say what to do next);
- ``StartupMachine`` and ``RebalanceMachine``: python-statemachine declarations of the spec's
  engine actions, whose tables (``layout_sm.declared``) ``layout_sm.session.EngineSession`` fires
  on every step;
- ``Step``: the one output of a step: move, pause or stop, with the reason, a severity and a
  message for the operator.

Every rank all-gathers what it saw, then takes the same transitions on the same list, so every
rank reaches the same outcome without another round of messages: no rank can be left waiting
in a collective that the others skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Any, Literal

from statemachine import State, StateMachine

from layout_sm.messages import is_older_daemon_reply
from layout_sm.reasons import RESTART_DAEMONS, Reason, Reply, Status
from layout_sm.record import LayoutError, LayoutRecord, Rows, layout_digest

FindingKind = Literal["record", "no_record", "pending", "dirty", "unreadable", "timeout"]
FINDING_KINDS: tuple[str, ...] = ("record", "no_record", "pending", "dirty", "unreadable", "timeout")

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


# -- what the session says: one typed output per step ---------------------------------------


class Go(StrEnum):
    """What the caller does next."""

    MOVE = "move"  # go on: gather, load, rebalance, move the chunk, keep the commit
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


def _move(reason: Reason, message: str, severity: Severity = Severity.INFO) -> Step:
    return Step(Go.MOVE, reason, message, severity)


def _pause(reason: Reason, message: str) -> Step:
    return Step(Go.PAUSE, reason, message, Severity.INFO)


def _stop(reason: Reason, message: str, severity: Severity = Severity.WARNING) -> Step:
    return Step(Go.STOP, reason, message, severity)


StartupKind = Literal["adopt", "keep_own", "fail"]


@dataclass(frozen=True)
class StartupOutcome:
    """What startup agreed, as the session keeps it (read by tests and probes; no adapter branches on it)."""

    kind: StartupKind
    reason: Reason
    message: str
    record: LayoutRecord | None = None  # the daemons' record the engine routes with, when known
    shared_rebalance: bool = False  # whether this engine may move shared experts later
    warning: str = ""  # for the operator; changes nothing of the outcome (see unwritten_slots_warning)

    @property
    def failed(self) -> bool:
        return self.kind == "fail"


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

    @property
    def refused(self) -> bool:
        """Refused, or no readable reply (the daemon's state is unknown)."""
        return self.status is None or self.status is Status.REFUSED

    def without_text(self) -> RankAnswer:
        """The answer as the spec keeps it; no guard reads the text."""
        return RankAnswer(self.status, self.version, self.digest, "") if self.text else self


AnyReply = RankAnswer | Reply | Mapping[str, Any] | None
LoadSource = Literal["daemon", "disk"]  # where a rank's weights came from (anything else: unknown)

# -- the state ------------------------------------------------------------------------------

EnginePhase = Literal["start", "load", "run", "failed"]  # StartupMachine's states: the spec's ephase
# RebalanceMachine's states: the spec's reb[e].step (beginning ... committing), and whether the engine
# rebalances at all (starting: not known yet; local: sglang's own rebalance; off: for good).
RebalancePhase = Literal["starting", "local", "idle", "beginning", "aborting", "moving", "committing", "off"]


def _put(values: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*values[:i], value, *values[i + 1 :])


def _evolve(view: EngineView, changes: dict[str, Any]) -> EngineView:
    """``dataclasses.replace`` without re-running ``__init__``: a step changes the view a few
    times, and the view has no field to check or derive."""
    new = object.__new__(EngineView)
    fields = new.__dict__
    fields.update(view.__dict__)
    fields.update(changes)
    return new


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
    off: Step | None = None  # why rebalancing of shared weights is off for good

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
            begins=tuple(None if a is None else RankAnswer(a.status, text="") for a in self.begins),
            commits=tuple(None if a is None else a.without_text() for a in self.commits),
            off=None,
        )


def _ranks_where(findings: Sequence[RankFinding], kind: str) -> list[RankFinding]:
    return [f for f in findings if f.kind == kind]


def _listing(findings: Sequence[RankFinding]) -> str:
    return "; ".join(f"rank {f.rank}: {f.detail}" for f in findings)


class EngineState:
    """python-statemachine's model of both engine machines: the one place the session's protocol
    state is kept (``view``), with the spec's conjuncts as guards and the actions that change it.

    ``phase`` and ``rebalance`` are the machines' state fields, read from the view and written
    into it when a transition enters its target. Guards read the view, the engine's own layout
    and the event's arguments; actions replace the view and return the step's ``Step``.
    """

    __slots__ = ("layout", "view")

    def __init__(self, view: EngineView, layout: EngineLayout | None) -> None:
        self.view = view
        self.layout = layout  # None only for an engine that never attached

    @property
    def phase(self) -> str:
        return self.view.phase

    @phase.setter
    def phase(self, value: str) -> None:
        if value != self.view.phase:
            self.view = _evolve(self.view, {"phase": value})

    @property
    def rebalance(self) -> str:
        return self.view.rebalance

    @rebalance.setter
    def rebalance(self, value: str) -> None:
        if value != self.view.rebalance:
            self.view = _evolve(self.view, {"rebalance": value})

    def _set(self, **changes: Any) -> None:
        self.view = _evolve(self.view, changes)

    # -- startup guards: the spec's Attach, Poll, Timeout, Agree, Fetch ----------------------

    def not_found(self, rank: int) -> bool:
        """Attach: ``efind[e][r].found = "nothing"``."""
        return self.view.findings[rank] is None

    def waits(self, rank: int) -> bool:
        """Poll, Timeout: ``efind[e][r].found = "wait"`` (another engine's move is pending)."""
        finding = self.view.findings[rank]
        return finding is not None and needs_wait(finding)

    def move_ended(self, finding: RankFinding) -> bool:
        """Poll: ``~ForeignPending(e, r)``, as the poll's reply shows it."""
        return not needs_wait(finding)

    def one_per_rank(self, findings: Sequence[RankFinding]) -> bool:
        return len(findings) == self.view.num_ranks

    def every_rank_found(self) -> bool:
        """Agree: ``\\A r : efind[e][r].found \\notin {"nothing", "wait"}``."""
        return all(f is not None and not needs_wait(f) for f in self.view.findings)

    def _found(self) -> list[RankFinding]:
        return sorted((f for f in self.view.findings if f is not None), key=lambda f: f.rank)

    def unreadable(self) -> bool:
        """A rank could not read its daemon (no spec counterpart: the spec's daemons always answer)."""
        return any(f.kind == "unreadable" for f in self._found())

    def timed_out(self) -> bool:
        """StartupFails: a finding is "timeout"."""
        return any(f.kind == "timeout" for f in self._found())

    def dirty(self) -> bool:
        """StartupFails: a finding is "dirty"."""
        return any(f.kind == "dirty" for f in self._found())

    def recorded_nowhere(self) -> bool:
        """``Recorded(e) = {}``: no daemon keeps a record."""
        return not _ranks_where(self._found(), "record")

    def moved_beside_no_record(self) -> bool:
        """StartupFails: ``Recorded(e) # Found(e) /\\ \\E f \\in Recorded(e) : Moved(f)``."""
        return self.lacks_record() and bool(self._moved())

    def _moved(self) -> list[RankFinding]:
        assert self.layout is not None
        initial = self.layout.initial_digest
        return [f for f in _ranks_where(self._found(), "record") if f.version != 0 or f.digest != initial]

    def lacks_record(self) -> bool:
        """``~Adopts(e)``: some daemon keeps no record."""
        return bool(_ranks_where(self._found(), "no_record"))

    def records_differ(self) -> bool:
        """StartupFails: ``\\E f, g \\in Recorded(e) : f.fver # g.fver \\/ f.fmap # g.fmap``. Version and
        digest both: equal maps at different versions mean a daemon was restarted under the others,
        and its next begin would be refused as stale."""
        return len({(f.version, f.digest) for f in _ranks_where(self._found(), "record")}) > 1

    def _agreed(self) -> LayoutRecord | RecordStamp:
        """The first record found; a record with its map before a stamp (all agree, or startup fails)."""
        records = [f.record for f in _ranks_where(self._found(), "record") if f.record is not None]
        return next((r for r in records if isinstance(r, LayoutRecord)), records[0])

    def shape_differs(self) -> bool:
        """The daemons' map is not of the engine's shape (no spec counterpart: one shape there)."""
        assert self.layout is not None
        first, engine = self._agreed(), self.layout
        return first.shape != (engine.num_layers, engine.num_physical) or first.num_logical != engine.num_logical

    def record_is_initial(self) -> bool:
        """The agreed record is the engine's own initial layout: nothing to adopt."""
        assert self.layout is not None
        return self._agreed().digest == self.layout.initial_digest

    def routes_statically(self) -> bool:
        """The engine routes by the static layout, so it cannot follow a moved map."""
        assert self.layout is not None
        return not self.layout.routes_by_metadata

    def fetch_refused(self, reply: object) -> bool:
        """Fetch: ``~FetchServes(e, r)``, as the daemon's ``layout_refused`` reply says."""
        return isinstance(reply, Mapping) and reply.get("status") == Status.LAYOUT_REFUSED.value

    def fetch_served(self, reply: object) -> bool:
        return isinstance(reply, Mapping) and reply.get("status") == Status.OK.value

    def last_to_serve(self, rank: int) -> bool:
        """Fetch: ``eserv'[e] = Ranks``."""
        return len(self.view.served | {rank}) == self.view.num_ranks

    # -- startup actions -----------------------------------------------------------------

    def take_finding(self, rank: int, finding: RankFinding, token: str | None) -> Step:
        v = self.view
        self._set(tokens=_put(v.tokens, rank, token), findings=_put(v.findings, rank, finding))
        return self._next(finding)

    def take_poll(self, rank: int, finding: RankFinding) -> Step:
        self._set(findings=_put(self.view.findings, rank, finding))
        return self._next(finding)

    def still_waiting(self, finding: RankFinding) -> Step:
        """The spec's Poll is not enabled yet: the rank keeps the finding it had."""
        return self._next(finding)

    @staticmethod
    def _next(finding: RankFinding) -> Step:
        if needs_wait(finding):
            return _pause(Reason.MOVE_PENDING, f"rank {finding.rank} waits: {finding.detail}")
        return _move(Reason.ATTACHED, f"rank {finding.rank} found {finding.kind}")

    def time_out(self, rank: int, waited_s: float) -> Step:
        finding = self.view.findings[rank]
        assert finding is not None
        timed = finding.timed_out(waited_s)
        self._set(findings=_put(self.view.findings, rank, timed))
        return _move(Reason.WAIT_TIMEOUT, f"rank {rank}: {timed.detail}", Severity.WARNING)

    def take_findings(self, findings: Sequence[RankFinding]) -> None:
        """What was gathered wins: a rank whose own steps broke off (an error mid-wait) gathered
        an ``unreadable`` finding, and every rank must decide on the same list. A finding the
        rank made itself stays where it is the same as gathered: it carries its record's map."""
        mine = self.view.findings
        self._set(
            findings=tuple(
                own if own is not None and own.same_as(gathered) else gathered
                for own, gathered in zip(mine, findings, strict=True)
            )
        )

    def _fail(self, reason: Reason, message: str) -> Step:
        text = f"expert-layout startup check failed: {message}"
        self._set(outcome=StartupOutcome("fail", reason, text), shares=False)
        return _stop(reason, text, Severity.ERROR)

    def _fail_where(self, kind: str, reason: Reason, what: str, advice: str = "") -> Step:
        bad = _ranks_where(self._found(), kind)
        return self._fail(reason, f"{len(bad)} rank(s) {what} ({_listing(bad)}){advice}")

    def fail_unreadable(self) -> Step:
        return self._fail_where("unreadable", Reason.UNREADABLE, "could not read its daemon's layout")

    def fail_timed_out(self) -> Step:
        return self._fail_where("timeout", Reason.WAIT_TIMEOUT, "timed out waiting for another engine's move")

    def fail_dirty(self) -> Step:
        return self._fail_where("dirty", Reason.DIRTY, "found its daemon dirty", f"; {RESTART_DAEMONS}")

    def fail_moved_beside_no_record(self) -> Step:
        moved = self._moved()
        without = [f.rank for f in _ranks_where(self._found(), "no_record")]
        return self._fail(
            Reason.MIXED_AFTER_MOVE,
            f"ranks {without} have daemons without a record but the daemons of ranks "
            f"{[f.rank for f in moved]} hold a layout other than the engine's initial one (versions "
            f"{[f.version for f in moved]}); the weights cannot be trusted; {RESTART_DAEMONS}",
        )

    def fail_records_differ(self) -> Step:
        listing = ", ".join(f"rank {f.rank}: version {f.version}" for f in _ranks_where(self._found(), "record"))
        return self._fail(Reason.DISAGREE, f"the daemons hold different layouts ({listing}); {RESTART_DAEMONS}")

    def fail_shape(self) -> Step:
        assert self.layout is not None
        first, engine = self._agreed(), self.layout
        return self._fail(
            Reason.SHAPE_MISMATCH,
            f"the daemons' map is {first.num_layers} layers x {first.num_physical} physical slots of "
            f"{first.num_logical} experts, the engine's is {engine.num_layers} x {engine.num_physical} of "
            f"{engine.num_logical}; start the engine with the same --ep-num-redundant-experts as the daemons",
        )

    def fail_routes_statically(self) -> Step:
        return self._fail(
            Reason.NOT_ROUTING_BY_METADATA,
            f"the daemons' experts were moved (version {self._agreed().version}) but this engine routes by the "
            f"static layout; start it with --enable-eplb (or --init-expert-location)",
        )

    def _route(self, outcome: StartupOutcome) -> Step:
        assert self.layout is not None
        record = outcome.record
        assert record is None or isinstance(record, LayoutRecord), "a rank routes with a map it found itself"
        self._set(
            outcome=outcome,
            shares=outcome.shared_rebalance,
            rows=None if record is None else record.rows,
            version=0 if record is None else record.version,
            digest=self.layout.initial_digest if record is None else record.digest,
        )
        if outcome.warning:
            return _move(outcome.reason, f"{outcome.message}; WARNING: {outcome.warning}", Severity.WARNING)
        return _move(outcome.reason, outcome.message)

    def _keep_without_record(self, reason: Reason, message: str) -> Step:
        assert self.layout is not None
        warning = unwritten_slots_warning(_ranks_where(self._found(), "no_record"), self.layout)
        return self._route(StartupOutcome("keep_own", reason, message, warning=warning))

    def keep_own_no_record(self) -> Step:
        return self._keep_without_record(
            Reason.NO_RECORD,
            "no daemon keeps an expert-layout record; starting with the engine's "
            "own initial layout; rebalancing of shared weights stays off",
        )

    def keep_own_mixed(self) -> Step:
        without = [f.rank for f in _ranks_where(self._found(), "no_record")]
        return self._keep_without_record(
            Reason.MIXED_INITIAL,
            f"ranks {without} have daemons without a record and "
            "the others are at the initial layout; starting with the engine's own initial layout; "
            "rebalancing of shared weights stays off",
        )

    def keep_own_initial(self) -> Step:
        first = self._agreed()
        message = f"daemons at version {first.version} hold the engine's initial layout"
        return self._route(StartupOutcome("keep_own", Reason.INITIAL_LAYOUT, message, first, shared_rebalance=True))

    def adopt(self) -> Step:
        first = self._agreed()
        message = f"adopting the daemons' layout version {first.version}"
        return self._route(StartupOutcome("adopt", Reason.ADOPT, message, first, shared_rebalance=True))

    def refuse_fetch(self, reply: Mapping[str, Any]) -> Step:
        self._set(shares=False)
        return _stop(_reason_of(reply), f"fetch_state refused {fetch_refusal(reply)}", Severity.ERROR)

    def serve(self, rank: int) -> Step:
        self._set(served=self.view.served | {rank})
        return _move(Reason.SERVED_FOLLOWING, f"rank {rank} loaded from its daemon")

    def pass_fetch(self, reply: object) -> Step:
        """Not the layout's to judge (an error sglang's loader handles, or a fetch outside loading)."""
        return _move(_reason_of(reply), "fetch_state answered without a layout refusal")

    # -- rebalance guards: how the engine rebalances, then the spec's BeginChunk ... Verify ---

    def source_unknown(self, sources: Sequence[str | None]) -> bool:
        """Some rank cannot say where its weights came from: they may be the daemons' shared ones."""
        return any(s not in ("daemon", "disk") for s in sources)

    def from_disk_everywhere(self, sources: Sequence[str | None]) -> bool:
        return all(s == "disk" for s in sources)

    def from_disk_somewhere(self, sources: Sequence[str | None]) -> bool:
        return any(s == "disk" for s in sources)

    def elastic(self, elastic_ep: bool) -> bool:
        return elastic_ep

    def never_attached(self) -> bool:
        return self.view.outcome is None

    def startup_shares(self) -> bool:
        """Agree: ``eshare' = Adopts(e)``."""
        outcome = self.view.outcome
        return outcome is not None and outcome.shared_rebalance

    def no_begin_yet(self, rank: int) -> bool:
        """Begin: ``reb[e].replies[r] = "none"``."""
        return self.view.begins[rank] is None

    def every_rank_began(self) -> bool:
        """Decide: ``\\A r : reb[e].replies[r] # "none"``."""
        return all(a is not None for a in self.view.begins)

    def all_ok(self) -> bool:
        """Decide: ``replies = {"ok"}``."""
        return all(a is not None and a.ok for a in self.view.begins)

    def any_ok(self) -> bool:
        """Decide: ``"ok" \\in replies``: some daemon holds a move of this chunk to abort."""
        return any(a is not None and a.ok for a in self.view.begins)

    def any_refused(self) -> bool:
        """Decide: ``eshare' = "refused" \\notin replies`` (no readable reply counts as refused)."""
        return any(a is not None and a.refused for a in self.view.begins)

    def began_here(self, rank: int) -> bool:
        """Abort: ``reb[e].replies[r] = "ok"`` (and not aborted yet)."""
        answer = self.view.begins[rank]
        return answer is not None and answer.ok and rank not in self.view.aborted

    def last_to_abort(self, rank: int) -> bool:
        """Abort: ``\\A q \\in Ranks \\ {r} : reb[e].replies[q] # "ok"``."""
        return not any(self.began_here(q) for q in range(self.view.num_ranks) if q != rank)

    def still_shares(self) -> bool:
        """``eshare[e]``: the chunk paused (busy), it was not refused."""
        return self.view.shares

    def to_commit(self, rank: int) -> bool:
        """Commit: ``reb[e].replies[r] = "ok"`` (begun, not committed yet)."""
        v = self.view
        answer = v.begins[rank]
        return answer is not None and answer.ok and v.commits[rank] is None

    def every_rank_committed(self) -> bool:
        """Verify: ``\\A r : reb[e].replies[r] \\in {"committed", "commit_refused"}``."""
        return all(a is not None for a in self.view.commits)

    def good(self) -> bool:
        """Verify: every daemon committed, at ``ever[e] + 1``, the engine's own map (its digest)."""
        v = self.view
        want = v.version + 1
        return all(a is not None and a.ok and a.version == want and a.digest == v.moved_digest for a in v.commits)

    # -- rebalance actions ---------------------------------------------------------------

    def _mode(self, step: Step, shares: bool) -> Step:
        self._set(mode=step, shares=shares, off=step if step.go is Go.STOP else None)
        return step

    def off_unknown_source(self, sources: Sequence[str | None]) -> Step:
        ranks = [rank for rank, s in enumerate(sources) if s not in ("daemon", "disk")]
        return self._mode(
            _stop(
                Reason.UNKNOWN_SOURCE,
                f"ranks {ranks} cannot tell whether their weights came from disk or from the weight cache "
                "daemons (shared with other engines); rebalancing stays off, so that no shared weights move",
            ),
            False,
        )

    def go_local(self) -> Step:
        return self._mode(_move(Reason.LOCAL, "weights from disk on every rank: rebalancing as sglang does"), False)

    def off_mixed_sources(self) -> Step:
        return self._mode(
            _stop(
                Reason.MIXED_SOURCES,
                "some ranks loaded weights from disk and others from the weight cache daemons; rebalancing of "
                "shared weights stays off",
            ),
            False,
        )

    def off_elastic(self) -> Step:
        return self._mode(_stop(Reason.ELASTIC_EP, "elastic EP is on; rebalancing of shared weights stays off"), False)

    def off_not_attached(self) -> Step:
        return self._mode(
            _stop(
                Reason.NOT_ATTACHED,
                "the engine did not attach to its daemons; rebalancing of shared weights stays off",
            ),
            False,
        )

    def off_by_startup(self) -> Step:
        outcome = self.view.outcome
        assert outcome is not None
        return self._mode(_stop(outcome.reason, f"rebalancing of shared weights stays off: {outcome.message}"), False)

    def go_shared(self) -> Step:
        return self._mode(_move(Reason.SHARED, "rebalancing through the daemons' chunk protocol"), True)

    def take_chunk(self, layers: Sequence[int]) -> None:
        nothing = (None,) * self.view.num_ranks
        self._set(chunk=tuple(layers), begins=nothing, aborted=frozenset(), commits=nothing)

    def take_begin(self, rank: int, answer: RankAnswer) -> None:
        self._set(begins=_put(self.view.begins, rank, answer))

    def _answers(self, answers: Sequence[RankAnswer | None], keep: Callable[[RankAnswer], bool]) -> str:
        return "; ".join(f"rank {rank}: {a.text}" for rank, a in enumerate(answers) if a is not None and keep(a))

    def proceed(self) -> Step:
        return _move(Reason.BEGUN, "every daemon accepted the move")

    def _refused(self) -> Step:
        detail = self._answers(self.view.begins, lambda a: a.refused)
        step = _stop(
            Reason.BEGIN_REFUSED,
            f"a daemon refused the move for good ({detail}); rebalancing of shared weights is off",
        )
        self._set(shares=False, off=step)
        return step

    def stop_after_aborts(self) -> Step:
        return self._refused()

    def stop(self) -> Step:
        step = self._refused()
        self._end_chunk()
        return step

    def _busy(self) -> Step:
        detail = self._answers(self.view.begins, lambda a: a.status is Status.BUSY)
        return _pause(Reason.BEGIN_BUSY, f"rebalance paused, the next interval retries ({detail})")

    def pause_after_aborts(self) -> Step:
        return self._busy()

    def pause(self) -> Step:
        step = self._busy()
        self._end_chunk()
        return step

    def take_abort(self, rank: int) -> None:
        self._set(aborted=self.view.aborted | {rank})

    def end_aborts(self) -> None:
        self._end_chunk()

    def take_moved(self, rows: Rows) -> None:
        self._set(moved_rows=rows, moved_digest=layout_digest(rows))

    def take_commit(self, rank: int, answer: RankAnswer) -> None:
        self._set(commits=_put(self.view.commits, rank, answer))

    def _route_moved(self, version: int, off: Step | None) -> None:
        v = self.view
        self._set(rows=v.moved_rows, version=version, digest=v.moved_digest, off=off, shares=off is None)
        self._end_chunk()

    def keep_verified(self) -> Step:
        version = self.view.version + 1
        self._route_moved(version, None)
        return _move(Reason.COMMITTED, f"every daemon recorded version {version}")

    def refuse_unverified(self) -> Step:
        v = self.view
        problems = []
        for rank, answer in enumerate(v.commits):
            assert answer is not None
            if not answer.ok:
                problems.append(f"rank {rank}: commit not recorded ({answer.text})")
            elif answer.digest != v.moved_digest:
                problems.append(f"rank {rank}: daemon's digest differs from the engine's map")
        versions = sorted({a.version for a in v.commits if a is not None and a.ok}, key=str)
        if not problems and len(versions) != 1:
            problems.append(f"daemons report different versions {versions}")
        elif not problems:
            problems.append(f"daemons report version {versions[0]}, expected {v.version + 1}")
        step = _stop(
            Reason.COMMIT_UNVERIFIED,
            "expert move committed inconsistently: "
            + "; ".join(problems)
            + f". The engine keeps serving but rebalances no more; {RESTART_DAEMONS} before starting another "
            "engine on them.",
            Severity.ERROR,
        )
        self._route_moved(v.version, step)  # the engine routes with the moved map either way
        return step

    def _end_chunk(self) -> None:
        nothing = (None,) * self.view.num_ranks
        self._set(
            chunk=(),
            begins=nothing,
            aborted=frozenset(),
            moved_rows=None,
            moved_digest=None,
            commits=nothing,
        )


def _reason_of(reply: object) -> Reason:
    """The reason code of a daemon's reply (``unreadable`` for a reply without one: sglang's own)."""
    try:
        return Reply.from_wire(reply).reason
    except ValueError:
        return Reason.UNREADABLE


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


# -- the machines: declarations only (states, transitions, the names of guards and actions) -----


class StartupMachine(StateMachine):
    """The engine's startup (docs/protocol.md §5); its states are the spec's ``ephase``.

    Per-rank steps (attach, poll, timeout) keep the phase; agreement takes the first transition
    whose guards hold, in the order written: that order is the precedence of the failures.
    """

    start = State(initial=True)
    load = State()
    run = State()
    failed = State(final=True)

    attach = start.to.itself(internal=True, cond="not_found", on="take_finding")
    poll = start.to.itself(internal=True, cond="waits and move_ended", on="take_poll") | start.to.itself(
        internal=True, cond="waits", on="still_waiting"
    )
    timeout = start.to.itself(internal=True, cond="waits", on="time_out")
    gather = start.to.itself(internal=True, cond="one_per_rank", on="take_findings")
    agree = (
        start.to(failed, cond="every_rank_found and unreadable", on="fail_unreadable")
        | start.to(failed, cond="every_rank_found and timed_out", on="fail_timed_out")
        | start.to(failed, cond="every_rank_found and dirty", on="fail_dirty")
        | start.to(load, cond="every_rank_found and recorded_nowhere", on="keep_own_no_record")
        | start.to(failed, cond="every_rank_found and moved_beside_no_record", on="fail_moved_beside_no_record")
        | start.to(load, cond="every_rank_found and lacks_record", on="keep_own_mixed")
        | start.to(failed, cond="every_rank_found and records_differ", on="fail_records_differ")
        | start.to(failed, cond="every_rank_found and shape_differs", on="fail_shape")
        | start.to(load, cond="every_rank_found and record_is_initial", on="keep_own_initial")
        | start.to(failed, cond="every_rank_found and routes_statically", on="fail_routes_statically")
        | start.to(load, cond="every_rank_found", on="adopt")
    )
    fetch = (
        load.to(failed, cond="fetch_refused", on="refuse_fetch")
        | load.to(run, cond="fetch_served and last_to_serve", on="serve")
        | load.to.itself(internal=True, cond="fetch_served", on="serve")
        | load.to.itself(internal=True, on="pass_fetch")
        | start.to(failed, cond="fetch_refused", on="refuse_fetch")
        | start.to.itself(internal=True, on="pass_fetch")
        | run.to(failed, cond="fetch_refused", on="refuse_fetch")
        | run.to.itself(internal=True, on="pass_fetch")
    )


class RebalanceMachine(StateMachine):
    """The engine's rebalancing (docs/protocol.md §6), one chunk at a time; ``off`` is for good.

    ``start`` picks how the engine rebalances, in the order written (an unknown weight source
    first: it fails safe). Then the spec's BeginChunk (``chunk``), Begin, Decide, Abort, the end
    of sglang's move (``move``), Commit and Verify.
    """

    starting = State(initial=True)
    local = State(final=True)  # weights from disk: sglang's own rebalance, no protocol, for good
    idle = State()  # shared weights, between chunks
    beginning = State()
    aborting = State()  # the chunk does not go on: the ranks whose begin was ok abort it
    moving = State()
    committing = State()
    off = State(final=True)

    start = (
        starting.to(off, cond="source_unknown", on="off_unknown_source")
        | starting.to(local, cond="from_disk_everywhere", on="go_local")
        | starting.to(off, cond="from_disk_somewhere", on="off_mixed_sources")
        | starting.to(off, cond="elastic", on="off_elastic")
        | starting.to(off, cond="never_attached", on="off_not_attached")
        | starting.to(off, unless="startup_shares", on="off_by_startup")
        | starting.to(idle, on="go_shared")
    )
    chunk = idle.to(beginning, on="take_chunk")
    begin = beginning.to.itself(internal=True, cond="no_begin_yet", on="take_begin")
    decide = (
        beginning.to(moving, cond="every_rank_began and all_ok", on="proceed")
        | beginning.to(aborting, cond="every_rank_began and any_refused and any_ok", on="stop_after_aborts")
        | beginning.to(off, cond="every_rank_began and any_refused", on="stop")
        | beginning.to(aborting, cond="every_rank_began and any_ok", on="pause_after_aborts")
        | beginning.to(idle, cond="every_rank_began", on="pause")
    )
    abort = (
        aborting.to.itself(internal=True, cond="began_here and not last_to_abort", on="take_abort")
        | aborting.to(idle, cond="began_here and still_shares", on="end_aborts")
        | aborting.to(off, cond="began_here", on="end_aborts")
    )
    move = moving.to(committing, on="take_moved")
    commit = committing.to.itself(internal=True, cond="to_commit", on="take_commit")
    verify = committing.to(idle, cond="every_rank_committed and good", on="keep_verified") | committing.to(
        off, cond="every_rank_committed", on="refuse_unverified"
    )


__all__ = [
    "FINDING_KINDS",
    "AnyReply",
    "EngineLayout",
    "EnginePhase",
    "EngineState",
    "EngineView",
    "Go",
    "LoadSource",
    "RankAnswer",
    "RankFinding",
    "Reason",
    "RebalanceMachine",
    "RebalancePhase",
    "RecordStamp",
    "Severity",
    "StartupMachine",
    "StartupOutcome",
    "Step",
    "fetch_refusal",
    "needs_wait",
    "unwritten_slots_warning",
]
