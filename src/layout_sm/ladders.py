"""The daemon's requests, each declared once as a ``Ladder`` (docs/protocol.md §4).

Each ladder lists a request's conjuncts in the precedence of docs/protocol.md §4, with the reply
the daemon gives when that conjunct is the first to fail, and the outcome when all of them hold.
``LADDERS`` names them by the daemon machine's events (``layout_sm.daemon``), whose accepting
transitions are guarded by the same conjuncts; the machine's actions look a ladder up there when
they run, so a ladder replaced there (a mutant) is what runs. The words of the replies are
``layout_sm.replies``'s.
"""

from __future__ import annotations

from typing import Any

from layout_sm.daemon_view import (
    Attach,
    DaemonView,
    Detach,
    DetachEffect,
    DirtyInfo,
    Fetch,
    Move,
    RepairDone,
    RepairFailed,
    rejoin_target,
)
from layout_sm.messages import BeginRequest, ClaimRequest, CommitRequest, ParkRequest, QueryRequest, RejoinRequest
from layout_sm.reasons import REPAIR_OR_RESTART, Reason, Reply, busy, ok, refused
from layout_sm.replies import (
    Ladder,
    Outcome,
    Say,
    fetch_refused,
    move_stays_pending,
    not_retryable,
    rung,
    served_turning_off,
    successor,
    the_move,
    the_record,
    the_torn_move,
)


def _without(view: DaemonView, engine_id: str) -> dict[str, str]:
    return {e: s for e, s in view.attachments.items() if e != engine_id}


def _detach(view: DaemonView, engine_id: str) -> DaemonView:
    """The view without ``engine_id``'s attachment, parked or not."""
    return view.evolve(attachments=_without(view, engine_id), parked=view.parked - {engine_id})


# Refusals that more than one ladder gives.
_NOT_ATTACHED = Say(
    refused,
    Reason.NOT_ATTACHED,
    "engine {req.engine_id!r} holds no live attachment with this session; {request} refused.",
)
_STANDBY_NOT_ATTACHED = Say(
    refused,
    Reason.NOT_ATTACHED,
    "{request} by {req.engine_id!r}: no live attachment with this session; only an attached standby {request}s "
    "(attach first).",
)
_DIRTY = Say(refused, Reason.DIRTY, "{layout_unknown}.")


# -- attach ------------------------------------------------------------------------------------


def _attached(view: DaemonView, req: Attach) -> Reply:
    """What the engine must know: the record (with its map, unless the engine holds a map of that
    digest already), any move pending, any dirty state."""
    state = view.state_wire(include_map=False)
    record = view.record
    return ok(
        Reason.ATTACHED,
        f"engine {req.engine_id!r} attached",
        session=req.session,
        record=None if record is None else record.to_wire(include_map=record.digest != req.known_digest),
        pending=state["pending"],
        dirty=state["dirty"],
        repair_failed=state["repair_failed"],  # quoted by the engine's startup refusal of a dirty daemon
        repairing=state["repairing"],
        phase=state["phase"],
        non_following_seen=view.non_following_seen,
    )


# An attach succeeds for a fresh engine id while fewer than MAX_ATTACHMENTS are attached.
ATTACH = Ladder(
    (
        rung(
            "engine_id_free",
            Say(
                refused,
                Reason.ENGINE_ID_IN_USE,
                "engine id {req.engine_id!r} is already attached to this daemon; each engine instance needs its "
                "own id (a restarted engine picks a new one).",
            ),
        ),
        rung(
            "has_room",
            Say(
                busy,
                Reason.TOO_MANY_ATTACHMENTS,
                "engine {req.engine_id!r} not attached: {attachments} engines are attached to this daemon, its "
                "limit of {limit}. Retry after some stop (an attachment ends when its engine process exits); "
                "`expert-layout status` lists the attached engine ids.",
                limit="limit",
            ),
        ),
    ),
    Outcome(_attached, lambda view, req: view.evolve(attachments={**view.attachments, req.engine_id: req.session})),
)


# -- fetch_state ---------------------------------------------------------------------------------


def _flag_non_following(view: DaemonView, req: Fetch) -> DaemonView:
    """Serving an engine that will not follow moves turns rebalancing off (the sticky flag)."""
    return view.evolve(non_following_seen=True)


# The layout check of fetch_state (spec: Fetch, FetchServes, FetchNonFollowing): serve only an
# engine that will route correctly; a daemon without a record serves as sglang does.
FETCH = Ladder(
    (
        rung("has_record", Say(ok, Reason.SERVED_NO_RECORD, "daemon keeps no layout record; served as sglang does")),
        rung("not is_dirty", Say(fetch_refused, Reason.DIRTY, "{layout_unknown}.")),
        rung("not is_repairing", Say(fetch_refused, Reason.REPAIRING, "{being_repaired}.")),
        rung(
            "not move_pending",
            Say(
                fetch_refused,
                Reason.MOVE_PENDING,
                "engine {move.engine_id!r} is moving layers {moving} right now, so the weights are mid-move; "
                "retry after it ends.",
                pending="pending",
            ),
        ),
        rung(
            "plugin_complete",  # sglang did not apply some of the engine's layout plugin's hooks
            Say(
                fetch_refused,
                Reason.PLUGIN_INCOMPLETE,
                "{missing}. The plugin is only partly installed: the engine's log names the hook sglang failed to "
                "apply ('Failed to apply hooks to ...'); run an sglang version the plugin was tested with. Nothing "
                "changed on the daemon (layout version {version}).",
                version="version",
                gap="req.gap",
            ),
        ),
        rung(
            "claims_or_initial",
            Say(
                fetch_refused,
                Reason.OLDER_ENGINE_AFTER_MOVE,
                "experts have moved (layout version {version}) and this engine does not send its expert layout, "
                "so it would route tokens to the wrong experts. Install the expert-layout plugin in the engine, "
                "or {restart}.",
                version="version",
            ),
        ),
        rung(
            "claims",
            Say(
                served_turning_off,
                Reason.SERVED_OLDER_ENGINE,
                "served an engine without the layout plugin at the initial layout (version 0); ",
            ),
            _flag_non_following,
        ),
        rung(
            "digest_is_current",
            Say(
                fetch_refused,
                Reason.DIGEST_MISMATCH,
                "the engine routes with layout version {req.claim.version} but the daemon's weights are at version "
                "{version} (digests differ); the engine must start from the daemon's record (its layout plugin "
                "does this at startup), or {restart}.",
                version="version",
                digest="digest",
            ),
        ),
        rung(
            "holds",
            Say(
                served_turning_off,
                Reason.SERVED_NON_FOLLOWING,
                "served engine {req.engine_id!r} at version {version} without a live attachment; it will not "
                "follow moves, so ",
            ),
            _flag_non_following,
        ),
    ),
    Outcome(Say(ok, Reason.SERVED_FOLLOWING, "served engine {req.engine_id!r} at version {version}")),
)


# -- begin -------------------------------------------------------------------------------------


def _take_move(view: DaemonView, req: BeginRequest) -> DaemonView:
    return view.evolve(pending=Move(req.engine_id, req.session, req.layers, req.base_version))


# The begin precedence of docs/protocol.md §4 (spec: BeginReply): the request itself, then the
# daemon's state (both permanent: refused), then someone else is here (transient: busy).
BEGIN = Ladder(
    (
        rung(
            "holds",
            Say(
                not_retryable,
                Reason.NOT_ATTACHED,
                "engine {req.engine_id!r} holds no live attachment with this session on this daemon; only the "
                "attached engine that owns the session may move experts",
            ),
        ),
        rung("layers_valid", Say(not_retryable, Reason.INVALID_LAYERS, "invalid layer list: {invalid_layers}")),
        rung(
            "not own_move_pending",
            Say(
                not_retryable,
                Reason.OWN_MOVE_PENDING,
                "engine {req.engine_id!r} already has a move of layers {moving} pending; commit or abort it first",
            ),
        ),
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb, or an older daemon), "
                "so shared weights cannot be rebalanced; start the daemons with --enable-eplb.",
            ),
        ),
        rung("not is_dirty", _DIRTY),
        rung("not is_repairing", Say(refused, Reason.REPAIRING, "begin refused: {being_repaired}.")),
        rung(
            "not saw_non_following",
            Say(
                refused,
                Reason.NON_FOLLOWING_SEEN,
                "an engine that does not follow layout moves (an older engine, or one without a live attachment) "
                "maps these weights; moving experts would corrupt its outputs. Rebalancing of shared weights "
                "stays off until the daemons restart; to rebalance, {restart}.",
            ),
        ),
        rung(
            "base_is_current",
            Say(
                not_retryable,
                Reason.STALE_BASE_VERSION,
                "begin names base version {req.base_version} but the daemon is at version {version}; this "
                "engine's layout is not the daemon's",
                version="version",
            ),
        ),
        rung(
            "not foreign_pending",
            Say(
                busy,
                Reason.MOVE_PENDING,
                "engine {move.engine_id!r} is moving layers {moving}; retry later.",
                pending="pending",
            ),
        ),
        rung(
            "alone",
            Say(
                busy,
                Reason.OTHER_ENGINE_ATTACHED,
                "engines {others} also map these weights; experts move only while one engine is alone on its "
                "daemons. Rebalancing resumes when they detach.",
                attached="others",
            ),
        ),
    ),
    Outcome(
        Say(
            ok,
            Reason.BEGUN,
            "move of layers {layers} by {req.engine_id!r} pending from version {version}",
            version="version",
        ),
        _take_move,
    ),
)


# -- commit ------------------------------------------------------------------------------------


def _store_rows(view: DaemonView, req: CommitRequest) -> DaemonView:
    return view.evolve(record=successor(view, req), pending=None)


# Commit (spec: CommitOk) needs this session's pending move, the same layers, and rows of the
# record's shape; anything else is refused and the move stays pending.
COMMIT = Ladder(
    (
        rung("holds", _NOT_ATTACHED),
        rung("not is_dirty", _DIRTY),
        rung(
            "moved_by",
            Say(
                refused,
                Reason.NO_PENDING_MOVE,
                "engine {req.engine_id!r} has no move pending on this daemon; begin comes before commit.",
            ),
        ),
        rung(
            "pending_layers_are",
            Say(
                move_stays_pending,
                Reason.LAYERS_MISMATCH,
                "commit names layers {layers} but the pending move is of layers {moving}",
            ),
        ),
        rung("rows_fit", Say(move_stays_pending, Reason.BAD_ROWS, "commit rows rejected: {rows_error}")),
    ),
    Outcome(
        Say(
            ok,
            Reason.COMMITTED,
            "layers {layers} committed by {req.engine_id!r}: version {successor.version}",
            version="successor.version",
            digest="successor.digest",
        ),
        _store_rows,
    ),
)


# -- abort -------------------------------------------------------------------------------------


# Abort (spec: Abort) clears this session's move; it is idempotent for the session's owner and
# refused for anyone else.
ABORT = Ladder(
    (
        rung("holds", _NOT_ATTACHED),
        rung(
            "moved_by",
            Say(ok, Reason.NOTHING_TO_ABORT, "engine {req.engine_id!r} has no move pending; nothing to abort"),
        ),
    ),
    Outcome(
        Say(ok, Reason.ABORTED, "move of layers {moving} by {req.engine_id!r} aborted"),
        lambda view, req: view.evolve(pending=None),
    ),
)


# -- detach ------------------------------------------------------------------------------------


def _stale_detach(view: DaemonView, req: Detach) -> DetachEffect:
    return DetachEffect(False, None, f"stale detach of {req.engine_id!r} ignored (session not live)")


def _detached(view: DaemonView, req: Detach) -> DetachEffect:
    return DetachEffect(True, None, f"engine {req.engine_id!r} detached", view.notified(req.engine_id))


def _dirty_info(view: DaemonView) -> DirtyInfo:
    move = the_move(view)
    return DirtyInfo(move.engine_id, move.layers, move.base_version)


def _went_dirty(view: DaemonView, req: Detach) -> DetachEffect:
    info = _dirty_info(view)
    return DetachEffect(
        True, info, f"daemon is now DIRTY: {info.describe()}; {REPAIR_OR_RESTART}", view.notified(req.engine_id)
    )


def _mark_dirty(view: DaemonView, req: Detach) -> DaemonView:
    return _detach(view, req.engine_id).evolve(pending=None, dirty=_dirty_info(view))


def _went_repairing(view: DaemonView, req: Detach) -> DetachEffect:
    info = _dirty_info(view)
    return DetachEffect(
        True,
        info,
        f"daemon is now REPAIRING: {info.describe()}; it reloads layers {list(info.layers)} from the checkpoint, "
        f"back to version {info.base_version}",
        _mark_repairing(view, req).notified(),
    )


def _mark_repairing(view: DaemonView, req: Detach) -> DaemonView:
    return _mark_dirty(view, req).evolve(repairing=True, repair_failed=None)


# Detach (spec: Detach), the EOF of an attach connection: a mover that leaves makes the daemon
# dirty, or with auto repair starts the repair at once (repairing); any other live attachment is
# dropped, and the EOF of a stale session changes nothing.
DETACH = Ladder(
    (
        rung("holds", _stale_detach),
        rung("moved_by", _detached, lambda view, req: _detach(view, req.engine_id)),
    ),
    Outcome(_went_dirty, _mark_dirty),
    branches=(rung("repairs_automatically", _went_repairing, _mark_repairing),),
)


# -- repair(spec: RepairAgain, RepairDone, RepairFails) -------------------------------


# The operator's `expert-layout repair` (spec: RepairAgain): a dirty daemon repairs again.
# Its refusals of a daemon with nothing to repair are also the repair plan's (``layout_sm.repair``).
NO_RECORD_TO_REPAIR = Say(
    refused,
    Reason.NO_RECORD,
    "this daemon keeps no expert-layout record (started without --enable-eplb), so it never moves "
    "experts and has nothing to repair.",
)
NOTHING_TO_REPAIR = Say(
    refused,
    Reason.NOT_DIRTY,
    "the daemon is {view.phase} at version {version}: its memory is its record, nothing to repair.",
    version="version",
)
REPAIR = Ladder(
    (
        rung("has_record", NO_RECORD_TO_REPAIR),
        rung(
            "not is_repairing",
            Say(
                busy,
                Reason.REPAIR_RUNNING,
                "a repair of layers {torn_layers} is already under way; wait for it to end (`expert-layout "
                "status` shows it).",
            ),
        ),
        rung("is_dirty", NOTHING_TO_REPAIR),
    ),
    Outcome(
        Say(
            ok,
            Reason.REPAIR_BEGUN,
            "repairing layers {torn_layers} back to version {torn.base_version}",
            layers="torn_layers",
            base_version="torn.base_version",
        ),
        lambda view, req: view.evolve(repairing=True, repair_failed=None),
    ),
)
_NO_REPAIR_RUNNING = Say(
    refused, Reason.NOT_DIRTY, "no repair of this daemon is under way (it is {view.phase}); nothing changed."
)


def _repaired_view(view: DaemonView, req: RepairDone) -> DaemonView:
    return view.evolve(dirty=None, repairing=False, repair_failed=None)


def _repaired(view: DaemonView, req: RepairDone) -> Reply:
    record = the_record(view)
    data = {**req.data, "layers": list(req.layers), "version": record.version, "digest": record.digest}
    return ok(Reason.REPAIRED, req.message, **data, **_notice_data(_repaired_view(view, req).notified()))


# The repair ended well (spec: RepairDone): memory holds the record again, so the daemon is clean
# at the base version (the record never changed while dirty: only a commit changes it).
REPAIR_DONE = Ladder(
    (
        rung("is_repairing", _NO_REPAIR_RUNNING),
        rung(
            "repair_is_of",
            Say(
                refused,
                Reason.REPAIR_UNSAFE,
                "the repair reloaded layers {layers} but the torn move is of layers {torn_layers}; the daemon "
                "stays repairing.",
            ),
        ),
    ),
    Outcome(_repaired, _repaired_view),
)


def _repair_failed_view(view: DaemonView, req: RepairFailed) -> DaemonView:
    return view.evolve(repairing=False, repair_failed=req.why)


def _repair_failed(view: DaemonView, req: RepairFailed) -> Reply:
    info = the_torn_move(view)
    return refused(
        req.reason,
        f"repair of layers {list(info.layers)} failed: {req.why}. The daemon stays dirty; {REPAIR_OR_RESTART}.",
        **_notice_data(_repair_failed_view(view, req).notified()),
    )


# The repair failed (spec: RepairFails): dirty, with the reason kept for every refusal.
REPAIR_FAILED = Ladder(
    (rung("is_repairing", _NO_REPAIR_RUNNING),),
    Outcome(_repair_failed, _repair_failed_view),
)


# -- warm standbys (spec: Park, Claim) ---------------------------------------------------


def _notice_data(notified: tuple[str, ...]) -> dict[str, Any]:
    return {"notified": list(notified)}


def _parked(view: DaemonView, req: ParkRequest) -> Reply:
    # The view after the park: the parker is parked, so it is among the notified when no unparked engine is left.
    after = view.evolve(parked=view.parked | {req.engine_id})
    notified = after.notified()
    if notified:
        primary = "no unparked engine is attached: claim the primary role"
    elif after.is_repairing():
        primary = "the daemon repairs a torn move; the repair's end tells the parked standbys"
    else:
        primary = "a primary is attached"
    return ok(Reason.PARKED, f"{req.engine_id!r} parked; {primary}", **_notice_data(notified))


# Park (spec: Park): an attached standby's attachment becomes parked (again: no change); the reply
# names the parked standbys the daemon notifies now, the parker included, when no unparked engine is left.
PARK = Ladder(
    (rung("holds", _STANDBY_NOT_ATTACHED),),
    Outcome(_parked, lambda view, req: view.evolve(parked=view.parked | {req.engine_id})),
)


def _promoted(view: DaemonView, req: ClaimRequest) -> Reply:
    record = the_record(view)
    return ok(
        Reason.PROMOTED,
        f"{req.engine_id!r} is the primary at version {record.version}",
        version=record.version,
        record=record.to_wire(),
    )


# Claim (spec: ClaimReply): granted only to a parked standby, while no unparked engine is attached
# (busy: the role is taken), on a clean daemon (refused: no record, dirty; busy while it repairs); the
# grant unparks the attachment and carries the record.
CLAIM = Ladder(
    (
        rung("holds", _STANDBY_NOT_ATTACHED),
        rung(
            "is_parked",
            Say(
                refused,
                Reason.NOT_PARKED,
                "claim by {req.engine_id!r}: its attachment is not parked; only a parked standby claims the "
                "primary role.",
            ),
        ),
        rung(
            "none_unparked",
            Say(
                busy,
                Reason.PRIMARY_ATTACHED,
                "engines {others} are attached and not parked: the primary role is taken; stay parked (the "
                "daemon tells the parked standbys when they leave).",
                attached="others",
            ),
        ),
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb): a standby cannot "
                "adopt its layout; start the engine as a primary.",
            ),
        ),
        rung("not is_dirty", _DIRTY),
        rung(
            "not is_repairing",  # busy, as a taken role: the standby parks again, the repair's end tells it
            Say(
                busy,
                Reason.REPAIRING,
                "{being_repaired}; stay parked (the daemon tells the parked standbys when the repair ends).",
            ),
        ),
    ),
    Outcome(_promoted, lambda view, req: view.evolve(parked=view.parked - {req.engine_id})),
)


# Each of the machine's request events and its one declaration; the machine's actions look a
# ladder up here when they run, so a ladder replaced here (a mutant) is what runs.
# -- rejoin -------------------------------------------------------------------------------------


def _rejoining(view: DaemonView, req: RejoinRequest) -> DaemonView:
    """The record the others hold, with every layer as the torn move: the repair's reload
    (``layout_sm.repair``) then rewrites every layer's routed experts at its rows."""
    target = rejoin_target(view.record, req.version, req.digest, req.rows)
    assert target is not None, "the ladder's rejoin_fits holds"
    layers = tuple(range(target.num_layers))
    return view.evolve(
        record=target,
        dirty=DirtyInfo(req.engine_id, layers, target.version, rejoin=True),
        repairing=True,
        repair_failed=None,
    )


_NOT_REJOINED = "; the daemon changed nothing (the engine's startup fails with this reason)"
# Restarting the whole set throws away the record the other daemons keep: said where it is not the way back.
_KEEP_THE_RECORD = " (do not restart the other daemons: that throws away the record they keep)"

# A daemon behind the others (started again from disk, or repaired at the version before a commit it did not
# record) rejoins at the newest record (spec: AskRejoin, RejoinAllowed): only while its own record is older,
# and while no other engine is attached or was served.
REJOIN = Ladder(
    (
        rung(
            "holds",
            Say(
                refused,
                Reason.NOT_ATTACHED,
                "the rejoin's session is not a live attachment of this daemon" + _NOT_REJOINED + "; start the "
                "engine again: its startup asks again",
            ),
        ),
        rung(
            "has_record",
            Say(
                refused,
                Reason.NO_RECORD,
                "this daemon keeps no expert-layout record (started without --enable-eplb): nothing to rejoin at"
                + _NOT_REJOINED
                + "; start it again with the servers' --enable-eplb (alone, --expert-layout-start-alone, where its "
                "peers run), then the engine",
            ),
        ),
        rung("not is_dirty", _DIRTY),
        rung(
            "not is_repairing",
            Say(
                refused,
                Reason.REPAIRING,
                "{being_repaired}: it cannot rejoin now" + _NOT_REJOINED + "; start the engine again once the "
                "repair has ended (`expert-layout status` shows it)" + _KEEP_THE_RECORD,
            ),
        ),
        rung(
            "not move_pending",
            Say(
                refused,
                Reason.MOVE_PENDING,
                "a move is pending: it cannot rejoin now" + _NOT_REJOINED + "; start the engine again once the "
                "move has ended" + _KEEP_THE_RECORD,
            ),
        ),
        rung(
            "behind",
            Say(
                refused,
                Reason.NOT_BEHIND,
                "this daemon is at version {view.record.version}, not behind version {req.version}: a rejoin never "
                "rewinds a daemon" + _NOT_REJOINED + "; start the engine again: its startup reads every daemon's "
                "record again and rejoins only the daemons behind the newest one" + _KEEP_THE_RECORD,
            ),
        ),
        rung(
            "only_attached",
            Say(
                refused,
                Reason.OTHER_ENGINE_ATTACHED,
                "engines {other_attachments} are attached too: another engine is starting on these daemons, and a "
                "rejoin rewrites weights it may map" + _NOT_REJOINED + "; start one engine at a time: start this "
                "engine again once that one is up or has stopped (`expert-layout status` lists the attached "
                "engines): it then adopts the record the daemons hold, or rejoins" + _KEEP_THE_RECORD,
                attached="other_attachments",
            ),
        ),
        rung(
            "not saw_non_following",
            Say(
                refused,
                Reason.NON_FOLLOWING_SEEN,
                "an engine without the layout plugin fetched these weights: a rejoin would move experts under "
                "it" + _NOT_REJOINED + "; stop that engine, start this daemon again (alone, "
                "--expert-layout-start-alone, where its peers run), then the engine" + _KEEP_THE_RECORD,
            ),
        ),
        rung(
            "rejoin_fits",
            Say(
                refused,
                Reason.BAD_ROWS,
                "the record to rejoin at (version {req.version}) is not a moved map of this daemon's shape with "
                "digest {req.digest}" + _NOT_REJOINED + "; start the engine with the daemons' model and "
                "--ep-num-redundant-experts",
            ),
        ),
    ),
    Outcome(
        Say(
            ok,
            Reason.REJOIN_BEGUN,
            "rejoining at version {req.version}: reloading the routed experts of every layer at its places",
            version="req.version",
            digest="req.digest",
        ),
        _rejoining,
    ),
)


LADDERS: dict[str, Ladder] = {
    "attach": ATTACH,
    "fetch": FETCH,
    "begin": BEGIN,
    "commit": COMMIT,
    "abort": ABORT,
    "detach": DETACH,
    "repair": REPAIR,
    "repair_done": REPAIR_DONE,
    "repair_failed": REPAIR_FAILED,
    "park": PARK,
    "claim": CLAIM,
    "rejoin": REJOIN,
}


def query_reply(view: DaemonView, req: QueryRequest) -> Reply:
    """A query reads the view and changes nothing (it is no step: no declaration)."""
    return ok(Reason.QUERIED, "expert layout state", **view.state_wire(include_map=req.include_map))
