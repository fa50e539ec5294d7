"""The daemon's check of a request's pickle before unpickling it (``daemon_adapter.wire``).

Why: the check reads most frames with one compiled pattern instead of pickletools' Python step
per opcode. It keeps its guarantees only if the pattern reads the opcodes as pickletools does
and accepts nothing the opcode-by-opcode reading refuses.
"""

from __future__ import annotations

import io
import pickle
import pickletools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon_adapter.daemon import PlainRequestUnpickler
from daemon_adapter.wire import (
    _PLAIN_DATA_STREAM,
    MAX_REQUEST_OPCODES,
    PLAIN_DATA_OPCODES,
    opcode_problem,
    request_pickle_problem,
)

# The text opcodes of protocol 0 (their arguments end at a newline) and the arguments of 4 or 8
# length bytes: left to pickletools.
LEFT_TO_PICKLETOOLS = {
    "INT",
    "LONG",
    "FLOAT",
    "STRING",
    "UNICODE",
    "GET",
    "PUT",
    "BINSTRING",
    "BINUNICODE",
    "BINUNICODE8",
    "BINBYTES",
    "BINBYTES8",
    "BYTEARRAY8",
    "LONG4",
}


def _read_by_the_pattern(data: bytes) -> bool:
    return len(data) <= MAX_REQUEST_OPCODES and _PLAIN_DATA_STREAM.match(data) is not None


def _one_opcode(opcode: pickletools.OpcodeInfo) -> bytes:
    """``opcode`` with the shortest argument of its kind, between PROTO 5 and STOP."""
    arg = opcode.arg
    if arg is None:
        body = b""
    elif arg.n >= 0:
        body = bytes(arg.n)
    elif arg.n == pickletools.TAKEN_FROM_ARGUMENT1:
        body = b"\x00"  # an empty string, bytes or long
    else:
        body = b"0\n" if arg.n == pickletools.UP_TO_NEWLINE else bytes(8)
    return b"\x80\x05" + opcode.code.encode("latin-1") + body + b"."


def test_the_pattern_reads_every_plain_data_opcode_and_no_other() -> None:
    read = set()
    for opcode in pickletools.opcodes:
        if opcode.name == "STOP":
            continue
        stream = _one_opcode(opcode)
        if _read_by_the_pattern(stream):
            read.add(opcode.name)
            # what it reads, pickletools reads the same way: one opcode, then STOP
            assert [op.name for op, _, _ in pickletools.genops(stream)] == ["PROTO", opcode.name, "STOP"]
    assert read == PLAIN_DATA_OPCODES - LEFT_TO_PICKLETOOLS - {"STOP"}


def test_a_memo_index_is_read_only_below_the_bound() -> None:
    for index, read in ((0, True), (MAX_REQUEST_OPCODES - 1, True), (MAX_REQUEST_OPCODES, False), (2**27, False)):
        stream = b"\x80\x05Nr" + index.to_bytes(4, "little") + b"."
        assert _read_by_the_pattern(stream) is read, index
        assert (request_pickle_problem(stream) is None) is read


def test_a_frame_longer_than_the_opcode_bound_is_read_by_pickletools() -> None:
    many = b"\x80\x05(" + b"\x8f" * MAX_REQUEST_OPCODES + b"t."  # one opcode too many
    assert _PLAIN_DATA_STREAM.match(many) is not None and not _read_by_the_pattern(many)
    assert (
        request_pickle_problem(many) == f"a request of more than {MAX_REQUEST_OPCODES} pickle opcodes exceeds the limit"
    )


plain = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**80), max_value=2**80),
        st.floats(allow_nan=False),
        st.text(max_size=300),
        st.binary(max_size=300),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=8),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=12), inner, max_size=6),
        st.frozensets(st.integers(-5, 5), max_size=4),
    ),
    max_leaves=30,
)


def _agree(data: bytes) -> None:
    """The check answers as the opcode-by-opcode reading does; the one difference allowed is a
    string that is not UTF-8, which pickletools refuses and the unpickler refuses too (maybe for
    another fault of the same frame first: a frame or protocol number out of range). The daemon
    refuses a frame that its unpickler cannot read, whatever the exception."""
    fast, exact = request_pickle_problem(data), opcode_problem(data)
    if fast is None and exact is not None:
        assert exact.startswith("not a pickle: UnicodeDecodeError"), exact
        with pytest.raises(Exception):  # noqa: B017
            PlainRequestUnpickler(io.BytesIO(data)).load()
        return
    assert fast == exact


@settings(max_examples=300, deadline=None)
@given(value=plain, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL))
def test_plain_data_of_every_protocol_is_checked_as_pickletools_checks_it(value: object, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    _agree(data)
    if protocol >= 4:  # bytes and frozensets before protocol 4 are a call (GLOBAL, REDUCE)
        assert request_pickle_problem(data) is None


@settings(max_examples=300, deadline=None)
@given(value=plain, edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_damaged_pickle_is_checked_as_pickletools_checks_it(value: object, edits: list[tuple[int, int]]) -> None:
    data = bytearray(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    for position, byte in edits:
        data[position % len(data)] = byte
    _agree(bytes(data))
    _agree(bytes(data[: edits[0][0] % len(data)]))  # truncated too
