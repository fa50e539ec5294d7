"""The daemon side of the protocol (docs/protocol.md §4): pure reply functions and the daemon machine.

Every reply the daemon gives is decided here, once:

- ``attach_reply``, ``begin_reply``, ``commit_reply``, ``abort_reply``, ``fetch_reply``,
  ``query_reply`` and ``detach_effect`` are pure functions of a ``DaemonView`` (an immutable
  snapshot) and a request;
- ``DaemonMachine`` is a python-statemachine ``StateMachine`` whose states are the record's
  phases (no record, clean, pending, dirty). It asks those functions for the reply, and a
  reply that accepts the request takes the transition named after the TLA+ action.

An adapter calls ``DaemonMachine`` methods and writes the reply back; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from statemachine import State, StateMachine

from layout_sm.messages import (
    AbortRequest,
    AttachRequest,
    BeginRequest,
    CommitRequest,
    FetchLayoutField,
    LayoutRequest,
    QueryRequest,
)
from layout_sm.reasons import RESTART_DAEMONS, Reason, Reply, busy, layout_refused, ok, refused
from layout_sm.record import LayoutError, LayoutRecord

NO_RECORD = "no_record"
CLEAN = "clean"
PENDING = "pending"
DIRTY = "dirty"
PHASES = (NO_RECORD, CLEAN, PENDING, DIRTY)
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
    """Why the layout is unknown: the mover left mid-move; kept for every refusal message."""

    engine_id: str
    layers: tuple[int, ...]
    base_version: int

    def to_wire(self) -> dict[str, Any]:
        return {"engine_id": self.engine_id, "layers": list(self.layers), "base_version": self.base_version}

    def describe(self) -> str:
        return (
            f"engine {self.engine_id!r} went away while moving layers {list(self.layers)} "
            f"from version {self.base_version}, so the experts in those layers are in an unknown mix "
            f"of the old and new places"
        )


@dataclass(frozen=True)
class DaemonView:
    """Everything the daemon knows about the layout, as one immutable value."""

    record: LayoutRecord | None
    attachments: Mapping[str, str] = field(default_factory=dict)  # engine_id -> session
    pending: Move | None = None
    dirty: DirtyInfo | None = None
    non_following_seen: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "attachments", dict(sorted(self.attachments.items())))

    @property
    def phase(self) -> str:
        if self.record is None:
            return NO_RECORD
        if self.dirty is not None:
            return DIRTY
        if self.pending is not None:
            return PENDING
        return CLEAN

    def holds(self, engine_id: str, session: str) -> bool:
        """Whether a live attachment of ``engine_id`` holds ``session``."""
        return self.attachments.get(engine_id) == session

    def __hash__(self) -> int:
        return hash((self.record, tuple(self.attachments.items()), self.pending, self.dirty, self.non_following_seen))

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
            "dirty": None if self.dirty is None else self.dirty.to_wire(),
            "attached": sorted(self.attachments),
            "non_following_seen": self.non_following_seen,
        }


# -- pure reply functions ----------------------------------------------------------------


def _invalid_layers(layers: tuple[int, ...], record: LayoutRecord | None) -> str | None:
    if not layers:
        return "the layer list is empty"
    if len(set(layers)) != len(layers):
        return f"layer list {list(layers)} has duplicates"
    if record is not None:
        out = [layer for layer in layers if not 0 <= layer < record.num_layers]
        if out:
            return f"layers {out} are not in 0..{record.num_layers - 1}"
    return None


def attach_reply(view: DaemonView, req: AttachRequest, session: str) -> Reply:
    """Attach succeeds for a fresh engine id while fewer than ``MAX_ATTACHMENTS`` are attached;
    it reports what the engine must know."""
    if req.engine_id in view.attachments:
        return refused(
            Reason.ENGINE_ID_IN_USE,
            f"engine id {req.engine_id!r} is already attached to this daemon; each engine instance "
            f"needs its own id (a restarted engine picks a new one).",
        )
    if len(view.attachments) >= MAX_ATTACHMENTS:
        return busy(
            Reason.TOO_MANY_ATTACHMENTS,
            f"engine {req.engine_id!r} not attached: {len(view.attachments)} engines are attached to this "
            f"daemon, its limit of {MAX_ATTACHMENTS}. Retry after some stop (an attachment ends when its "
            f"engine process exits); `expert-layout status` lists the attached engine ids.",
            limit=MAX_ATTACHMENTS,
        )
    state = view.state_wire(include_map=False)
    return ok(
        Reason.ATTACHED,
        f"engine {req.engine_id!r} attached",
        session=session,
        record=None if view.record is None else view.record.to_wire(include_map=True),
        pending=state["pending"],
        dirty=state["dirty"],
        phase=state["phase"],
        non_following_seen=view.non_following_seen,
    )


def begin_reply(view: DaemonView, req: BeginRequest) -> Reply:
    """The begin precedence of docs/protocol.md §4: permanent refusals, then transient ``busy``."""
    # 1. the request itself
    if not view.holds(req.engine_id, req.session):
        return refused(
            Reason.NOT_ATTACHED,
            f"engine {req.engine_id!r} holds no live attachment with this session on this daemon; "
            f"only the attached engine that owns the session may move experts. Not retryable.",
        )
    problem = _invalid_layers(req.layers, view.record)
    if problem is not None:
        return refused(Reason.INVALID_LAYERS, f"invalid layer list: {problem}. Not retryable.")
    if view.pending is not None and view.pending.engine_id == req.engine_id:
        return refused(
            Reason.OWN_MOVE_PENDING,
            f"engine {req.engine_id!r} already has a move of layers {list(view.pending.layers)} pending; "
            f"commit or abort it first. Not retryable.",
        )
    # 2. the daemon's state, permanent until it restarts
    if view.record is None:
        return refused(
            Reason.NO_RECORD,
            "this daemon keeps no expert-layout record (started without --enable-eplb, or an older "
            "daemon), so shared weights cannot be rebalanced; start the daemons with --enable-eplb.",
        )
    if view.dirty is not None:
        return refused(Reason.DIRTY, f"the layout is unknown: {view.dirty.describe()}; {RESTART_DAEMONS}.")
    if view.non_following_seen:
        return refused(
            Reason.NON_FOLLOWING_SEEN,
            "an engine that does not follow layout moves (an older engine, or one without a live "
            "attachment) maps these weights; moving experts would corrupt its outputs. Rebalancing of "
            f"shared weights stays off until the daemons restart; to rebalance, {RESTART_DAEMONS}.",
        )
    if req.base_version != view.record.version:
        return refused(
            Reason.STALE_BASE_VERSION,
            f"begin names base version {req.base_version} but the daemon is at version "
            f"{view.record.version}; this engine's layout is not the daemon's. Not retryable.",
            version=view.record.version,
        )
    # 3. transient: someone else is here
    if view.pending is not None:
        return busy(
            Reason.MOVE_PENDING,
            f"engine {view.pending.engine_id!r} is moving layers {list(view.pending.layers)}; retry later.",
            pending=view.pending.to_wire(),
        )
    others = sorted(e for e in view.attachments if e != req.engine_id)
    if others:
        return busy(
            Reason.OTHER_ENGINE_ATTACHED,
            f"engines {others} also map these weights; experts move only while one engine is alone "
            f"on its daemons. Rebalancing resumes when they detach.",
            attached=others,
        )
    # 4. accepted
    return ok(
        Reason.BEGUN,
        f"move of layers {list(req.layers)} by {req.engine_id!r} pending from version {view.record.version}",
        version=view.record.version,
    )


def commit_reply(view: DaemonView, req: CommitRequest) -> Reply:
    """Commit needs this session's pending move, the same layers, and rows of the right shape."""
    return commit_decision(view, req)[0]


def commit_decision(view: DaemonView, req: CommitRequest) -> tuple[Reply, LayoutRecord | None]:
    """The commit reply and, when accepted, the new record (validated once, used as is)."""
    if not view.holds(req.engine_id, req.session):
        return refused(
            Reason.NOT_ATTACHED,
            f"engine {req.engine_id!r} holds no live attachment with this session; commit refused.",
        ), None
    if view.dirty is not None:
        return refused(Reason.DIRTY, f"the layout is unknown: {view.dirty.describe()}; {RESTART_DAEMONS}."), None
    move = view.pending
    if move is None or move.engine_id != req.engine_id or move.session != req.session:
        return refused(
            Reason.NO_PENDING_MOVE,
            f"engine {req.engine_id!r} has no move pending on this daemon; begin comes before commit.",
        ), None
    if req.layers != move.layers:
        return refused(
            Reason.LAYERS_MISMATCH,
            f"commit names layers {list(req.layers)} but the pending move is of layers "
            f"{list(move.layers)}; the move stays pending.",
        ), None
    assert view.record is not None  # a pending move implies a record
    try:
        new_record = view.record.with_rows(req.layers, req.rows)
    except LayoutError as error:
        return refused(Reason.BAD_ROWS, f"commit rows rejected: {error}; the move stays pending."), None
    return ok(
        Reason.COMMITTED,
        f"layers {list(req.layers)} committed by {req.engine_id!r}: version {new_record.version}",
        version=new_record.version,
        digest=new_record.digest,
    ), new_record


def abort_reply(view: DaemonView, req: AbortRequest) -> Reply:
    """Abort is idempotent for the owner of the session, and refused for anyone else."""
    if not view.holds(req.engine_id, req.session):
        return refused(
            Reason.NOT_ATTACHED,
            f"engine {req.engine_id!r} holds no live attachment with this session; abort refused.",
        )
    move = view.pending
    if move is not None and move.engine_id == req.engine_id and move.session == req.session:
        return ok(Reason.ABORTED, f"move of layers {list(move.layers)} by {req.engine_id!r} aborted")
    return ok(Reason.NOTHING_TO_ABORT, f"engine {req.engine_id!r} has no move pending; nothing to abort")


def query_reply(view: DaemonView, req: QueryRequest) -> Reply:
    return ok(Reason.QUERIED, "expert layout state", **view.state_wire(include_map=req.include_map))


def fetch_reply(view: DaemonView, claim: FetchLayoutField | None) -> Reply:
    """The layout check of ``fetch_state``: serve only an engine that will route correctly.

    ``ok`` replies with reason ``served_non_following`` or ``served_older_engine`` set the
    sticky non-following flag (see ``DaemonMachine.fetch_check``).
    """
    record = view.record
    if record is None:
        return ok(Reason.SERVED_NO_RECORD, "daemon keeps no layout record; served as sglang does")
    if view.dirty is not None:
        return layout_refused(
            Reason.DIRTY, f"fetch_state refused: the layout is unknown: {view.dirty.describe()}; {RESTART_DAEMONS}."
        )
    if view.pending is not None:
        return layout_refused(
            Reason.MOVE_PENDING,
            f"fetch_state refused: engine {view.pending.engine_id!r} is moving layers "
            f"{list(view.pending.layers)} right now, so the weights are mid-move; retry after it ends.",
            pending=view.pending.to_wire(),
        )
    if claim is None:
        if record.version == 0:
            return ok(
                Reason.SERVED_OLDER_ENGINE,
                "served an engine without the layout plugin at the initial layout (version 0); "
                "rebalancing of these shared weights is now off until the daemons restart",
            )
        return layout_refused(
            Reason.OLDER_ENGINE_AFTER_MOVE,
            f"fetch_state refused: experts have moved (layout version {record.version}) and this engine "
            f"does not send its expert layout, so it would route tokens to the wrong experts. Install the "
            f"expert-layout plugin in the engine, or {RESTART_DAEMONS}.",
            version=record.version,
        )
    if claim.digest != record.digest:
        return layout_refused(
            Reason.DIGEST_MISMATCH,
            f"fetch_state refused: the engine routes with layout version {claim.version} but the daemon's "
            f"weights are at version {record.version} (digests differ); the engine must start from the "
            f"daemon's record (its layout plugin does this at startup), or {RESTART_DAEMONS}.",
            version=record.version,
            digest=record.digest,
        )
    if view.holds(claim.engine_id, claim.session):
        return ok(Reason.SERVED_FOLLOWING, f"served engine {claim.engine_id!r} at version {record.version}")
    return ok(
        Reason.SERVED_NON_FOLLOWING,
        f"served engine {claim.engine_id!r} at version {record.version} without a live attachment; it will "
        f"not follow moves, so rebalancing of these shared weights is now off until the daemons restart",
    )


@dataclass(frozen=True)
class DetachEffect:
    """What the daemon does when an attachment's connection reaches EOF."""

    dropped: bool
    dirty: DirtyInfo | None
    message: str


def detach_effect(view: DaemonView, engine_id: str, session: str) -> DetachEffect:
    if not view.holds(engine_id, session):
        return DetachEffect(False, None, f"stale detach of {engine_id!r} ignored (session not live)")
    move = view.pending
    if move is not None and move.engine_id == engine_id and move.session == session:
        info = DirtyInfo(move.engine_id, move.layers, move.base_version)
        return DetachEffect(True, info, f"daemon is now DIRTY: {info.describe()}; {RESTART_DAEMONS}")
    return DetachEffect(True, None, f"engine {engine_id!r} detached")


# -- the machine -------------------------------------------------------------------------


def _loops(*states: State) -> Any:
    """One internal self-transition per state: the event is answered without a phase change."""
    transitions = states[0].to.itself(internal=True)
    for state in states[1:]:
        transitions |= state.to.itself(internal=True)
    return transitions


class DaemonMachine(StateMachine):
    """The daemon's layout record as a state machine; event names follow the TLA+ actions.

    Events accept only a precomputed ``reply`` and its request; guards read the reply, so the
    transition taken and the reply given can never disagree.

    Attach, query and the fetch check can never change the phase (they are self-loops in every
    state), so they are answered by their pure reply functions without an event: an event costs
    100-400 µs in python-statemachine here (measured), more than the whole layout check of a
    ``fetch_state`` should (the target is 5% of sglang's own handler).
    """

    # A daemon loads its weights, then keeps a record (--enable-eplb) or none for its whole life.
    loading = State("loading", initial=True)
    no_record = State(NO_RECORD)
    clean = State(CLEAN)
    pending = State(PENDING)
    dirty = State(DIRTY)

    loaded_with_record = loading.to(clean)
    loaded_without_record = loading.to(no_record)

    begin = clean.to(pending, cond="begin_accepted") | _loops(no_record, clean, pending, dirty)
    commit = pending.to(clean, cond="moved_ends") | _loops(no_record, clean, pending, dirty)
    abort = pending.to(clean, cond="moved_ends") | _loops(no_record, clean, pending, dirty)
    detach = pending.to(dirty, cond="mover_left") | _loops(no_record, clean, pending, dirty)

    def __init__(self, record: LayoutRecord | None) -> None:
        self._view = DaemonView(record)
        super().__init__()
        self.send("loaded_with_record" if record is not None else "loaded_without_record")

    # -- guards (named after the spec's conjuncts) --------------------------------------

    def begin_accepted(self, reply: Reply, **_: Any) -> bool:
        return reply.ok

    def moved_ends(self, reply: Reply, **_: Any) -> bool:
        return reply.reason in (Reason.COMMITTED, Reason.ABORTED)

    def mover_left(self, effect: DetachEffect, **_: Any) -> bool:
        return effect.dirty is not None

    # -- reading and loading ------------------------------------------------------------

    def view(self) -> DaemonView:
        return self._view

    def restore(self, view: DaemonView) -> None:
        """Put the machine in ``view``'s state (the explorer reuses one machine per daemon)."""
        self._view = view
        self.current_state_value = view.phase

    @property
    def phase(self) -> str:
        return str(self.current_state_value)

    # -- events -------------------------------------------------------------------------

    def handle(self, request: LayoutRequest, session: str | None = None) -> Reply:
        """Answer a parsed layout request (``session`` is the fresh token for an attach)."""
        if isinstance(request, AttachRequest):
            if session is None:
                raise ValueError("attach needs the fresh session token made by the adapter")
            return self.attach_engine(request, session)
        if isinstance(request, QueryRequest):
            return query_reply(self._view, request)
        if isinstance(request, BeginRequest):
            return self.begin_move(request)
        if isinstance(request, CommitRequest):
            return self.commit_move(request)
        if isinstance(request, AbortRequest):
            return self.abort_move(request)
        raise TypeError(f"not a layout request: {type(request).__name__}")

    def attach_engine(self, request: AttachRequest, session: str) -> Reply:
        reply = attach_reply(self._view, request, session)
        if reply.ok:
            attachments = dict(self._view.attachments)
            attachments[request.engine_id] = session
            self._view = replace(self._view, attachments=attachments)
        return reply

    def begin_move(self, request: BeginRequest) -> Reply:
        reply = begin_reply(self._view, request)
        if reply.ok:
            move = Move(request.engine_id, request.session, request.layers, request.base_version)
            self._view = replace(self._view, pending=move)
        self.send("begin", reply=reply)
        return reply

    def commit_move(self, request: CommitRequest) -> Reply:
        reply, record = commit_decision(self._view, request)
        if record is not None:
            self._view = replace(self._view, record=record, pending=None)
        self.send("commit", reply=reply)
        return reply

    def abort_move(self, request: AbortRequest) -> Reply:
        reply = abort_reply(self._view, request)
        if reply.reason is Reason.ABORTED:
            self._view = replace(self._view, pending=None)
        self.send("abort", reply=reply)
        return reply

    def detach_engine(self, engine_id: str, session: str) -> DetachEffect:
        """The attach connection of ``engine_id`` reached EOF (however the engine died)."""
        effect = detach_effect(self._view, engine_id, session)
        if effect.dropped:
            attachments = {e: s for e, s in self._view.attachments.items() if e != engine_id}
            view = replace(self._view, attachments=attachments)
            if effect.dirty is not None:
                view = replace(view, pending=None, dirty=effect.dirty)
            self._view = view
        self.send("detach", effect=effect)
        return effect

    def fetch_check(self, claim: FetchLayoutField | None) -> Reply:
        """The layout check of sglang's ``fetch_state``; sets the sticky non-following flag."""
        reply = fetch_reply(self._view, claim)
        if reply.reason in (Reason.SERVED_NON_FOLLOWING, Reason.SERVED_OLDER_ENGINE):
            self._view = replace(self._view, non_following_seen=True)
        return reply

    def query_state(self, include_map: bool = False) -> Reply:
        return self.handle(QueryRequest(include_map))
