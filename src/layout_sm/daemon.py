"""The daemon side of the protocol (docs/protocol.md §4): pure reply functions and the daemon machine.

Every reply the daemon gives is decided here, once:

- ``DaemonView`` is what a daemon knows (an immutable snapshot); its methods ``holds``,
  ``alone``, ``base_is_current``, ``moved_by`` and ``pending_layers_are`` are the conjuncts of the
  spec's daemon actions (spec/LayoutProtocol.tla: Begin, Commit, Abort, Detach);
- ``attach_reply``, ``begin_reply``, ``commit_reply``, ``abort_reply``, ``fetch_reply``,
  ``query_reply`` and ``detach_effect`` make the reply texts: pure functions of a view and a
  request that ask those conjuncts in the precedence of docs/protocol.md §4;
- ``DaemonMachine`` is a python-statemachine ``StateMachine`` whose states are the record's
  phases (no record, clean, pending, dirty). Its transitions declare what each request may do
  in each phase, its guards are the conjuncts, and the actions of the transition taken change
  the view and make the reply.

An adapter calls ``DaemonMachine`` methods and writes the reply back; it decides nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

from statemachine import State, StateMachine

from layout_sm.messages import (
    STARTUP_HOOK_MISSING,
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

    # -- the spec's conjuncts (spec/LayoutProtocol.tla), asked by the replies and the machine --

    def holds(self, engine_id: str, session: str) -> bool:
        """Whether a live attachment of ``engine_id`` holds ``session`` (spec: ``e \\in datt[r]``)."""
        return self.attachments.get(engine_id) == session

    def alone(self, engine_id: str) -> bool:
        """No other engine is attached (spec: ``datt[r] \\ {e} = {}``)."""
        return all(e == engine_id for e in self.attachments)

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
    if not view.base_is_current(req.base_version):
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
    if not view.alone(req.engine_id):
        others = sorted(e for e in view.attachments if e != req.engine_id)
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


def commit_decision(
    view: DaemonView, req: CommitRequest, built: LayoutRecord | None = None
) -> tuple[Reply, LayoutRecord | None]:
    """The commit reply and, when accepted, the new record (validated once, used as is).

    ``built`` is the new record when the caller has built it already from ``view`` and ``req``
    (the machine's ``rows_fit`` guard does, so that a full-map commit's rows are checked once)."""
    if not view.holds(req.engine_id, req.session):
        return refused(
            Reason.NOT_ATTACHED,
            f"engine {req.engine_id!r} holds no live attachment with this session; commit refused.",
        ), None
    if view.dirty is not None:
        return refused(Reason.DIRTY, f"the layout is unknown: {view.dirty.describe()}; {RESTART_DAEMONS}."), None
    if not view.moved_by(req.engine_id, req.session):
        return refused(
            Reason.NO_PENDING_MOVE,
            f"engine {req.engine_id!r} has no move pending on this daemon; begin comes before commit.",
        ), None
    assert view.pending is not None and view.record is not None  # a pending move implies a record
    if not view.pending_layers_are(req.layers):
        return refused(
            Reason.LAYERS_MISMATCH,
            f"commit names layers {list(req.layers)} but the pending move is of layers "
            f"{list(view.pending.layers)}; the move stays pending.",
        ), None
    try:
        new_record = built if built is not None else view.record.with_rows(req.layers, req.rows)
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
    if view.moved_by(req.engine_id, req.session):
        assert view.pending is not None
        return ok(Reason.ABORTED, f"move of layers {list(view.pending.layers)} by {req.engine_id!r} aborted")
    return ok(Reason.NOTHING_TO_ABORT, f"engine {req.engine_id!r} has no move pending; nothing to abort")


def query_reply(view: DaemonView, req: QueryRequest) -> Reply:
    return ok(Reason.QUERIED, "expert layout state", **view.state_wire(include_map=req.include_map))


def _plugin_incomplete(gap: str, version: int) -> Reply:
    """An engine with the layout plugin, but not all of it: sglang did not apply some of its hooks."""
    if gap == STARTUP_HOOK_MISSING:
        what = (
            "this engine has the expert-layout plugin but its startup hook never ran (sglang did not apply "
            "it), so it did not attach and does not know the daemons' layout"
        )
    else:
        what = (
            "this engine attached to the daemon (it has the expert-layout plugin) but sends no expert layout "
            "with fetch_state (sglang did not apply the plugin's fetch hooks), so the daemon cannot check "
            "the layout it would route with"
        )
    return layout_refused(
        Reason.PLUGIN_INCOMPLETE,
        f"fetch_state refused: {what}. The plugin is only partly installed: the engine's log names the hook "
        f"sglang failed to apply ('Failed to apply hooks to ...'); run an sglang version the plugin was tested "
        f"with. Nothing changed on the daemon (layout version {version}).",
        version=version,
        gap=gap,
    )


def fetch_reply(view: DaemonView, claim: FetchLayoutField | None, gap: str | None = None) -> Reply:
    """The layout check of ``fetch_state``: serve only an engine that will route correctly.

    ``ok`` replies with reason ``served_non_following`` or ``served_older_engine`` set the
    sticky non-following flag (see ``DaemonMachine.fetch_check``). ``gap``: the engine's layout
    plugin is only partly installed (``layout_sm.messages.PLUGIN_GAPS``), outside the spec's model.
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
    if gap is not None:
        return _plugin_incomplete(gap, record.version)
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
    if move is not None and view.moved_by(engine_id, session):
        info = DirtyInfo(move.engine_id, move.layers, move.base_version)
        return DetachEffect(True, info, f"daemon is now DIRTY: {info.describe()}; {RESTART_DAEMONS}")
    return DetachEffect(True, None, f"engine {engine_id!r} detached")


# -- the machine -------------------------------------------------------------------------

LOADING = "loading"
BEGIN_OK = "attached and layers_valid and not non_following_seen and base_version_current and alone"
COMMIT_OK = "attached and mover and same_layers and rows_fit"


class MachineDisagrees(RuntimeError):
    """The transition taken and the reply made disagree: a defect in this module, never bad input."""


class DaemonState:
    """python-statemachine's model of a ``DaemonMachine``: the daemon's view, the one place its
    state is kept. The phase is not stored: python-statemachine reads it from the view (the
    machine's ``state_field``) and, after a transition, writes the target phase back, which must
    then be the view's phase (the transition's action made it so)."""

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: DaemonView | None = None  # None while the daemon loads its weights

    @property
    def phase(self) -> str:
        return LOADING if self.view is None else self.view.phase

    @phase.setter
    def phase(self, target: str) -> None:
        if target != self.phase:
            raise MachineDisagrees(f"the transition went to {target!r}, but the action left the daemon {self.phase!r}")


def _answered(*phases: State, on: str, cond: str | None = None) -> Any:
    """The request is answered in each of ``phases`` without a phase change (``on`` makes the reply)."""
    transitions = phases[0].to.itself(internal=True, on=on, cond=cond)
    for phase in phases[1:]:
        transitions |= phase.to.itself(internal=True, on=on, cond=cond)
    return transitions


def _agree(event: str, accepted: bool, reply_accepts: bool, reply: object) -> None:
    if accepted != reply_accepts:
        taken = "accepted" if accepted else "refused"
        raise MachineDisagrees(f"{event}: the machine's guards {taken} it, but the reply is {reply}")


class DaemonMachine(StateMachine):
    """The daemon's layout record as a state machine; the events that may change it are named
    after the spec's daemon actions (Begin, Commit, Abort, Detach).

    The transitions declare what each event may do in each phase. An event without a
    transition from the current phase raises ``TransitionNotAllowed``: any request before the
    weights are loaded, a second ``loaded_*``. A request that docs/protocol.md §4 answers with a
    refusal in some phase takes a declared self-loop there, whose action makes the refusal.

    Guards are the spec's conjuncts, asked of the view (``DaemonView.holds``, ``alone``, ...)
    and of the request. Actions change the view, and make the reply with the reply functions
    (the one place where reply texts are made); a reply that disagrees with the transition taken
    raises ``MachineDisagrees``.

    Attach, query and the fetch check never change the phase, so they are answered by their pure
    reply functions without an event: an event costs 0.3-0.6 ms in python-statemachine here
    (measured on a loaded 2-core machine, a begin refused or accepted), the whole ``fetch_check``
    5 µs, and it must stay a small part of sglang's own ``fetch_state`` handler.
    """

    # A daemon loads its weights, then keeps a record (--enable-eplb) or none for its whole life.
    loading = State(LOADING, initial=True)
    no_record = State(NO_RECORD)
    clean = State(CLEAN)
    pending = State(PENDING)
    dirty = State(DIRTY)

    loaded_with_record = loading.to(clean, cond="has_record", on="load")
    loaded_without_record = loading.to(no_record, unless="has_record", on="load")

    # Begin: only a clean daemon takes a move, when every conjunct of the spec's BeginReply "ok"
    # holds (the phase is the rest: a record, not dirty, no move pending). Otherwise refused or
    # busy, by the precedence of docs/protocol.md §4, in every phase.
    begin = clean.to(pending, cond=BEGIN_OK, on="take_move") | _answered(
        clean, pending, no_record, dirty, on="refuse_begin"
    )
    # Commit (the spec's CommitOk, and rows of the record's shape); refused otherwise, and a
    # pending move stays pending.
    commit = pending.to(clean, cond=COMMIT_OK, on="store_rows") | _answered(
        pending, clean, dirty, no_record, on="refuse_commit"
    )
    # Abort: the mover's own session clears its move; the owner with nothing pending is told so
    # (abort is idempotent), anyone else is refused.
    abort = pending.to(clean, cond="attached and mover", on="drop_move") | _answered(
        pending, clean, dirty, no_record, on="refuse_abort"
    )
    # Detach (the EOF of an attach connection): a mover that leaves makes the daemon dirty, any
    # other live attachment is dropped, and the EOF of a stale session changes nothing.
    detach = (
        pending.to(dirty, cond="attached and mover", on="mark_dirty")
        | _answered(pending, clean, dirty, no_record, cond="attached", on="drop_attachment")
        | _answered(pending, clean, dirty, no_record, on="ignore_stale_detach")
    )

    def __init__(self, record: LayoutRecord | None) -> None:
        self._built: tuple[CommitRequest, LayoutRecord | None, LayoutRecord | None] | None = None
        super().__init__(model=DaemonState(), state_field="phase")
        self.send("loaded_with_record" if record is not None else "loaded_without_record", record=record)

    # -- guards: the spec's conjuncts, asked of the view and the request -----------------

    def has_record(self, record: LayoutRecord | None) -> bool:
        return record is not None

    def attached(self, engine_id: str, session: str) -> bool:
        return self._view.holds(engine_id, session)

    def mover(self, engine_id: str, session: str) -> bool:
        return self._view.moved_by(engine_id, session)

    def alone(self, engine_id: str) -> bool:
        return self._view.alone(engine_id)

    def base_version_current(self, request: BeginRequest) -> bool:
        return self._view.base_is_current(request.base_version)

    def non_following_seen(self) -> bool:
        return self._view.non_following_seen

    def layers_valid(self, request: BeginRequest) -> bool:
        return _invalid_layers(request.layers, self._view.record) is None

    def same_layers(self, request: CommitRequest) -> bool:
        return self._view.pending_layers_are(request.layers)

    def rows_fit(self, request: CommitRequest) -> bool:
        return self._successor(request) is not None

    def _successor(self, request: CommitRequest) -> LayoutRecord | None:
        """The record after ``request``'s rows, or None for rows that do not fit. Built once per
        request: the ``rows_fit`` guard and the ``store_rows`` action both need it, and checking a
        full DeepSeek-scale map twice would cost a millisecond more per commit."""
        record = self._view.record
        memo = self._built
        if memo is not None and memo[0] is request and memo[1] is record:
            return memo[2]
        built = None
        if record is not None:
            with contextlib.suppress(LayoutError):  # rows that do not fit: refused by commit_decision
                built = record.with_rows(request.layers, request.rows)
        self._built = (request, record, built)
        return built

    # -- actions: the transition taken changes the view and makes the reply ---------------

    def load(self, record: LayoutRecord | None) -> None:
        self.model.view = DaemonView(record)

    def take_move(self, request: BeginRequest) -> Reply:
        reply = begin_reply(self._view, request)
        _agree("begin", True, reply.ok, reply)
        move = Move(request.engine_id, request.session, request.layers, request.base_version)
        self._view = replace(self._view, pending=move)
        return reply

    def refuse_begin(self, request: BeginRequest) -> Reply:
        reply = begin_reply(self._view, request)
        _agree("begin", False, reply.ok, reply)
        return reply

    def store_rows(self, request: CommitRequest) -> Reply:
        reply, record = commit_decision(self._view, request, self._successor(request))
        self._built = None
        _agree("commit", True, record is not None, reply)
        self._view = replace(self._view, record=record, pending=None)
        return reply

    def refuse_commit(self, request: CommitRequest) -> Reply:
        self._built = None  # keeps no refused request's rows alive
        reply, record = commit_decision(self._view, request)
        _agree("commit", False, record is not None, reply)
        return reply

    def drop_move(self, request: AbortRequest) -> Reply:
        reply = abort_reply(self._view, request)
        _agree("abort", True, reply.reason is Reason.ABORTED, reply)
        self._view = replace(self._view, pending=None)
        return reply

    def refuse_abort(self, request: AbortRequest) -> Reply:
        reply = abort_reply(self._view, request)  # refused, or ok(nothing_to_abort) for the owner
        _agree("abort", False, reply.reason is Reason.ABORTED, reply)
        return reply

    def mark_dirty(self, engine_id: str, session: str) -> DetachEffect:
        effect = detach_effect(self._view, engine_id, session)
        _agree("detach", True, effect.dirty is not None, effect)
        self._view = replace(self._view, attachments=self._without(engine_id), pending=None, dirty=effect.dirty)
        return effect

    def drop_attachment(self, engine_id: str, session: str) -> DetachEffect:
        effect = detach_effect(self._view, engine_id, session)
        _agree("detach", False, effect.dirty is not None or not effect.dropped, effect)
        self._view = replace(self._view, attachments=self._without(engine_id))
        return effect

    def ignore_stale_detach(self, engine_id: str, session: str) -> DetachEffect:
        effect = detach_effect(self._view, engine_id, session)
        _agree("detach", False, effect.dropped, effect)
        return effect

    def _without(self, engine_id: str) -> dict[str, str]:
        return {e: s for e, s in self._view.attachments.items() if e != engine_id}

    # -- reading and loading ------------------------------------------------------------

    @property
    def _view(self) -> DaemonView:
        view = self.model.view
        assert view is not None, "the daemon's weights are not loaded yet"
        return view

    @_view.setter
    def _view(self, view: DaemonView) -> None:
        self.model.view = view

    def view(self) -> DaemonView:
        return self._view

    def restore(self, view: DaemonView) -> None:
        """Put the machine in ``view``'s state (the explorer reuses one machine per daemon)."""
        self.model.view = view

    @property
    def phase(self) -> str:
        return self.model.phase

    # -- requests -----------------------------------------------------------------------

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
        """Off the event loop: an attach never changes the phase (the spec's Attach leaves dphase)."""
        reply = attach_reply(self._view, request, session)
        if reply.ok:
            self._view = replace(self._view, attachments={**self._view.attachments, request.engine_id: session})
        return reply

    def begin_move(self, request: BeginRequest) -> Reply:
        return cast(Reply, self.send("begin", request=request, engine_id=request.engine_id, session=request.session))

    def commit_move(self, request: CommitRequest) -> Reply:
        return cast(Reply, self.send("commit", request=request, engine_id=request.engine_id, session=request.session))

    def abort_move(self, request: AbortRequest) -> Reply:
        return cast(Reply, self.send("abort", request=request, engine_id=request.engine_id, session=request.session))

    def detach_engine(self, engine_id: str, session: str) -> DetachEffect:
        """The attach connection of ``engine_id`` reached EOF (however the engine died)."""
        return cast(DetachEffect, self.send("detach", engine_id=engine_id, session=session))

    def fetch_check(self, claim: FetchLayoutField | None, gap: str | None = None) -> Reply:
        """The layout check of sglang's ``fetch_state``; sets the sticky non-following flag.

        Off the event loop: it never changes the phase (the spec's Fetch leaves dphase)."""
        reply = fetch_reply(self._view, claim, gap)
        if reply.reason in (Reason.SERVED_NON_FOLLOWING, Reason.SERVED_OLDER_ENGINE):
            self._view = replace(self._view, non_following_seen=True)
        return reply

    def query_state(self, include_map: bool = False) -> Reply:
        return self.handle(QueryRequest(include_map))
