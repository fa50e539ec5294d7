"""The wire schema: builders, validators, and a validator that never raises."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layout_sm import messages as m
from layout_sm.reasons import Reason, Reply, Status

SESSION = "0123abcd"
DIGEST = "a" * 64


@pytest.mark.parametrize(
    ("wire", "typed"),
    [
        (m.attach_request("engine-A"), m.AttachRequest("engine-A")),
        (m.query_request(include_map=True), m.QueryRequest(True)),
        (m.begin_request("A", SESSION, 3, [1, 0]), m.BeginRequest("A", SESSION, 3, (1, 0))),
        (m.commit_request("A", SESSION, [1], [[0, 1]]), m.CommitRequest("A", SESSION, (1,), ((0, 1),))),
        (m.abort_request("A", SESSION), m.AbortRequest("A", SESSION)),
    ],
)
def test_builders_round_trip_through_pickle_and_parse(wire: dict, typed: object) -> None:
    # sglang's send_msg/recv_msg pickle plain dicts; the builders must produce only those.
    assert m.is_layout_request(wire)
    assert m.parse_request(pickle.loads(pickle.dumps(wire))) == typed


def test_fetch_field_round_trip() -> None:
    field = m.fetch_layout_field("A", SESSION, 2, DIGEST)
    assert m.parse_fetch_field(field) == m.FetchLayoutField("A", SESSION, 2, DIGEST)
    assert m.parse_fetch_field(None) is None


@pytest.mark.parametrize(
    ("msg", "field", "problem"),
    [
        ({"type": m.BEGIN, "engine_id": "A", "session": SESSION, "layers": [0]}, "base_version", "missing"),
        (
            {"type": m.BEGIN, "engine_id": "A", "session": SESSION, "base_version": "0", "layers": [0]},
            "base_version",
            "expected an int",
        ),
        (
            {"type": m.BEGIN, "engine_id": "A", "session": SESSION, "base_version": -1, "layers": [0]},
            "base_version",
            "not in",
        ),
        (
            {"type": m.BEGIN, "engine_id": "A", "session": SESSION, "base_version": 0, "layers": "0"},
            "layers",
            "expected a list",
        ),
        (
            {"type": m.BEGIN, "engine_id": "A", "session": SESSION, "base_version": 0, "layers": [True]},
            "layers[0]",
            "expected an int",
        ),
        (
            {"type": m.BEGIN, "engine_id": "A", "session": SESSION, "base_version": 0, "layers": [0] * 5000},
            "layers",
            "exceeds the limit",
        ),
        ({"type": m.ATTACH, "engine_id": 7}, "engine_id", "expected a string"),
        ({"type": m.ATTACH, "engine_id": ""}, "engine_id", "printable"),
        ({"type": m.ABORT, "engine_id": "A", "session": "no spaces"}, "session", "session token"),
        ({"type": m.ABORT, "engine_id": "A", "session": SESSION + "\n"}, "session", "session token"),
        (
            {"type": m.COMMIT, "engine_id": "A", "session": SESSION, "layers": [0], "rows": [[0], "x"]},
            "rows[1]",
            "expected a list",
        ),
        ({"type": m.QUERY, "include_map": 1}, "include_map", "expected a bool"),
    ],
)
def test_malformed_requests_are_refused_naming_the_field(msg: dict, field: str, problem: str) -> None:
    reply = m.parse_request(msg)
    assert isinstance(reply, Reply)
    assert reply.status is Status.REFUSED and reply.reason is Reason.MALFORMED
    assert reply.data["field"] == field
    assert f"{field}: " in reply.message and problem in reply.message


def test_malformed_fetch_field_is_a_layout_refusal() -> None:
    reply = m.parse_fetch_field({"engine_id": "A", "session": SESSION, "version": 0, "digest": "xyz"})
    assert isinstance(reply, Reply) and reply.status is Status.LAYOUT_REFUSED
    assert reply.data["field"] == "expert_layout.digest"


def test_non_dict_is_refused() -> None:
    for msg in (None, [], "expert_layout_attach", 3, b"x"):
        reply = m.parse_request(msg)
        assert isinstance(reply, Reply) and reply.reason is Reason.MALFORMED


_REQUEST_TYPES = (m.AttachRequest, m.QueryRequest, m.BeginRequest, m.CommitRequest, m.AbortRequest, m.RepairRequest)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(max_size=8), children, max_size=5)
        | st.tuples(children, children)
    ),
    max_leaves=30,
)
_field_names = st.sampled_from(
    ["type", "engine_id", "session", "base_version", "layers", "rows", "include_map", "version", "digest"]
)
_types = st.sampled_from([*sorted(m.LAYOUT_REQUEST_TYPES), "ping", "", "expert_layout_"]) | _scalars


@settings(max_examples=1000, deadline=None)
@given(st.dictionaries(_field_names, _values, max_size=7), _types)
def test_any_dict_gives_a_request_or_a_refusal_never_an_exception(msg: dict, kind: object) -> None:
    msg = {**msg, "type": kind}
    result = m.parse_request(msg)
    assert isinstance(result, (Reply, *_REQUEST_TYPES))
    if isinstance(result, Reply):
        assert result.status is Status.REFUSED and result.message
    fetch = m.parse_fetch_field(msg.get("digest"))
    assert fetch is None or isinstance(fetch, (Reply, m.FetchLayoutField))


@settings(deadline=None)
@given(_values)
def test_any_value_gives_a_refusal_never_an_exception(value: object) -> None:
    assert isinstance(m.parse_request(value), (Reply, *_REQUEST_TYPES))


def test_is_layout_request_never_raises() -> None:
    # An unhashable type value must not raise out of the daemon's dispatch (found by fuzzing).
    for msg in ({"type": []}, {"type": {}}, {"type": None}, [], None, {"type": "ping"}):
        assert m.is_layout_request(msg) is False
    assert m.is_layout_request(m.query_request())


def test_who_answers_what() -> None:
    # sglang answers any dict that is not a layout request (its error for a missing or unknown
    # type); the layout core answers the rest, a non-dict included, with refused(malformed).
    for msg in ({"type": "ping"}, {"type": "fetch_state"}, {}, {"type": None}, {"type": "nope"}, {"type": []}):
        assert m.is_sglang_request(msg)
    for msg in ([], None, 3, "ping", b"x", (("type", "ping"),), m.query_request(), m.attach_request("A")):
        assert not m.is_sglang_request(msg)
    for msg in ([], None, 3, "ping"):
        reply = m.parse_request(msg)
        assert isinstance(reply, Reply) and (reply.status, reply.reason) == (Status.REFUSED, Reason.MALFORMED)


def test_frame_refusals_say_what_to_do() -> None:
    frame = m.malformed_frame("pickle opcode REDUCE at byte 3 is not plain data")
    assert (frame.status, frame.reason) == (Status.REFUSED, Reason.MALFORMED)
    assert "REDUCE" in frame.message and "plain values" in frame.message
    busy = m.overloaded(32)
    assert busy.retry_can_help and busy.reason is Reason.OVERLOADED and "32" in busy.message


# Values at and around each bound the fetch field's validators test, of the right type and of others.
_FETCH_VALUES = {
    "engine_id": st.sampled_from(["A", "x" * m.MAX_ENGINE_ID_LEN, "x" * (m.MAX_ENGINE_ID_LEN + 1), "", "a\nb", "é", 7])
    | st.text(max_size=4),
    "session": st.sampled_from(
        [SESSION, "s" * m.MAX_SESSION_LEN, "s" * (m.MAX_SESSION_LEN + 1), "", "a b", "ab\n", "a-b_c", None]
    )
    | st.text(max_size=4),
    "version": st.sampled_from([0, 1, m.MAX_VERSION, m.MAX_VERSION + 1, -1, True, False, 2.0, "0", None]),
    "digest": st.sampled_from([DIGEST, "A" * 64, "a" * 63, "a" * 65, DIGEST + "\n", "g" * 64, b"a" * 64, None]),
}
_WELL_FORMED_FIELD = m.fetch_layout_field("A", SESSION, 2, DIGEST)
# A well-formed field with one value drawn (or one field missing, or one more), and any value at all.
_fetch_fields = (
    st.one_of(*(st.builds(lambda v, k=k: {**_WELL_FORMED_FIELD, k: v}, values) for k, values in _FETCH_VALUES.items()))
    | st.sampled_from(sorted(_WELL_FORMED_FIELD)).map(lambda k: {f: v for f, v in _WELL_FORMED_FIELD.items() if f != k})
    | _scalars.map(lambda extra: {**_WELL_FORMED_FIELD, "extra": extra})
    | st.fixed_dictionaries({}, optional=_FETCH_VALUES)
    | _values
)


def _well_formed_fetch_field(value: object) -> bool:
    """The rule for the ``expert_layout`` field, written out independently of messages.py."""
    if not isinstance(value, dict):
        return False
    engine_id, session, version, digest = (value.get(k) for k in ("engine_id", "session", "version", "digest"))
    return (
        isinstance(engine_id, str)
        and 0 < len(engine_id) <= m.MAX_ENGINE_ID_LEN
        and engine_id.isprintable()
        and isinstance(session, str)
        and 0 < len(session) <= m.MAX_SESSION_LEN
        and all(c.isascii() and (c.isalnum() or c in "-_") for c in session)
        and type(version) is int
        and 0 <= version <= m.MAX_VERSION
        and isinstance(digest, str)
        and len(digest) == 64
        and all(c in "0123456789abcdef" for c in digest)
    )


@settings(max_examples=2000, deadline=None)
@given(_fetch_fields)
def test_the_fetch_field_is_accepted_exactly_when_well_formed(value: object) -> None:
    result = m.parse_fetch_field(value)
    if value is None:
        assert result is None
    elif _well_formed_fetch_field(value):
        assert result == m.FetchLayoutField(value["engine_id"], value["session"], value["version"], value["digest"])  # type: ignore[index]
    else:
        assert isinstance(result, Reply) and result.status is Status.LAYOUT_REFUSED
        assert result.data["field"].startswith(m.FETCH_FIELD) and "upgrade both" in result.message
