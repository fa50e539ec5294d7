"""The expert-layout record: the full physical-to-logical map, its version and its digest.

The map is sglang's ``ExpertLocationMetadata.physical_to_logical_map`` of one rank's view:
``int[num_layers][num_physical]``, each value a logical expert id. It is stored as the
bytes of its canonical encoding, so the record is immutable and compact (8 bytes a slot).
Its digest is a SHA-256 over the SHA-256 of each layer's row: a chunk of a rebalance changes a
few layers, and only their rows are hashed again (``layout_digest``).

Every map and row goes through one encoder (``_encode_map``, ``_encode_row``: shape, type, int64)
and every expert id through one range check (``_check_experts``), whoever hands them in: the
daemon's initial map, a record from the wire, a commit's rows, an engine's map to digest.

Only the digest decides equality of layouts; the version is for messages and ordering.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

# Bumping the tag changes every digest: do it only with a new encoding (v2: a hash of the layers' hashes).
DIGEST_TAG = b"sglang-expert-layout/v2\x00"
_HEADER = struct.Struct("<II")
# Bounds that keep a hostile request from making the daemon allocate without limit;
# DeepSeek-V3 is 61 x 288, the largest MoE layouts known are far below these.
MAX_LAYERS = 4096
MAX_PHYSICAL = 65536
MAX_LOGICAL = 65536

Rows = tuple[tuple[int, ...], ...]


class LayoutError(ValueError):
    """A map, row or record that cannot be a layout; the message names the field."""


def _is_row(value: object) -> bool:
    return (
        type(value) is tuple
        or type(value) is list
        or (isinstance(value, Sequence) and not isinstance(value, (str, bytes)))
    )


@lru_cache(maxsize=64)
def _row_packer(width: int) -> Callable[..., bytes]:
    return struct.Struct(f"<{width}q").pack


def _encode_row(row: object, width: int, what: str, index: int) -> bytes:
    """One row of ``width`` values as int64 LE bytes; the message names the row (``what[index]``) and the slot.

    A value is what ``struct`` packs as an int64: an int (a bool as the 0 or 1 it equals), never a
    float or a string.
    """
    if not _is_row(row):
        what = f"{what}[{index}]"  # the name is made only for a message: a commit encodes up to a map of rows
        raise LayoutError(f"{what}: expected a row of ints, got {type(row).__name__}")
    if len(row) != width:  # type: ignore[arg-type]
        what = f"{what}[{index}]"
        raise LayoutError(f"{what}: {len(row)} slots, the layout has {width} physical slots")  # type: ignore[arg-type]
    try:
        return _row_packer(width)(*row)  # type: ignore[misc]
    except struct.error as exc:  # only now, to name the culprit
        what = f"{what}[{index}]"
        bad = next((i for i, v in enumerate(row) if not isinstance(v, int)), None)  # type: ignore[arg-type]
        if bad is not None:
            raise LayoutError(f"{what}[{bad}]: expected an int, got {type(row[bad]).__name__}") from exc  # type: ignore[index]
        raise LayoutError(f"{what}: a value does not fit in int64") from exc


def _encode_map(rows: object, what: str) -> tuple[tuple[bytes, ...], int]:
    """A whole map's layers as int64 LE bytes, and its width (raises LayoutError naming the row)."""
    if not _is_row(rows):
        raise LayoutError(f"{what}: expected a list of rows, got {type(rows).__name__}")
    num_layers = len(rows)  # type: ignore[arg-type]
    if num_layers == 0:
        raise LayoutError(f"{what}: the map has no layers")
    if num_layers > MAX_LAYERS:
        raise LayoutError(f"{what}: {num_layers} layers exceeds the limit of {MAX_LAYERS}")
    first = rows[0]  # type: ignore[index]
    if not _is_row(first):
        _encode_row(first, 0, what, 0)  # raises: names a row that is not a row at all
    num_physical = len(first)
    if not 0 < num_physical <= MAX_PHYSICAL:
        raise LayoutError(f"{what}[0]: row length {num_physical} is not in 1..{MAX_PHYSICAL}")
    layers = tuple(_encode_row(row, num_physical, what, index) for index, row in enumerate(rows))  # type: ignore[arg-type]
    return layers, num_physical


# bytes(range(n)) for each n <= 256: the expert ids of a layout with n logical experts, as bytes.
_EXPERT_BYTES = [bytes(range(n)) for n in range(257)]


def _check_experts(row: Sequence[int], num_logical: int, what: str, index: int) -> None:
    """Every value of ``row`` (an encoded row's values) is an expert id in ``0..num_logical-1``."""
    # Where every expert id fits a byte (256 experts or fewer: DeepSeek-V3, Qwen, Mixtral), bytes()
    # range-checks a row at C speed and translate() finds any id >= num_logical; min() and max() cost
    # twice as much as the rest of a full-map commit.
    if type(row) is not tuple and type(row) is not list:
        row = tuple(row)  # bytes() of an object with a buffer (an array) would read its memory, not its values
    if num_logical <= 256:
        try:
            in_range = not bytes(row).translate(None, _EXPERT_BYTES[num_logical])
        except ValueError:  # a value outside 0..255
            in_range = False
    else:
        in_range = min(row) >= 0 and max(row) < num_logical
    if not in_range:
        slot = next(i for i, v in enumerate(row) if not 0 <= v < num_logical)
        raise LayoutError(f"{what}[{index}][{slot}]: {row[slot]} is not an expert id in 0..{num_logical - 1}")


def _check_num_logical(num_logical: object) -> None:
    if not (isinstance(num_logical, int) and not isinstance(num_logical, bool) and 1 <= num_logical <= MAX_LOGICAL):
        raise LayoutError(f"num_logical: {num_logical!r} is not in 1..{MAX_LOGICAL}")


def _combine(num_layers: int, num_physical: int, leaves: Iterable[bytes]) -> str:
    """The digest of a map from its layers' hashes (``layout_digest``)."""
    return hashlib.sha256(DIGEST_TAG + _HEADER.pack(num_layers, num_physical) + b"".join(leaves)).hexdigest()


def _leaf(layer: bytes) -> bytes:
    return hashlib.sha256(layer).digest()


def layout_digest(rows: Sequence[Sequence[int]]) -> str:
    """The digest of a map: SHA-256 (hex) over the SHA-256 of each layer's row.

    Encoding: ``b"sglang-expert-layout/v2\\0"``, uint32 LE ``L``, uint32 LE ``P``, then for each
    layer in order the 32-byte SHA-256 of its ``P`` values as int64 little-endian. Both daemon and
    engine compute it with this module (``LayoutRecord.digest``, ``DigestCache``), so a digest match
    means the same map, value for value; a layer's hash is reused while its row is unchanged.
    """
    layers, num_physical = _encode_map(rows, "map")
    return _combine(len(layers), num_physical, map(_leaf, layers))


class DigestCache:
    """An engine's map as immutable rows, with its digest, kept from one chunk to the next: only the
    rows that changed are copied and hashed again.

    Every row of the map is compared, value for value, with the row of the last map taken here
    (one pass at C speed, cheaper than encoding the map): a chunk of a rebalance hashes its own
    layers and no others, and a row changed anywhere else is still seen. Pure, and a cache only: the
    rows and digest equal ``rows_of`` and ``layout_digest`` of the same map whatever came before
    (values compare with ``==``, so a float equal to the expert id it replaced counts as that id).
    """

    __slots__ = ("_given", "_leaves", "_rows")

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._given: list[Sequence[int]] = []  # the last map's rows as given (lists copied)
        self._rows: Rows = ()
        self._leaves: list[bytes] = []

    def absorb(self, rows: Sequence[Sequence[int]]) -> tuple[Rows, str]:
        """``rows`` as immutable rows, and their digest; raises LayoutError for what is not a map."""
        given, kept, leaves = self._given, self._rows, self._leaves
        if not (kept and _is_row(rows) and len(rows) == len(kept)):
            return self._absorb_whole(rows)
        width, out = len(kept[0]), list(kept)
        try:
            for layer, row in enumerate(rows):
                if row == given[layer]:
                    continue
                values = tuple(row)
                if values != kept[layer]:
                    leaves[layer] = _leaf(_encode_row(values, width, "map", layer))
                    out[layer] = values
                given[layer] = list(values) if type(row) is list else values
        except (LayoutError, TypeError):
            self._forget()  # never keep a half-updated cache
            return self._absorb_whole(rows)  # raises LayoutError naming the problem
        self._rows = out_rows = tuple(out)
        return out_rows, _combine(len(out_rows), width, leaves)

    def digest(self, rows: Sequence[Sequence[int]]) -> str:
        return self.absorb(rows)[1]

    def _absorb_whole(self, rows: Sequence[Sequence[int]]) -> tuple[Rows, str]:
        layers, num_physical = _encode_map(rows, "map")
        leaves = [_leaf(layer) for layer in layers]
        whole: Rows = tuple(map(tuple, rows))
        self._given = [list(row) if type(row) is list else row for row in rows]
        self._rows, self._leaves = whole, leaves
        return whole, _combine(len(layers), num_physical, leaves)


@dataclass(frozen=True)
class LayoutRecord:
    """An immutable expert layout with its version and digest.

    Made by ``build`` (``initial``, ``from_wire``) or ``with_rows``, which check every value they
    encode; the constructor checks the counts and the shape. The map is kept a layer at a time (each
    row's int64 LE bytes): a committed chunk makes a record that shares every other layer with its
    parent, rather than allocating, filling and freeing the whole map on every commit."""

    num_layers: int
    num_physical: int
    num_logical: int
    version: int
    layer_bytes: tuple[bytes, ...] = field(repr=False)

    def __post_init__(self) -> None:
        _check_num_logical(self.num_logical)
        if not (isinstance(self.version, int) and not isinstance(self.version, bool) and self.version >= 0):
            raise LayoutError(f"version: {self.version!r} is not a non-negative int")
        stride = 8 * self.num_physical
        if len(self.layer_bytes) != self.num_layers or set(map(len, self.layer_bytes)) - {stride}:
            raise LayoutError("layer_bytes: lengths do not match the shape")

    # -- construction -------------------------------------------------------------------

    @classmethod
    def build(cls, rows: Sequence[Sequence[int]], num_logical: int, version: int) -> LayoutRecord:
        """The record of a whole map; raises LayoutError naming the first row or value that is wrong."""
        layers, num_physical = _encode_map(rows, "map")
        _check_num_logical(num_logical)
        for index, row in enumerate(rows):
            _check_experts(row, num_logical, "map", index)
        return cls(len(layers), num_physical, num_logical, version, layers)

    @classmethod
    def initial(cls, rows: Sequence[Sequence[int]], num_logical: int) -> LayoutRecord:
        """The record a daemon starts with: the initial layout at version 0."""
        return cls.build(rows, num_logical, 0)

    # -- reading ------------------------------------------------------------------------

    @cached_property
    def map_bytes(self) -> bytes:
        """The whole map's int64 LE bytes, layer after layer."""
        return b"".join(self.layer_bytes)

    @cached_property
    def rows(self) -> Rows:
        values = array("q")
        values.frombytes(self.map_bytes)
        if sys.byteorder != "little":
            values.byteswap()
        flat, width = values.tolist(), self.num_physical
        return tuple(tuple(flat[i * width : (i + 1) * width]) for i in range(self.num_layers))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_layers, self.num_physical)

    @cached_property
    def _leaves(self) -> tuple[bytes, ...]:
        return tuple(map(_leaf, self.layer_bytes))

    @cached_property
    def digest(self) -> str:
        return _combine(self.num_layers, self.num_physical, self._leaves)

    # -- change -------------------------------------------------------------------------

    def with_rows(self, layers: Sequence[int], rows: Sequence[Sequence[int]]) -> LayoutRecord:
        """The record after a committed move: those layers replaced, version + 1.

        Only the replaced rows are checked: the layers kept were checked when this record was made."""
        if not _is_row(rows):
            raise LayoutError(f"rows: expected a list of {len(layers)} rows, got {type(rows).__name__}")
        if len(rows) != len(layers):
            raise LayoutError(f"rows: {len(rows)} rows for {len(layers)} layers")
        replaced: dict[int, bytes] = {}
        for index, (layer, row) in enumerate(zip(layers, rows, strict=True)):
            encoded = _encode_row(row, self.num_physical, "rows", index)
            _check_experts(row, self.num_logical, "rows", index)
            replaced[layer] = encoded
        for layer in replaced:
            if not 0 <= layer < self.num_layers:
                raise LayoutError(f"layers: {layer} is not in 0..{self.num_layers - 1}")
        # The new map shares every layer it keeps with this one: no copy of the map (see the class).
        new_layers = list(self.layer_bytes)
        for layer, encoded in replaced.items():
            new_layers[layer] = encoded
        successor = LayoutRecord(
            self.num_layers, self.num_physical, self.num_logical, self.version + 1, tuple(new_layers)
        )
        if "_leaves" in self.__dict__:  # the successor's digest hashes only the replaced layers again
            leaves = list(self._leaves)
            for layer, encoded in replaced.items():
                leaves[layer] = _leaf(encoded)
            successor.__dict__["_leaves"] = tuple(leaves)  # a cached_property's slot, as it would fill it
        return successor

    def successor(self, layers: Sequence[int], rows: Sequence[Sequence[int]]) -> LayoutRecord | LayoutError:
        """``with_rows(layers, rows)``, or the error it raises.

        A commit's guard, its refusal and its step each ask this of the same request: the answer for
        the last rows asked is kept, so that a full-map commit is checked once, not once per asking.
        Only immutable rows (a parsed request's tuples) are kept, and a later ask must equal them
        (``==``: identical tuples compare in one pass over the rows), so the answer is always
        ``with_rows``'s own."""
        frozen = type(layers) is tuple and type(rows) is tuple and all(type(row) is tuple for row in rows)
        memo = self.__dict__.get("_last_successor")
        if frozen and memo is not None and memo[0] == layers and memo[1] == rows:
            return memo[2]
        result: LayoutRecord | LayoutError
        try:
            result = self.with_rows(layers, rows)
        except LayoutError as error:
            result = error
        if frozen:
            # In the instance's __dict__, like the cached properties: not a field, so neither
            # equality nor the hash sees it.
            self.__dict__["_last_successor"] = (layers, rows, result)
        return result

    # -- wire ---------------------------------------------------------------------------

    def to_wire(self, include_map: bool = True) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "version": self.version,
            "digest": self.digest,
            "num_logical": self.num_logical,
            "shape": [self.num_layers, self.num_physical],
        }
        if include_map:
            wire["map"] = [list(row) for row in self.rows]
        return wire

    @classmethod
    def from_wire(cls, wire: object) -> LayoutRecord:
        """Rebuild a record sent with ``to_wire(include_map=True)``; check its digest."""
        if not isinstance(wire, Mapping):
            raise LayoutError(f"record: expected a dict, got {type(wire).__name__}")
        for name in ("version", "digest", "num_logical", "map"):
            if name not in wire:
                raise LayoutError(f"record.{name}: missing")
        record = cls.build(wire["map"], wire["num_logical"], wire["version"])
        if record.digest != wire["digest"]:
            raise LayoutError("record.digest: does not match the map it came with")
        return record


def rows_of(values: Iterable[Iterable[int]]) -> Rows:
    """A nested iterable (a list, or ``tensor.tolist()``) as immutable rows."""
    return tuple(tuple(int(v) for v in row) for row in values)
