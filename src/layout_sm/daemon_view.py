"""What a daemon knows about the expert layout (docs/protocol.md §3, §4), and what it is asked.

``DaemonView`` is one immutable value: the record, the live attachments, the pending move, the
torn move and the flags. Its methods are the conjuncts of the spec's daemon actions
(spec/LayoutProtocol.tla: Attach, Fetch, Begin, Commit, Abort, Detach, Park, Claim, the repair's
actions): ``holds``, ``alone``, ``base_is_current``, ``moved_by``, ``pending_layers_are``, ... The
ladders (``layout_sm.ladders``) and the machine's guards (``layout_sm.daemon``) ask the same
methods, so a conjunct is written once.

The requests that have no wire form of their own (an attach with its fresh session, the EOF of an
attach connection, sglang's ``fetch_state`` with its claim, the end of a repair) are declared here
beside the wire requests of ``layout_sm.messages``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from layout_sm.frozen import copied_with
from layout_sm.messages import (
    AbortRequest,
    BeginRequest,
    ClaimRequest,
    CommitRequest,
    FetchLayoutField,
    ParkRequest,
    RejoinRequest,
    RepairRequest,
    SessionRequest,
)
from layout_sm.reasons import Reason, Reply
from layout_sm.record import LayoutError, LayoutRecord

LOADING = "loading"
NO_RECORD = "no_record"
CLEAN = "clean"
PENDING = "pending"
DIRTY = "dirty"
REPAIRING = "repairing"
# Live attachments a daemon keeps at once. Each costs the daemon a thread and a descriptor; an
# engine has one per daemon, so 64 is far beyond any deployment (the protocol lets only an engine
# alone on its daemons move experts) and far below the descriptor limit (1,024 by default).
MAX_ATTACHMENTS = 64


@dataclass(frozen=True)
class Move:
    """A move begun by ``engine_id`` in ``session`` and neither committed nor aborted yet."""

    engine_id: str
    session: str
    layers: tuple[int, ...]
    base_version: int

    def to_wire(self) -> dict[str, Any]:
        # The session stays private to its owner: it is the capability to commit or abort.
        return {"engine_id": self.engine_id, "layers": list(self.layers), "base_version": self.base_version}


@dataclass(frozen=True)
class DirtyInfo:
    """Why the layout is unknown: the mover left mid-move; kept for every refusal message. A rejoin
    is the same reload with every layer as the torn move (``rejoin``: the daemon was behind and
    ``engine_id`` asked it to reload at the newest record the other daemons hold)."""

    engine_id: str
    layers: tuple[int, ...]
    base_version: int
    # Only names the reload in the status and the messages: no guard reads it, and a rejoin's reload is
    # the same state as a torn move of every layer at that base (the spec's one dpend), so it is no part
    # of the state's identity.
    rejoin: bool = field(default=False, compare=False)

    def to_wire(self) -> dict[str, Any]:
        wire = {"engine_id": self.engine_id, "layers": list(self.layers), "base_version": self.base_version}
        return {**wire, "rejoin": True} if self.rejoin else wire

    def describe(self) -> str:
        if self.rejoin:
            return (
                f"the daemon started again from disk and engine {self.engine_id!r} asked it to rejoin at version "
                f"{self.base_version}, so the routed experts of its {len(self.layers)} layers are being reloaded "
                f"at that version's places"
            )
        return (
            f"engine {self.engine_id!r} went away while moving layers {list(self.layers)} "
            f"from version {self.base_version}, so the experts in those layers are in an unknown mix "
            f"of the old and new places"
        )


# -- the requests that have no wire form of their own ---------------------------------------------


@dataclass(frozen=True)
class Attach(SessionRequest):
    """An attach with the fresh session token the adapter made for it."""

    known_digest: str | None = None  # the engine holds that map already (``AttachRequest.known_digest``)


@dataclass(frozen=True)
class Detach(SessionRequest):
    """The EOF of the attach connection of ``engine_id``, which held ``session``."""


@dataclass(frozen=True)
class Fetch:
    """sglang's ``fetch_state`` with the engine's claim (None: an engine without the plugin).

    The claim's fields are read only by the conjuncts after ``claims``, which holds only with a claim."""

    claim: FetchLayoutField | None
    # The engine's layout plugin is only partly installed (``layout_sm.messages.PLUGIN_GAPS``): sglang did
    # not apply some of its hooks. Outside the spec's model (its engines have the whole plugin or none).
    gap: str | None = None

    @property
    def engine_id(self) -> str:
        return self.claimed().engine_id

    @property
    def session(self) -> str:
        return self.claimed().session

    @property
    def digest(self) -> str:
        return self.claimed().digest

    def claimed(self) -> FetchLayoutField:
        """The claim; asked only once the ladder found one (the conjunct ``claims``)."""
        if self.claim is None:
            raise ValueError("a fetch without a claim has no engine id, session or digest")
        return self.claim


@dataclass(frozen=True)
class RepairDone:
    """The adapter's reload of the torn move's ``layers`` ended well; ``message`` and ``data`` say
    what it did (seconds, bytes read), for the operator's reply."""

    layers: tuple[int, ...]
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RepairFailed:
    """The adapter's reload failed (a read error, a missing file) or was refused (a model or
    quantization it cannot repair layer by layer): ``reason`` and ``why``."""

    reason: Reason
    why: str


def rejoin_target(
    record: LayoutRecord | None, version: int, digest: str, rows: tuple[tuple[int, ...], ...]
) -> LayoutRecord | None:
    """The record a daemon holding ``record`` rejoins at, or None when the request does not describe one
    of its shape (a version above 0, a valid map of ``record``'s shape and experts, the digest given)."""
    if record is None or version < 1:
        return None
    try:
        target = LayoutRecord.build(rows, record.num_logical, version)
    except LayoutError:
        return None
    return target if target.shape == record.shape and target.digest == digest else None


def invalid_layers(layers: tuple[int, ...], record: LayoutRecord | None) -> str | None:
    if not layers:
        return "the layer list is empty"
    if len(set(layers)) != len(layers):
        return f"layer list {list(layers)} has duplicates"
    if record is not None:
        out = [layer for layer in layers if not 0 <= layer < record.num_layers]
        if out:
            return f"layers {out} are not in 0..{record.num_layers - 1}"
    return None


class DaemonConjuncts:
    """The conjuncts of the spec's daemon actions (spec/LayoutProtocol.tla), asked by the machine's
    guards and the ladders alike, over a daemon's ``record``, ``attachments``, ``pending``, ``dirty``,
    ``non_following_seen``, ``repairing``, ``auto_repair`` and ``parked``. A conjunct's parameters
    are named after the fields of the request it is asked about."""

    record: LayoutRecord | None
    attachments: Mapping[str, str]
    pending: Move | None
    dirty: DirtyInfo | None
    non_following_seen: bool
    repairing: bool
    auto_repair: bool
    parked: frozenset[str]

    def holds(self, engine_id: str, session: str) -> bool:
        """A live attachment of ``engine_id`` holds ``session`` (spec: ``e \\in datt[r]``)."""
        return self.attachments.get(engine_id) == session

    def unparked(self) -> list[str]:
        """The attached engines that are not parked standbys (spec: ``Unparked(r)``), in attach order."""
        return [e for e in self.attachments if e not in self.parked]

    def alone(self, engine_id: str) -> bool:
        """No other unparked engine is attached (spec: ``Unparked(r) \\ {e} = {}``): a parked standby
        runs no forward pass, so it does not count."""
        return all(e == engine_id for e in self.unparked())

    def is_parked(self, engine_id: str) -> bool:
        """The engine's attachment is a parked standby's (spec: ``e \\in dpark[r]``)."""
        return engine_id in self.parked

    def none_unparked(self) -> bool:
        """Every attachment is a parked standby's (spec: ``Unparked(r) = {}``)."""
        return not self.unparked()

    def notified(self, leaving: str | None = None) -> tuple[str, ...]:
        """The parked standbys the daemon notifies once ``leaving``'s attachment is gone (spec:
        ``Notify``): all of them when no unparked engine is left, else none; none while it repairs
        (the repair's end tells them)."""
        if not all(e == leaving for e in self.unparked()) or self.is_repairing():
            return ()
        return tuple(sorted(e for e in self.attachments if e != leaving and e in self.parked))

    def base_is_current(self, base_version: int) -> bool:
        """The engine's version is the record's (spec: ``ever[e] = dver[r]``)."""
        return self.record is not None and base_version == self.record.version

    def moved_by(self, engine_id: str, session: str) -> bool:
        """The pending move is this engine's, begun in this session (spec: ``dpend[r].mover = e``)."""
        move = self.pending
        return move is not None and move.engine_id == engine_id and move.session == session

    def pending_layers_are(self, layers: tuple[int, ...]) -> bool:
        """The pending move is of these layers (spec: ``dpend[r].layers = reb[e].chunk``)."""
        return self.pending is not None and self.pending.layers == layers

    def has_record(self) -> bool:
        """The daemon keeps a record (spec: ``dphase[r] # "no_record"``)."""
        return self.record is not None

    def is_dirty(self) -> bool:
        """A mover left mid-move and no repair runs (spec: ``dphase[r] = "dirty"``)."""
        return self.dirty is not None and not self.repairing

    def is_repairing(self) -> bool:
        """The daemon reloads the torn move's layers (spec: ``dphase[r] = "repairing"``)."""
        return self.dirty is not None and self.repairing

    def repairs_automatically(self) -> bool:
        """The daemon was started with auto repair (spec: the constant ``Repairs``)."""
        return self.auto_repair

    def repair_is_of(self, layers: tuple[int, ...]) -> bool:
        """The repair that ended is of the torn move's layers (outside the spec: its repair is one step)."""
        return self.dirty is not None and tuple(sorted(self.dirty.layers)) == tuple(sorted(layers))

    def move_pending(self) -> bool:
        """Some engine's move is pending (spec: ``dphase[r] = "pending"``)."""
        return self.pending is not None

    def own_move_pending(self, engine_id: str) -> bool:
        """This engine's move is pending (spec: ``dphase[r] = "pending" /\\ dpend[r].mover = e``)."""
        return self.pending is not None and self.pending.engine_id == engine_id

    def foreign_pending(self, engine_id: str) -> bool:
        """Another engine's move is pending (spec: ``ForeignPending(e, r)``)."""
        return self.pending is not None and self.pending.engine_id != engine_id

    def saw_non_following(self) -> bool:
        """An engine that does not follow moves was served (spec: ``dnf[r]``)."""
        return self.non_following_seen

    def layers_valid(self, layers: tuple[int, ...]) -> bool:
        """The layer list is a set of the record's layers (the spec's chunks are, by construction)."""
        return invalid_layers(layers, self.record) is None

    def rows_fit(self, layers: tuple[int, ...], rows: tuple[tuple[int, ...], ...]) -> bool:
        """The rows are ``[len(layers)][P]`` experts of the record (the spec's maps are, by construction)."""
        return self.record is not None and not isinstance(self.record.successor(layers, rows), LayoutError)

    def behind(self, version: int) -> bool:
        """The record is older than ``version`` (spec: ``dver[r] < v``): a rejoin never rewinds a daemon."""
        return self.record is not None and self.record.version < version

    def only_attached(self, engine_id: str) -> bool:
        """No engine but this one is attached, parked or not (spec: ``datt[r] \\subseteq {e}``)."""
        return all(e == engine_id for e in self.attachments)

    def rejoin_fits(self, version: int, digest: str, rows: tuple[tuple[int, ...], ...]) -> bool:
        """The record to rejoin at is a moved version of a map of this daemon's shape, whose digest is
        the one the engine's ranks agreed on (the spec's records are, by construction)."""
        return rejoin_target(self.record, version, digest, rows) is not None

    def engine_id_free(self, engine_id: str) -> bool:
        """No live attachment has this engine id (spec: a new engine attaches, ``e \\notin datt[r]``)."""
        return engine_id not in self.attachments

    def has_room(self) -> bool:
        """Fewer than ``MAX_ATTACHMENTS`` engines are attached (the spec's engines are few)."""
        return len(self.attachments) < MAX_ATTACHMENTS

    def claims_or_initial(self, claim: FetchLayoutField | None) -> bool:
        """The engine says what it routes with, or the record is the initial one (spec: FetchServes
        for ``e \\in Older``: ``dver[r] = 0``)."""
        return claim is not None or (self.record is not None and self.record.version == 0)

    def plugin_complete(self, gap: str | None) -> bool:
        """The engine did not say that part of its layout plugin is missing (outside the spec)."""
        return gap is None

    def claims(self, claim: FetchLayoutField | None) -> bool:
        """The engine has the layout plugin (spec: ``e \\notin Older``)."""
        return claim is not None

    def digest_is_current(self, digest: str) -> bool:
        """The engine routes with the record's map (spec: ``eroute[e] = dmap[r]``)."""
        return self.record is not None and digest == self.record.digest


@dataclass(frozen=True)
class DaemonView(DaemonConjuncts):
    """Everything the daemon knows about the layout, as one immutable value."""

    record: LayoutRecord | None
    attachments: Mapping[str, str] = field(default_factory=dict)  # engine_id -> session
    pending: Move | None = None
    # The torn move: the mover left mid-move. Kept while the daemon repairs it (``repairing``), and
    # after a failed repair (``repair_failed``, why), until a repair ends clean or the daemon restarts.
    dirty: DirtyInfo | None = None
    non_following_seen: bool = False
    repairing: bool = False  # the daemon reloads the torn move's layers (spec: dphase = "repairing")
    repair_failed: str | None = None  # why the last repair failed (the daemon is dirty)
    # Started with auto repair (spec: the constant Repairs): the mover's EOF starts the repair at once.
    auto_repair: bool = True
    # The parked warm standbys' attachments (spec: dpark[r]), a subset of ``attachments``: no begin counts them.
    parked: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attachments", dict(sorted(self.attachments.items())))
        object.__setattr__(self, "parked", frozenset(self.parked))

    def evolve(self, **changes: Any) -> DaemonView:
        """This view with ``changes``, normalized as ``__post_init__`` does when they touch what it
        normalizes (``layout_sm.frozen.copied_with``)."""
        unknown = changes.keys() - self.__dict__.keys()
        if unknown:
            raise TypeError(f"DaemonView has no field {sorted(unknown)}")
        new = copied_with(self, changes)
        if "attachments" in changes or "parked" in changes:
            new.__post_init__()
        return new

    @property
    def phase(self) -> str:
        if self.record is None:
            return NO_RECORD
        if self.dirty is not None:
            return REPAIRING if self.repairing else DIRTY
        if self.pending is not None:
            return PENDING
        return CLEAN

    def __hash__(self) -> int:
        return hash(
            (
                self.record,
                tuple(self.attachments.items()),
                self.pending,
                self.dirty,
                self.non_following_seen,
                self.repairing,
                self.repair_failed,
                self.auto_repair,
                self.parked,
            )
        )

    def state_wire(self, include_map: bool = False) -> dict[str, Any]:
        """The daemon's state as ``expert_layout_query`` reports it."""
        record = self.record
        return {
            "phase": self.phase,
            "has_record": record is not None,
            "version": None if record is None else record.version,
            "digest": None if record is None else record.digest,
            "shape": None if record is None else list(record.shape),
            "num_logical": None if record is None else record.num_logical,
            "map": [list(r) for r in record.rows] if (record is not None and include_map) else None,
            "pending": None if self.pending is None else self.pending.to_wire(),
            # A repairing daemon's torn move is under "repairing", not "dirty": an engine waits on it.
            "dirty": None if self.dirty is None or self.repairing else self.dirty.to_wire(),
            "repairing": self.dirty.to_wire() if self.dirty is not None and self.repairing else None,
            "repair_failed": self.repair_failed,
            "auto_repair": self.auto_repair,
            "attached": sorted(self.attachments),
            "parked": sorted(self.parked),
            "non_following_seen": self.non_following_seen,
        }


@dataclass(frozen=True)
class DetachEffect:
    """What the daemon did when an attachment's connection reached EOF."""

    dropped: bool
    dirty: DirtyInfo | None
    message: str
    # The parked standbys to notify on their attach connections (no unparked engine is left).
    notified: tuple[str, ...] = ()

    @property
    def severity(self) -> int:
        """How loudly the daemon logs it (a ``logging`` level): a torn move is a warning."""
        return 30 if self.dirty is not None else 20


# What the daemon machine takes: a wire request, or one of the requests above.
Request = (
    Attach
    | Detach
    | Fetch
    | BeginRequest
    | CommitRequest
    | AbortRequest
    | RepairRequest
    | RepairDone
    | RepairFailed
    | ParkRequest
    | ClaimRequest
    | RejoinRequest
)
# What it answers: a reply, or for a detach (no one to reply to) what the detach did.
Answer = Reply | DetachEffect
