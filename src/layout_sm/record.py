"""The expert-layout record: the full physical-to-logical map, its version and its digest.

The map is sglang's ``ExpertLocationMetadata.physical_to_logical_map`` of one rank's view:
``int[num_layers][num_physical]``, each value a logical expert id. It is stored as the
bytes of its canonical encoding, so the record is immutable and compact (8 bytes a slot).
Its digest is a SHA-256 over the SHA-256 of each layer's row: a chunk of a rebalance changes a
few layers, and only their rows are hashed again (``layout_digest``).

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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _first_non_int(row: Sequence[object]) -> int | None:
    """Index of the first value that is not a plain int (a bool is not an expert id)."""
    # set(map(type, …)) runs at C speed; the slow scan only names the culprit.
    if set(map(type, row)) <= {int}:
        return None
    return next(i for i, v in enumerate(row) if not _is_int(v))


def _row_bytes(row: object, what: str, width: int | None, strict: bool = True) -> bytes:
    """One row as int64 LE bytes, its shape and types checked; the message names the row.

    ``strict`` also refuses bools (``struct`` packs them as 0/1). ``struct.pack`` is used
    rather than ``array``: it packs a list of ints faster.
    """
    if isinstance(row, (str, bytes)) or not isinstance(row, Sequence):
        raise LayoutError(f"{what}: expected a row of ints, got {type(row).__name__}")
    if width is not None and len(row) != width:
        raise LayoutError(f"{what}: row has {len(row)} slots, expected {width}")
    if strict:
        bad = _first_non_int(row)
        if bad is not None:
            raise LayoutError(f"{what}[{bad}]: expected an int, got {type(row[bad]).__name__}")
    try:
        return struct.pack(f"<{len(row)}q", *row)
    except struct.error as exc:
        bad = _first_non_int(row)
        if bad is not None:
            raise LayoutError(f"{what}[{bad}]: expected an int, got {type(row[bad]).__name__}") from exc
        raise LayoutError(f"{what}: a value does not fit in int64") from exc


# bytes(range(n)) for each n <= 256: the expert ids of a layout with n logical experts, as bytes.
_EXPERT_BYTES = [bytes(range(n)) for n in range(257)]


def _experts_in_range(row: Sequence[int], num_logical: int, experts: bytes | None) -> bool:
    """Every value of ``row`` (ints, already packed) is in ``0..num_logical-1``."""
    if experts is not None:
        try:
            return not bytes(row).translate(None, experts)
        except ValueError:  # a value outside 0..255
            return False
    return min(row) >= 0 and max(row) < num_logical


def _rows_to_int64_le(rows: Sequence[Sequence[int]], what: str, strict: bool = True) -> tuple[bytes, int, int]:
    """Validate the shape and integer type of ``rows``; return (bytes, L, P)."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
        raise LayoutError(f"{what}: expected a list of rows, got {type(rows).__name__}")
    num_layers = len(rows)
    if num_layers == 0:
        raise LayoutError(f"{what}: the map has no layers")
    if num_layers > MAX_LAYERS:
        raise LayoutError(f"{what}: {num_layers} layers exceeds the limit of {MAX_LAYERS}")
    first = rows[0]
    num_physical = len(first) if isinstance(first, Sequence) and not isinstance(first, (str, bytes)) else 0
    if num_physical == 0 or num_physical > MAX_PHYSICAL:
        _row_bytes(first, f"{what}[0]", None, strict)  # names a row that is not a row at all
        raise LayoutError(f"{what}[0]: row length {num_physical} is not in 1..{MAX_PHYSICAL}")
    payload = b"".join(_row_bytes(row, f"{what}[{index}]", num_physical, strict) for index, row in enumerate(rows))
    return payload, num_layers, num_physical


def _combine(num_layers: int, num_physical: int, leaves: Iterable[bytes]) -> str:
    """The digest of a map from its layers' hashes (``layout_digest``)."""
    return hashlib.sha256(DIGEST_TAG + _HEADER.pack(num_layers, num_physical) + b"".join(leaves)).hexdigest()


def _leaves_of(payload: bytes, num_layers: int, num_physical: int) -> tuple[bytes, ...]:
    view, stride, sha = memoryview(payload), 8 * num_physical, hashlib.sha256
    return tuple(sha(view[i * stride : (i + 1) * stride]).digest() for i in range(num_layers))


def layout_digest(rows: Sequence[Sequence[int]]) -> str:
    """The digest of a map: SHA-256 (hex) over the SHA-256 of each layer's row.

    Encoding: ``b"sglang-expert-layout/v2\\0"``, uint32 LE ``L``, uint32 LE ``P``, then for each
    layer in order the 32-byte SHA-256 of its ``P`` values as int64 little-endian. Both daemon and
    engine compute it with this module (``LayoutRecord.digest``, ``DigestCache``), so a digest match
    means the same map, value for value; a layer's hash is reused while its row is unchanged.
    """
    payload, num_layers, num_physical = _map_payload(rows)
    return _combine(num_layers, num_physical, _leaves_of(payload, num_layers, num_physical))


def _map_payload(rows: Sequence[Sequence[int]]) -> tuple[bytes, int, int]:
    """The map's values as int64 LE bytes, with its shape, for a digest (raises LayoutError)."""
    # Not strict: a digest is computed, not trusted; records refuse bools when they are built.
    payload = _packed_rows(rows)
    if payload is None:  # not plain rows of one width: the checking encoder names the problem
        return _rows_to_int64_le(rows, "map", strict=False)
    return payload, len(rows), len(rows[0])


class DigestCache:
    """An engine's map as immutable rows, with its digest, kept from one chunk to the next: only the
    rows that changed are copied and hashed again.

    Every row of the map is compared, value for value, with the row of the last map taken here
    (one pass at C speed, cheaper than packing the map): a chunk of a rebalance hashes its own
    layers and no others, and a row changed anywhere else is still seen. Pure, and a cache only: the
    rows and digest equal ``rows_of`` and ``layout_digest`` of the same map whatever came before
    (values compare with ``==``, so a float equal to an expert id counts as that id).
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
        if not (kept and len(rows) == len(kept) and len(rows[0]) == len(kept[0])):
            return self._absorb_whole(rows)
        width, out = len(kept[0]), list(kept)
        pack, sha = _row_packer(width), hashlib.sha256
        try:
            for layer, row in enumerate(rows):
                if row == given[layer]:
                    continue
                values = tuple(row)
                if values != kept[layer]:
                    if len(values) != width:
                        raise struct.error("a row of another width")
                    leaves[layer] = sha(pack(*values)).digest()
                    out[layer] = values
                given[layer] = list(values) if type(row) is list else values
        except (struct.error, TypeError):
            self._forget()  # never keep a half-updated cache
            return self._absorb_whole(rows)  # raises LayoutError naming the problem
        self._rows = out_rows = tuple(out)
        return out_rows, _combine(len(out_rows), width, leaves)

    def digest(self, rows: Sequence[Sequence[int]]) -> str:
        return self.absorb(rows)[1]

    def _absorb_whole(self, rows: Sequence[Sequence[int]]) -> tuple[Rows, str]:
        whole: Rows = tuple(map(tuple, rows))
        payload, num_layers, num_physical = _map_payload(whole)
        leaves = _leaves_of(payload, num_layers, num_physical)
        self._given = [list(row) if type(row) is list else row for row in rows]
        self._rows, self._leaves = whole, list(leaves)
        return whole, _combine(num_layers, num_physical, leaves)


@lru_cache(maxsize=64)
def _row_packer(width: int) -> Callable[..., bytes]:
    return struct.Struct(f"<{width}q").pack


def _packed_rows(rows: Sequence[Sequence[int]]) -> bytes | None:
    """The encoding's payload when ``rows`` are lists (or tuples) of ints of one width, in
    bounds; None otherwise. One compiled ``struct`` per width: the digest is taken once per
    chunk of a rebalance, on the engine's whole map."""
    if type(rows) not in (list, tuple) or not 0 < len(rows) <= MAX_LAYERS:
        return None
    first = rows[0]
    if type(first) not in (list, tuple) or not 0 < len(first) <= MAX_PHYSICAL:
        return None
    if any(type(row) is not type(first) for row in rows):
        return None
    pack = _row_packer(len(first))
    try:  # a row of another width, or a value that is not an int64, fails the pack
        return b"".join([pack(*row) for row in rows])
    except struct.error:
        return None


@dataclass(frozen=True)
class LayoutRecord:
    """An immutable expert layout with its version and digest.

    The map is kept a layer at a time (each row's int64 LE bytes): a committed chunk makes a record
    that shares every other layer with its parent, where one 140 KB string a record (DeepSeek scale)
    was allocated, filled and freed on every commit (measured: the commit's costliest step)."""

    num_layers: int
    num_physical: int
    num_logical: int
    version: int
    layer_bytes: tuple[bytes, ...] = field(repr=False)

    def __post_init__(self) -> None:
        if not (_is_int(self.num_logical) and 1 <= self.num_logical <= MAX_LOGICAL):
            raise LayoutError(f"num_logical: {self.num_logical!r} is not in 1..{MAX_LOGICAL}")
        if not (_is_int(self.version) and self.version >= 0):
            raise LayoutError(f"version: {self.version!r} is not a non-negative int")
        stride = 8 * self.num_physical
        if len(self.layer_bytes) != self.num_layers or any(len(row) != stride for row in self.layer_bytes):
            raise LayoutError("layer_bytes: lengths do not match the shape")
        flat = self._values
        if flat and (min(flat) < 0 or max(flat) >= self.num_logical):
            bad = next(i for i, v in enumerate(flat) if not 0 <= v < self.num_logical)
            layer, slot = divmod(bad, self.num_physical)
            raise LayoutError(f"map[{layer}][{slot}]: expert {flat[bad]} is not in 0..{self.num_logical - 1}")

    # -- construction -------------------------------------------------------------------

    @classmethod
    def build(cls, rows: Sequence[Sequence[int]], num_logical: int, version: int) -> LayoutRecord:
        payload, num_layers, num_physical = _rows_to_int64_le(rows, "map")
        return cls.of_payload(num_layers, num_physical, num_logical, version, payload)

    @classmethod
    def of_payload(
        cls, num_layers: int, num_physical: int, num_logical: int, version: int, payload: bytes
    ) -> LayoutRecord:
        """The record of a whole map's int64 LE bytes (checked as any record is)."""
        if len(payload) != 8 * num_layers * num_physical:
            raise LayoutError("map: its bytes do not match the shape")
        stride = 8 * num_physical
        layers = tuple(payload[i * stride : (i + 1) * stride] for i in range(num_layers))
        return cls(num_layers, num_physical, num_logical, version, layers)

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
    def _flat(self) -> array:
        values = array("q")
        values.frombytes(self.map_bytes)
        if sys.byteorder != "little":
            values.byteswap()
        return values

    @cached_property
    def _values(self) -> list[int]:
        # min()/max() iterate a list much faster than an array (bench: scale).
        return self._flat.tolist()

    @cached_property
    def rows(self) -> Rows:
        flat, width = self._values, self.num_physical
        return tuple(tuple(flat[i * width : (i + 1) * width]) for i in range(self.num_layers))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.num_layers, self.num_physical)

    @cached_property
    def _leaves(self) -> tuple[bytes, ...]:
        sha = hashlib.sha256
        return tuple(sha(row).digest() for row in self.layer_bytes)

    @cached_property
    def digest(self) -> str:
        return _combine(self.num_layers, self.num_physical, self._leaves)

    # -- change -------------------------------------------------------------------------

    def check_rows(self, layers: Sequence[int], rows: object) -> list[bytes]:
        """The rows as int64 LE bytes; raise LayoutError unless they are ``[len(layers)][P]`` experts."""
        if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence):
            raise LayoutError(f"rows: expected a list of {len(layers)} rows, got {type(rows).__name__}")
        if len(rows) != len(layers):
            raise LayoutError(f"rows: {len(rows)} rows for {len(layers)} layers")
        width, logical = self.num_physical, self.num_logical
        pack = _row_packer(width)
        # Where every expert id fits a byte (256 experts or fewer: DeepSeek-V3, Qwen, Mixtral),
        # bytes() range-checks a row at C speed and translate() finds any id >= num_logical;
        # min() and max() over a full DeepSeek-scale commit (17,568 values) cost twice as much
        # as everything else in the commit (profiled).
        experts = _EXPERT_BYTES[logical] if logical <= 256 else None
        checked = []
        for index, row in enumerate(rows):
            if type(row) is tuple or type(row) is list:  # what parse_request and callers pass
                if len(row) != width:
                    raise LayoutError(f"rows[{index}]: {len(row)} slots, the layout has {width} physical slots")
                try:
                    packed = pack(*row)
                except struct.error:
                    packed = _row_bytes(row, f"rows[{index}]", width, strict=False)  # names the culprit
            else:
                if isinstance(row, Sequence) and not isinstance(row, (str, bytes)) and len(row) != width:
                    raise LayoutError(f"rows[{index}]: {len(row)} slots, the layout has {width} physical slots")
                # Not strict: on this hot path a bool is taken for the expert id 0 or 1 it equals;
                # the range check below still applies.
                packed = _row_bytes(row, f"rows[{index}]", width, strict=False)
            if not _experts_in_range(row, logical, experts):  # type: ignore[arg-type]
                slot = next(i for i, v in enumerate(row) if not 0 <= v < logical)  # type: ignore[arg-type]
                raise LayoutError(
                    f"rows[{index}][{slot}]: {row[slot]} is not an expert id in 0..{logical - 1}"  # type: ignore[index]
                )
            checked.append(packed)
        return checked

    def with_rows(self, layers: Sequence[int], rows: Sequence[Sequence[int]]) -> LayoutRecord:
        """The record after a committed move: those layers replaced, version + 1."""
        checked = self.check_rows(layers, rows)
        replaced: dict[int, bytes] = {}
        for layer, packed in zip(layers, checked, strict=True):
            if not 0 <= layer < self.num_layers:
                raise LayoutError(f"layers: {layer} is not in 0..{self.num_layers - 1}")
            replaced[layer] = packed
        # The new map shares every layer it keeps with this one: no copy of the map (see the class).
        new_layers = list(self.layer_bytes)
        for layer, packed in replaced.items():
            new_layers[layer] = packed
        successor = self._checked_successor(tuple(new_layers))
        if "_leaves" in self.__dict__:  # the digest hashes only the replaced layers again
            leaves = list(self._leaves)
            for layer, packed in replaced.items():
                leaves[layer] = hashlib.sha256(packed).digest()
            successor.__dict__["_leaves"] = tuple(leaves)
        return successor

    def successor(self, layers: Sequence[int], rows: Sequence[Sequence[int]]) -> LayoutRecord | LayoutError:
        """``with_rows(layers, rows)``, or the error it raises, remembered for the last ``layers``
        and ``rows`` asked (the same objects): a commit's guard asks whether the rows fit and its
        step stores them, and checking a full map twice would double the commit's cost."""
        memo = self.__dict__.get("_successor_memo")
        if memo is not None and memo[0] is layers and memo[1] is rows:
            return memo[2]
        result: LayoutRecord | LayoutError
        try:
            result = self.with_rows(layers, rows)
        except LayoutError as error:
            result = error
        # In the instance's __dict__ like the cached properties: not a field, so neither equality
        # nor the hash sees it.
        self.__dict__["_successor_memo"] = (layers, rows, result)
        return result

    def _checked_successor(self, layer_bytes: tuple[bytes, ...]) -> LayoutRecord:
        """The next version, built without re-checking the whole map: ``with_rows`` checked the
        rows it replaced and the rest was checked when this record was built (a one-layer commit
        at DeepSeek scale would otherwise re-check 17,568 values)."""
        successor = object.__new__(LayoutRecord)
        for name, value in (
            ("num_layers", self.num_layers),
            ("num_physical", self.num_physical),
            ("num_logical", self.num_logical),
            ("version", self.version + 1),
            ("layer_bytes", layer_bytes),
        ):
            object.__setattr__(successor, name, value)
        return successor

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
        payload = _packed_rows(wire["map"])
        if payload is None:  # not plain rows of one width: the checking build names the problem
            record = cls.build(wire["map"], wire["num_logical"], wire["version"])
        else:  # the range is checked when the record is made, the content by the digest below
            shape = (len(wire["map"]), len(wire["map"][0]))
            record = cls.of_payload(*shape, wire["num_logical"], wire["version"], payload)
        if record.digest != wire["digest"]:
            raise LayoutError("record.digest: does not match the map it came with")
        return record


def rows_of(values: Iterable[Iterable[int]]) -> Rows:
    """A nested iterable (a list, or ``tensor.tolist()``) as immutable rows."""
    return tuple(tuple(int(v) for v in row) for row in values)
