"""The wire schema: builders and validators for every request of the layout protocol.

Messages are plain dicts (sglang's ``recv_msg`` unpickles with a ``SafeUnpickler`` that
refuses custom classes), so requests are built here as dicts and parsed back into frozen
dataclasses. ``parse_request`` never raises: a malformed message becomes a ``refused``
reply that names the field and the problem, so the daemon answers and keeps serving.

Who answers what (``is_sglang_request``): a dict whose ``type`` is not a layout request goes to
sglang's own handler, unchanged; that includes a dict with a missing or unknown ``type``, which
gets sglang's ``{"status": "error", "message": "Unknown request type: ..."}`` (what an engine of
this protocol reads as an older daemon). Every other request, a non-dict included, is parsed
here and answered by the layout core (``refused(malformed)`` when it is not a valid request).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from layout_sm.reasons import Reason, Reply, busy, layout_refused, refused
from layout_sm.record import MAX_LAYERS, MAX_PHYSICAL, Rows

ATTACH = "expert_layout_attach"
QUERY = "expert_layout_query"
BEGIN = "expert_layout_begin"
COMMIT = "expert_layout_commit"
ABORT = "expert_layout_abort"
# An operator's request (``expert-layout repair``): a dirty daemon reloads the interrupted layers.
REPAIR = "expert_layout_repair"
# A warm standby's requests (docs/protocol.md §10): park its attachment after warmup, claim the primary role.
PARK = "expert_layout_park"
CLAIM = "expert_layout_claim"
# A daemon started again from disk (version 0) reloads its routed experts at the record every other
# daemon holds: an engine's startup asks it (docs/protocol.md §4).
REJOIN = "expert_layout_rejoin"
# The daemon's message on a parked standby's attach connection: no unparked engine is attached any more.
NOTICE = "expert_layout_no_primary"
LAYOUT_REQUEST_TYPES = frozenset({ATTACH, QUERY, BEGIN, COMMIT, ABORT, REPAIR, PARK, CLAIM, REJOIN})
# The optional field of sglang's existing ``fetch_state`` request.
FETCH_FIELD = "expert_layout"
# Another optional field of ``fetch_state``: an engine whose layout plugin is only partly installed
# says what is missing (sglang did not apply the startup hook, so it never attached). The daemon
# also finds ``FETCH_HOOK_MISSING`` itself: a fetch without a claim from the process of an attachment
# whose attach request said that process sends a claim with every fetch_state (``FETCH_CLAIMS_FIELD``,
# which the plugin sets; an attach without it, an older engine's or a test's, promises nothing).
PLUGIN_GAP_FIELD = "expert_layout_plugin_gap"
STARTUP_HOOK_MISSING = "startup_hook_missing"
FETCH_HOOK_MISSING = "fetch_hook_missing"
PLUGIN_GAPS = frozenset({STARTUP_HOOK_MISSING, FETCH_HOOK_MISSING})
FETCH_CLAIMS_FIELD = "fetch_claims"
# Optional in an attach: the digest of the map the engine already holds. The reply's record then
# carries its map only when the digests differ, the one case where the engine needs it (to adopt); a
# DeepSeek-scale map is most of an attach's cost on both sides. An older daemon ignores the field.
KNOWN_DIGEST_FIELD = "known_digest"

MAX_ENGINE_ID_LEN = 256
MAX_SESSION_LEN = 128
MAX_VERSION = 2**62  # a layout version (a begin's base, a fetch_state's claim)
_SESSION_CHARS = re.compile(r"[0-9A-Za-z_-]+")  # fullmatch: "$" would let a trailing newline through
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class AttachRequest:
    engine_id: str
    # The digest of the map the engine already holds (its initial layout): a record of that digest
    # comes without its map, which the engine does not need (``KNOWN_DIGEST_FIELD``).
    known_digest: str | None = None


@dataclass(frozen=True)
class QueryRequest:
    include_map: bool = False


@dataclass(frozen=True)
class SessionRequest:
    """What every request of an attached engine carries: the engine and its attachment's session token."""

    engine_id: str
    session: str


@dataclass(frozen=True)
class BeginRequest(SessionRequest):
    base_version: int
    layers: tuple[int, ...]


@dataclass(frozen=True)
class CommitRequest(SessionRequest):
    layers: tuple[int, ...]
    rows: Rows


@dataclass(frozen=True)
class AbortRequest(SessionRequest):
    """Drop this engine's pending move (idempotent for its owner)."""


@dataclass(frozen=True)
class RepairRequest:
    """Reload the routed experts of the interrupted move's layers (``layout_sm.repair``)."""


@dataclass(frozen=True)
class ParkRequest(SessionRequest):
    """A warm standby parks its attachment (after its warmup, or again after a claim taken)."""


@dataclass(frozen=True)
class ClaimRequest(SessionRequest):
    """A parked standby claims the primary role on this daemon."""


@dataclass(frozen=True)
class RejoinRequest(SessionRequest):
    """Rejoin at the record every other daemon holds: its version, digest and whole map."""

    version: int
    digest: str
    rows: Rows


@dataclass(frozen=True)
class FetchLayoutField(SessionRequest):
    """What an attached engine claims about the layout it will route with."""

    version: int
    digest: str


LayoutRequest = (
    AttachRequest
    | QueryRequest
    | BeginRequest
    | CommitRequest
    | AbortRequest
    | RepairRequest
    | ParkRequest
    | ClaimRequest
    | RejoinRequest
)


# -- builders (what engines send) --------------------------------------------------------


def attach_request(engine_id: str, known_digest: str | None = None) -> dict[str, Any]:
    if known_digest is None:
        return {"type": ATTACH, "engine_id": engine_id}
    return {"type": ATTACH, "engine_id": engine_id, KNOWN_DIGEST_FIELD: known_digest}


def query_request(include_map: bool = False) -> dict[str, Any]:
    return {"type": QUERY, "include_map": include_map}


def begin_request(engine_id: str, session: str, base_version: int, layers: Sequence[int]) -> dict[str, Any]:
    return {
        "type": BEGIN,
        "engine_id": engine_id,
        "session": session,
        "base_version": base_version,
        "layers": list(layers),
    }


def commit_request(
    engine_id: str, session: str, layers: Sequence[int], rows: Sequence[Sequence[int]]
) -> dict[str, Any]:
    return {
        "type": COMMIT,
        "engine_id": engine_id,
        "session": session,
        "layers": list(layers),
        "rows": [list(row) for row in rows],
    }


def abort_request(engine_id: str, session: str) -> dict[str, Any]:
    return {"type": ABORT, "engine_id": engine_id, "session": session}


def repair_request() -> dict[str, Any]:
    return {"type": REPAIR}


def park_request(engine_id: str, session: str) -> dict[str, Any]:
    return {"type": PARK, "engine_id": engine_id, "session": session}


def claim_request(engine_id: str, session: str) -> dict[str, Any]:
    return {"type": CLAIM, "engine_id": engine_id, "session": session}


def rejoin_request(
    engine_id: str, session: str, version: int, digest: str, rows: Sequence[Sequence[int]]
) -> dict[str, Any]:
    return {
        "type": REJOIN,
        "engine_id": engine_id,
        "session": session,
        "version": version,
        "digest": digest,
        "rows": [list(row) for row in rows],
    }


def notice_message() -> dict[str, Any]:
    """What the daemon writes on a parked standby's attach connection when no unparked engine is left."""
    return {"type": NOTICE}


def is_notice(message: object) -> bool:
    """Whether a message read on an attach connection is the daemon's notice (``notice_message``): the
    one message a daemon writes there after the attach's reply."""
    return isinstance(message, dict) and message.get("type") == NOTICE and len(message) == 1


def fetch_layout_field(engine_id: str, session: str, version: int, digest: str) -> dict[str, Any]:
    return {"engine_id": engine_id, "session": session, "version": version, "digest": digest}


def request_wire(request: LayoutRequest | FetchLayoutField) -> dict[str, Any]:
    """The dict sent for a typed request (``parse_request``'s inverse; the field for a claim)."""
    if isinstance(request, AttachRequest):
        return attach_request(request.engine_id, request.known_digest)
    if isinstance(request, QueryRequest):
        return query_request(request.include_map)
    if isinstance(request, BeginRequest):
        return begin_request(request.engine_id, request.session, request.base_version, request.layers)
    if isinstance(request, CommitRequest):
        return commit_request(request.engine_id, request.session, request.layers, request.rows)
    if isinstance(request, AbortRequest):
        return abort_request(request.engine_id, request.session)
    if isinstance(request, RepairRequest):
        return repair_request()
    if isinstance(request, ParkRequest):
        return park_request(request.engine_id, request.session)
    if isinstance(request, ClaimRequest):
        return claim_request(request.engine_id, request.session)
    if isinstance(request, RejoinRequest):
        return rejoin_request(request.engine_id, request.session, request.version, request.digest, request.rows)
    if isinstance(request, FetchLayoutField):
        return fetch_layout_field(request.engine_id, request.session, request.version, request.digest)
    raise TypeError(f"not a layout request: {type(request).__name__}")


# -- validators (what the daemon receives) ------------------------------------------------


class _Malformed(Exception):
    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _type_name(value: object) -> str:
    return type(value).__name__


def _get(msg: Mapping[Any, Any], name: str, where: str | None = None) -> Any:
    if name not in msg:
        raise _Malformed(where or name, "missing")
    return msg[name]


def _engine_id(msg: Mapping[Any, Any], where: str = "engine_id") -> str:
    value = _get(msg, "engine_id", where)
    if not isinstance(value, str):
        raise _Malformed(where, f"expected a string, got {_type_name(value)}")
    if not 0 < len(value) <= MAX_ENGINE_ID_LEN or not value.isprintable():
        raise _Malformed(where, f"must be 1..{MAX_ENGINE_ID_LEN} printable characters")
    return value


def _session(msg: Mapping[Any, Any], where: str = "session") -> str:
    value = _get(msg, "session", where)
    if not isinstance(value, str):
        raise _Malformed(where, f"expected a string, got {_type_name(value)}")
    if not 0 < len(value) <= MAX_SESSION_LEN or not _SESSION_CHARS.fullmatch(value):
        raise _Malformed(where, "is not a session token returned by expert_layout_attach")
    return value


def _int(value: object, where: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Malformed(where, f"expected an int, got {_type_name(value)}")
    if not lo <= value <= hi:
        raise _Malformed(where, f"{value} is not in {lo}..{hi}")
    return value


def _int_list(value: object, where: str, max_len: int, lo: int, hi: int) -> tuple[int, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise _Malformed(where, f"expected a list of ints, got {_type_name(value)}")
    if len(value) > max_len:
        raise _Malformed(where, f"{len(value)} entries exceeds the limit of {max_len}")
    return tuple(_int(v, f"{where}[{i}]", lo, hi) for i, v in enumerate(value))


def _layers(msg: Mapping[Any, Any]) -> tuple[int, ...]:
    # Range against the record (and emptiness, duplicates) is a protocol rule: the machine
    # answers it as invalid_layers. Here only the type and a sanity bound.
    return _int_list(_get(msg, "layers"), "layers", MAX_LAYERS, -(2**31), 2**31)


def _rows(msg: Mapping[Any, Any]) -> Rows:
    value = _get(msg, "rows")
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise _Malformed("rows", f"expected a list of rows, got {_type_name(value)}")
    if len(value) > MAX_LAYERS:
        raise _Malformed("rows", f"{len(value)} rows exceeds the limit of {MAX_LAYERS}")
    rows = []
    for i, row in enumerate(value):
        if isinstance(row, (str, bytes, Mapping)) or not isinstance(row, (list, tuple)):
            raise _Malformed(f"rows[{i}]", f"expected a list of ints, got {_type_name(row)}")
        if len(row) > MAX_PHYSICAL:
            raise _Malformed(f"rows[{i}]", f"{len(row)} entries exceeds the limit of {MAX_PHYSICAL}")
        # The values (ints in 0..num_logical-1) are the record's rule, checked once there
        # (LayoutRecord.with_rows).
        rows.append(tuple(row))
    return tuple(rows)


def _bool(msg: Mapping[Any, Any], name: str, default: bool) -> bool:
    value = msg.get(name, default)
    if not isinstance(value, bool):
        raise _Malformed(name, f"expected a bool, got {_type_name(value)}")
    return value


def _digest(value: object, where: str) -> str:
    if not isinstance(value, str) or not _DIGEST.fullmatch(value):
        raise _Malformed(where, "expected 64 lowercase hex characters (a SHA-256 digest)")
    return value


def _parse_known(kind: str, msg: Mapping[Any, Any]) -> LayoutRequest:
    if kind == ATTACH:
        known = msg.get(KNOWN_DIGEST_FIELD)
        return AttachRequest(_engine_id(msg), None if known is None else _digest(known, KNOWN_DIGEST_FIELD))
    if kind == QUERY:
        return QueryRequest(_bool(msg, "include_map", False))
    if kind == BEGIN:
        return BeginRequest(
            _engine_id(msg),
            _session(msg),
            _int(_get(msg, "base_version"), "base_version", 0, MAX_VERSION),
            _layers(msg),
        )
    if kind == COMMIT:
        return CommitRequest(_engine_id(msg), _session(msg), _layers(msg), _rows(msg))
    if kind == ABORT:
        return AbortRequest(_engine_id(msg), _session(msg))
    if kind == REPAIR:
        return RepairRequest()
    if kind == PARK:
        return ParkRequest(_engine_id(msg), _session(msg))
    if kind == CLAIM:
        return ClaimRequest(_engine_id(msg), _session(msg))
    if kind == REJOIN:
        return RejoinRequest(
            _engine_id(msg),
            _session(msg),
            _int(_get(msg, "version"), "version", 0, MAX_VERSION),
            _digest(_get(msg, "digest"), "digest"),
            _rows(msg),
        )
    raise _Malformed("type", f"{kind!r} is not a layout request")


def _malformed_reply(kind: object, error: _Malformed) -> Reply:
    return refused(
        Reason.MALFORMED,
        f"malformed {kind} request: {error.field}: {error.problem}. The daemon changed nothing; "
        f"fix the request (an engine and daemon from different releases of the layout protocol?).",
        field=error.field,
    )


def malformed_frame(problem: str) -> Reply:
    """The reply to a frame refused before it was unpickled (not plain data, too large, not a
    pickle): the daemon cannot tell whose request it was, so the layout core answers it."""
    return refused(
        Reason.MALFORMED,
        f"request refused unread: {problem}. The daemon changed nothing; send one pickled dict of "
        f"plain values (ints, strings, lists, dicts) per connection, as sglang's send_msg does.",
        field="",
    )


def sglang_failed(request_type: object, error: BaseException) -> dict[str, Any]:
    """The reply to one of sglang's own requests that sglang's handler raised on, in sglang's error shape
    (the one its clients read): what failed, and that the daemon serves on."""
    return {
        "status": "error",
        "message": f"{request_type!r} request failed in sglang's handler: {type(error).__name__}: {error}; "
        f"the daemon changed nothing and serves on",
    }


def overloaded(open_connections: int) -> Reply:
    """The reply when the daemon already reads or answers its limit of connections at once."""
    return busy(
        Reason.OVERLOADED,
        f"the daemon is already reading or answering {open_connections} connections, its limit. Retry "
        f"in a few seconds; if this persists, a local process is holding connections to the daemon's "
        f"socket open without sending a request (`ss -xp` lists them).",
    )


def is_sglang_request(msg: object) -> bool:
    """A request for sglang's own handler: a dict whose ``type`` is not a layout request (a
    missing or unknown ``type`` included). Everything else goes to ``parse_request``."""
    return isinstance(msg, Mapping) and not is_layout_request(msg)


def is_layout_request(msg: object) -> bool:
    kind = msg.get("type") if isinstance(msg, Mapping) else None
    return isinstance(kind, str) and kind in LAYOUT_REQUEST_TYPES


# What sglang 0.5.23's daemon answers a request type it does not know (its _handle_connection).
SGLANG_UNKNOWN_REQUEST = "Unknown request type"


def is_older_daemon_reply(reply: object) -> bool:
    """Whether ``reply`` is sglang's own answer to a layout request it does not know: the daemon is
    an older one (sglang's ``WeightCacheDaemon``, without the layout requests), which keeps no record."""
    return (
        isinstance(reply, Mapping)
        and reply.get("status") == "error"
        and SGLANG_UNKNOWN_REQUEST in str(reply.get("message", ""))
    )


def parse_request(msg: object) -> LayoutRequest | Reply:
    """A typed request, or a ``refused(malformed)`` reply naming the field. Never raises."""
    if not isinstance(msg, Mapping):
        return refused(
            Reason.MALFORMED,
            f"malformed request: expected a dict, got {_type_name(msg)}. The daemon changed nothing.",
            field="",
        )
    kind = msg.get("type")
    try:
        if not isinstance(kind, str):
            raise _Malformed("type", f"expected a string, got {_type_name(kind)}")
        return _parse_known(kind, msg)
    except _Malformed as error:
        return _malformed_reply(kind if isinstance(kind, str) else "layout", error)
    except RecursionError:
        return _malformed_reply(kind, _Malformed("", "nested too deeply"))


def parse_plugin_gap(value: object) -> str | None:
    """The ``PLUGIN_GAP_FIELD`` of a ``fetch_state``: one of ``PLUGIN_GAPS``, or None (absent or unknown)."""
    return value if isinstance(value, str) and value in PLUGIN_GAPS else None


# The fields of the ``expert_layout`` field, as a refusal names them.
_FETCH_ENGINE_ID, _FETCH_SESSION, _FETCH_VERSION, _FETCH_DIGEST = (
    f"{FETCH_FIELD}.{name}" for name in ("engine_id", "session", "version", "digest")
)


def parse_fetch_field(value: object) -> FetchLayoutField | Reply | None:
    """The ``expert_layout`` field of a ``fetch_state``: None when absent, or a refusal that names the
    first field that is wrong."""
    if value is None:
        return None
    try:
        if not isinstance(value, Mapping):
            raise _Malformed(FETCH_FIELD, f"expected a dict, got {_type_name(value)}")
        return FetchLayoutField(
            _engine_id(value, _FETCH_ENGINE_ID),
            _session(value, _FETCH_SESSION),
            _int(_get(value, "version", _FETCH_VERSION), _FETCH_VERSION, 0, MAX_VERSION),
            _digest(_get(value, "digest", _FETCH_DIGEST), _FETCH_DIGEST),
        )
    except _Malformed as error:
        return layout_refused(
            Reason.MALFORMED,
            f"fetch_state refused: malformed {error.field}: {error.problem}. No weights were sent; "
            f"the engine's layout plugin and the daemon disagree on the protocol: upgrade both.",
            field=error.field,
        )
