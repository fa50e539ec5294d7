"""Reply values: a status, a reason code and a message a person can act on.

Every reply of the protocol is a ``Reply``. The status says what the requester may do:
``ok`` (done), ``busy`` (transient: the same request can succeed later), ``refused``
(permanent for this daemon lifetime or this request), ``layout_refused`` (sglang's
``fetch_state`` refused for the layout). The reason code is for programs, the message for
operators: which engine, which layers, which versions, whether a retry helps, what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

# The operator's remedy for a daemon whose layout is unknown or can no longer be moved, in every
# message that calls for it (daemon replies and engine startup or rebalance failures alike).
RESTART_DAEMONS = "restart the weight cache daemons (the engines reload the weights from disk)"
# A dirty daemon's remedies: the repair, which reloads only the torn move's layers (docs/protocol.md §4),
# or the restart.
REPAIR_OR_RESTART = f"run `expert-layout repair --socket <daemon socket>`, or {RESTART_DAEMONS}"


def standby_lost_its_daemon(rank: int | None, socket: str | None) -> str:
    """What a parked warm standby says when its daemon goes away: it maps that daemon's memory, so it
    cannot take over, and sglang's daemon watchdog ends it; the way back."""
    return (
        f"rank {rank}: the weight cache daemon at {socket} went away (its attach connection closed): this warm "
        "standby maps that daemon's memory and cannot take over; sglang's daemon watchdog ends it. Start that "
        "daemon again (alone, --expert-layout-start-alone, where the other daemons of the set run; on GPUs, the "
        "whole set), then start the primary if it is gone, and a new warm standby"
    )


def repair_failed(why: str | None) -> str:
    """A failed repair's cause (the daemon's one record of it, ``DaemonView.repair_failed``), as every
    refusal of a dirty daemon quotes it after the torn move: the daemon's own refusals and the engine's
    startup refusal alike. Empty when no repair failed."""
    return "" if not why else f"; its repair failed: {why}"


class Status(StrEnum):
    OK = "ok"
    BUSY = "busy"
    REFUSED = "refused"
    LAYOUT_REFUSED = "layout_refused"


class Reason(StrEnum):
    # ok
    ATTACHED = "attached"
    QUERIED = "queried"
    BEGUN = "begun"
    COMMITTED = "committed"
    ABORTED = "aborted"
    NOTHING_TO_ABORT = "nothing_to_abort"
    SERVED_FOLLOWING = "served_following"
    SERVED_NON_FOLLOWING = "served_non_following"
    SERVED_OLDER_ENGINE = "served_older_engine"
    SERVED_NO_RECORD = "served_no_record"
    REPAIRED = "repaired"
    REPAIR_BEGUN = "repair_begun"
    PARKED = "parked"  # a warm standby's attachment is parked (docs/protocol.md §10)
    PROMOTED = "promoted"  # a parked standby's claim of the primary role was granted
    REJOIN_BEGUN = "rejoin_begun"  # a daemon started again from disk reloads at the others' record
    # refused: the request itself
    MALFORMED = "malformed"
    NOT_ATTACHED = "not_attached"
    ENGINE_ID_IN_USE = "engine_id_in_use"
    INVALID_LAYERS = "invalid_layers"
    OWN_MOVE_PENDING = "own_move_pending"
    NO_PENDING_MOVE = "no_pending_move"
    LAYERS_MISMATCH = "layers_mismatch"
    BAD_ROWS = "bad_rows"
    # refused: the daemon's state, permanent until it restarts
    NO_RECORD = "no_record"
    DIRTY = "dirty"
    NON_FOLLOWING_SEEN = "non_following_seen"
    STALE_BASE_VERSION = "stale_base_version"
    REPAIRING = "repairing"  # until the repair ends (seconds): retry then
    # refused: a repair
    NOT_DIRTY = "not_dirty"
    REPAIR_UNSAFE = "repair_unsafe"
    REPAIR_UNSUPPORTED = "repair_unsupported"
    REPAIR_FAILED = "repair_failed"
    # refused: a warm standby's request
    NOT_PARKED = "not_parked"
    # refused: a rejoin
    NOT_BEHIND = "not_behind"
    # busy: transient
    MOVE_PENDING = "move_pending"
    OTHER_ENGINE_ATTACHED = "other_engine_attached"
    TOO_MANY_ATTACHMENTS = "too_many_attachments"
    OVERLOADED = "overloaded"
    REPAIR_RUNNING = "repair_running"
    PRIMARY_ATTACHED = "primary_attached"  # a claim while an unparked engine is attached: stay parked
    # layout_refused (fetch_state)
    DIGEST_MISMATCH = "digest_mismatch"
    OLDER_ENGINE_AFTER_MOVE = "older_engine_after_move"
    PLUGIN_INCOMPLETE = "plugin_incomplete"
    # the engine's own decisions (docs/protocol.md §5, §6): why it adopts, keeps, fails, or how
    # it rebalances (``NO_RECORD``, ``DIRTY``, ``NOT_ATTACHED`` and ``COMMITTED`` above serve here too)
    ADOPT = "adopt"
    INITIAL_LAYOUT = "initial"
    MIXED_INITIAL = "mixed_initial"
    UNREADABLE = "unreadable"
    WAIT_TIMEOUT = "wait_timeout"
    MIXED_AFTER_MOVE = "mixed_after_move"
    DISAGREE = "disagree"
    REJOIN = "rejoin"
    REJOIN_REFUSED = "rejoin_refused"
    SHAPE_MISMATCH = "shape_mismatch"
    NOT_ROUTING_BY_METADATA = "not_routing_by_metadata"
    LOCAL = "local"
    SHARED = "shared"
    MIXED_SOURCES = "mixed_sources"
    ELASTIC_EP = "elastic_ep"
    UNKNOWN_SOURCE = "unknown_source"
    BEGIN_BUSY = "busy"
    BEGIN_REFUSED = "refused"
    COMMIT_UNVERIFIED = "commit_unverified"


@dataclass(frozen=True)
class Reply:
    """One reply of the protocol; ``to_wire`` gives the dict sent through ``send_msg``."""

    status: Status
    reason: Reason
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def retry_can_help(self) -> bool:
        return self.status is Status.BUSY

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = dict(self.data)
        wire.update(status=self.status.value, reason=self.reason.value, message=self.message)
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> Reply:
        """Read a reply dict; raise ValueError naming what is wrong with it."""
        if not isinstance(wire, Mapping):
            raise ValueError(f"reply: expected a dict, got {type(wire).__name__}")
        status = _member(_STATUS_OF, wire.get("status"))
        if status is None:
            raise ValueError(f"reply.status: {wire.get('status')!r} is not a layout-protocol status")
        reason = _member(_REASON_OF, wire.get("reason"))
        if reason is None:
            raise ValueError(f"reply.reason: {wire.get('reason')!r} is not a known reason code")
        message = wire.get("message")
        if not isinstance(message, str):
            raise ValueError("reply.message: missing or not a string")
        data = {k: v for k, v in wire.items() if k not in ("status", "reason", "message")}
        return cls(status, reason, message, data)

    def __str__(self) -> str:
        return f"{self.status.value}({self.reason.value}): {self.message}"


# The members by value, as ``Status(value)`` finds them (without the enum's machinery, twice a reply).
_STATUS_OF: dict[object, Status] = {s.value: s for s in Status}
_REASON_OF: dict[object, Reason] = {r.value: r for r in Reason}


def _member(members: dict[object, Any], value: object) -> Any:
    try:
        return members.get(value)
    except TypeError:  # unhashable: no member's value
        return None


def ok(reason: Reason, message: str, **data: Any) -> Reply:
    return Reply(Status.OK, reason, message, data)


def busy(reason: Reason, message: str, **data: Any) -> Reply:
    return Reply(Status.BUSY, reason, message, data)


def refused(reason: Reason, message: str, **data: Any) -> Reply:
    return Reply(Status.REFUSED, reason, message, data)


def layout_refused(reason: Reason, message: str, **data: Any) -> Reply:
    return Reply(Status.LAYOUT_REFUSED, reason, message, data)
