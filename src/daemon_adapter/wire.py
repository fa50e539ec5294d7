"""What a layout-aware daemon accepts as one request frame, checked before anything is unpickled.

The frame is sglang's (``daemon_adapter.client`` writes and reads it for every client); these are
the daemon's own bounds on it, so they live with the daemon.
"""

from __future__ import annotations

import pickletools
import re

# What a layout-aware daemon accepts as one request (sglang's own requests included). A request is a
# small plain-data dict; the largest the protocol sends, a commit of a whole DeepSeek-V3-scale map, is
# far within both bounds. The bounds keep what one request can cost the daemon small: a number of
# objects (the costliest, an empty set, is a few hundred bytes with its stack slot) and of bytes of
# text (which can widen a few times in memory, and is held a few times over: the frame, the check,
# the request, sglang's own unpickling of it). The bench measures a commit against them.
MAX_REQUEST_FRAME_BYTES = 1024 * 1024
MAX_REQUEST_OPCODES = 2**17
# Opcodes that only build plain data (no import, no call, no out-of-band buffer). Everything
# else (GLOBAL, REDUCE, BUILD, NEWOBJ, EXT*, PERSID, NEXT_BUFFER...) can run code or allocate
# without bound: list(itertools.repeat(0, 10**8)) is a 51-byte pickle.
PLAIN_DATA_OPCODES = frozenset(
    {
        "PROTO",
        "FRAME",
        "STOP",
        "MARK",
        "POP",
        "POP_MARK",
        "DUP",
        "NONE",
        "NEWTRUE",
        "NEWFALSE",
        "INT",
        "BININT",
        "BININT1",
        "BININT2",
        "LONG",
        "LONG1",
        "LONG4",
        "FLOAT",
        "BINFLOAT",
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
        "BINBYTES",
        "SHORT_BINBYTES",
        "BINBYTES8",
        "BYTEARRAY8",
        "EMPTY_LIST",
        "APPEND",
        "APPENDS",
        "LIST",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "EMPTY_DICT",
        "DICT",
        "SETITEM",
        "SETITEMS",
        "EMPTY_SET",
        "ADDITEMS",
        "FROZENSET",
        "GET",
        "BINGET",
        "LONG_BINGET",
        "PUT",
        "BINPUT",
        "LONG_BINPUT",
        "MEMOIZE",
    }
)
_MEMO_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


def _counted(length: int) -> bytes:
    """A one-byte length followed by that many bytes."""
    return re.escape(bytes([length])) + (b".{%d}" % length if length else b"")


# The opcodes of PLAIN_DATA_OPCODES that requests are made of (sglang's send_msg pickles with the
# highest protocol), each with its whole argument, as one compiled pattern: it reads a request in
# the C regex engine instead of a Python step per opcode (pickletools.genops, the reference below,
# reads a commit many times slower than unpickling it, this pattern about as fast: `make bench`
# measures both against unpickling, results/bench.md). Every
# alternative starts with its own opcode byte and says how long its argument is, so the pattern
# reads the stream exactly as pickletools and the unpickler do. It leaves out only opcodes and
# arguments it cannot bound: the text opcodes of protocol 0 and strings, bytes and longs of 256
# bytes or more; a frame with any of them is read by pickletools.
_ONE_BYTE_LENGTH = b"(?:" + b"|".join(_counted(n) for n in range(256)) + b")"
_PLAIN_DATA_STREAM = re.compile(
    b"(?:"
    + b"|".join(
        [
            b"K.",  # BININT1, most of a commit's rows
            b"[" + re.escape(b"(012N\x88\x89]aelt)\x85\x86\x87}dsu\x8f\x90\x91\x94") + b"]",  # no argument
            b"[\x8cCU\x8a]" + _ONE_BYTE_LENGTH,  # SHORT_BINUNICODE, SHORT_BINBYTES, SHORT_BINSTRING, LONG1
            b"[\x80hq].",  # PROTO, BINGET, BINPUT (a memo index below 256)
            b"M..",  # BININT2
            b"[Jj]....",  # BININT, LONG_BINGET
            b"r..[\x00\x01]\x00",  # LONG_BINPUT with a memo index below 2**17 (little-endian)
            b"[\x95G].{8}",  # FRAME, BINFLOAT
        ]
    )
    + b")*+\\.",  # possessive: each opcode is read once, never re-read; then STOP
    re.DOTALL,
)


def request_pickle_problem(data: bytes) -> str | None:
    """Why a request's pickle is refused before it is unpickled, or None when it is plain data
    within the bounds above. Reads the opcodes only, builds nothing.

    A frame of at most ``MAX_REQUEST_OPCODES`` bytes (it has at most as many opcodes) that
    ``_PLAIN_DATA_STREAM`` reads to its STOP is plain data within every bound: its opcodes are
    in the allow-list and its memo indices in range. Any other frame is read opcode by opcode
    (``pickletools``), which names the problem. Neither decodes a string's UTF-8: the unpickler
    refuses a string that is not UTF-8 as pickletools does, before any object is built from it."""
    if len(data) > MAX_REQUEST_FRAME_BYTES:
        return f"a request of {len(data)} bytes exceeds the limit of {MAX_REQUEST_FRAME_BYTES}"
    if len(data) <= MAX_REQUEST_OPCODES and _PLAIN_DATA_STREAM.match(data) is not None:
        return None
    return opcode_problem(data)


def opcode_problem(data: bytes) -> str | None:
    """``request_pickle_problem`` read opcode by opcode (``pickletools.genops``): the reference
    that the compiled pattern must agree with, and the reader of the frames it leaves out."""
    count = 0
    try:
        for opcode, arg, pos in pickletools.genops(data):
            count += 1
            if count > MAX_REQUEST_OPCODES:
                return f"a request of more than {MAX_REQUEST_OPCODES} pickle opcodes exceeds the limit"
            if opcode.name not in PLAIN_DATA_OPCODES:
                return f"pickle opcode {opcode.name} at byte {pos} is not plain data (requests are plain dicts)"
            # The unpickler sizes its memo by the largest index: LONG_BINPUT 2**27 alone allocates 1 GB.
            if opcode.name in _MEMO_PUTS and not 0 <= int(arg) < MAX_REQUEST_OPCODES:
                return f"pickle memo index {arg} is out of range"
    except Exception as error:  # truncated, an unknown opcode, an int of too many digits...
        return f"not a pickle: {type(error).__name__}: {error}"
    return None
