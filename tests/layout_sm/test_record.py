"""LayoutRecord and the canonical digest."""

from __future__ import annotations

import hashlib
import struct
from array import array

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from layout_sm.record import DIGEST_TAG, DigestCache, LayoutError, LayoutRecord, layout_digest, rows_of


@st.composite
def maps(draw: st.DrawFn, max_layers: int = 6, max_physical: int = 8) -> tuple[list[list[int]], int]:
    num_logical = draw(st.integers(1, 12))
    num_layers = draw(st.integers(1, max_layers))
    num_physical = draw(st.integers(1, max_physical))
    rows = [
        draw(st.lists(st.integers(0, num_logical - 1), min_size=num_physical, max_size=num_physical))
        for _ in range(num_layers)
    ]
    return rows, num_logical


def _reference_digest(rows: list[list[int]]) -> str:
    """The documented encoding, written out independently of record.py."""
    payload = DIGEST_TAG + struct.pack("<II", len(rows), len(rows[0]))
    for row in rows:
        payload += hashlib.sha256(b"".join(struct.pack("<q", v) for v in row)).digest()
    return hashlib.sha256(payload).hexdigest()


def test_digest_is_the_documented_encoding() -> None:
    rows = [[0, 1, 2, 3], [3, 2, 1, 0]]
    assert layout_digest(rows) == _reference_digest(rows)
    assert LayoutRecord.initial(rows, 4).digest == _reference_digest(rows)
    assert DIGEST_TAG == b"sglang-expert-layout/v2\x00"


@settings(max_examples=60, deadline=None)
@given(maps(), st.data())
def test_a_successor_and_the_digest_cache_hash_only_changed_rows_and_agree_with_the_definition(
    case: tuple[list[list[int]], int], data: st.DataObject
) -> None:
    """The record's successor reuses its parent's layer hashes, the engine's cache its last map's:
    both must equal the digest of the whole map, whichever rows changed (in the chunk or not)."""
    rows, num_logical = case
    record = LayoutRecord.initial(rows, num_logical)
    assert record.digest == _reference_digest(rows)
    cache = DigestCache()

    def absorbed(rows: list[list[int]]) -> str:
        """The cache's digest, the map handed as lists (as sglang's tolist()) or as tuples, by draw."""
        given = [list(row) for row in rows] if data.draw(st.booleans()) else rows_of(rows)
        kept, digest = cache.absorb(given)
        assert kept == rows_of(rows) and type(kept) is tuple and all(type(row) is tuple for row in kept)
        return digest

    assert absorbed(rows) == record.digest
    for _ in range(3):
        layers = sorted(data.draw(st.sets(st.integers(0, len(rows) - 1), min_size=1)))
        new_rows = [data.draw(st.permutations(rows[layer])) for layer in layers]
        record = record.with_rows(layers, new_rows)
        for layer, row in zip(layers, new_rows, strict=True):
            rows[layer] = list(row)
        assert record.digest == _reference_digest(rows)
        if data.draw(st.booleans()):  # a row changed outside the chunk: the cache must see it too
            seen = [list(row) for row in rows]
            other = data.draw(st.integers(0, len(rows) - 1))
            seen[other] = [(v + 1) % (num_logical + 1) for v in seen[other]]
            assert absorbed(seen) == _reference_digest(seen)
        assert absorbed(rows) == _reference_digest(rows) == record.digest


def test_the_digest_cache_refuses_what_layout_digest_refuses() -> None:
    cache = DigestCache()
    cache.digest(((0, 1), (1, 0)))
    with pytest.raises(LayoutError, match=r"map\[1\]"):
        cache.digest(((0, 1), (1, 0, 2)))
    with pytest.raises(LayoutError):
        cache.digest(((0, 1), ("x", 0)))
    assert cache.digest(((0, 1), (1, 0))) == layout_digest([[0, 1], [1, 0]])


def test_digest_depends_on_shape_not_only_values() -> None:
    # Same values, different shape: a 1x4 map is not a 2x2 map.
    assert layout_digest([[0, 1, 1, 0]]) != layout_digest([[0, 1], [1, 0]])


@settings(deadline=None)
@given(maps())
def test_digest_stable_and_matches_reference(case: tuple[list[list[int]], int]) -> None:
    rows, num_logical = case
    record = LayoutRecord.initial(rows, num_logical)
    assert record.digest == layout_digest(rows) == layout_digest([list(r) for r in rows])
    assert record.digest == _reference_digest(rows)
    assert record.rows == tuple(tuple(r) for r in rows)


@settings(deadline=None)
@given(maps(), maps())
def test_different_maps_have_different_digests(a: tuple, b: tuple) -> None:
    rows_a, rows_b = a[0], b[0]
    assert (layout_digest(rows_a) == layout_digest(rows_b)) == (rows_a == rows_b)


@settings(max_examples=200, deadline=None)
@given(maps())
def test_record_round_trips_through_the_wire(case: tuple[list[list[int]], int]) -> None:
    rows, num_logical = case
    record = LayoutRecord.build(rows, num_logical, version=7)
    again = LayoutRecord.from_wire(record.to_wire(include_map=True))
    assert again == record and again.digest == record.digest and again.version == 7


@pytest.mark.parametrize(
    ("rows", "num_logical", "needle"),
    [
        ([], 4, "no layers"),
        ([[]], 4, "row length"),
        ([[0, 1], [0]], 4, "map[1]: 1 slots, the layout has 2 physical slots"),
        ([[0, 4]], 4, "map[0][1]: 4 is not an expert id in 0..3"),
        ([[0, -1]], 4, "map[0][1]: -1 is not an expert id in 0..3"),
        ([[0, "1"]], 4, "map[0][1]: expected an int, got str"),
        ([[0, 1.0]], 4, "map[0][1]: expected an int, got float"),
        ([[0, 2**63]], 4, "map[0]: a value does not fit in int64"),
        ([[0, 1], "01"], 4, "map[1]: expected a row of ints, got str"),
        ("01", 4, "expected a list of rows"),
        ([[0, 1]], 0, "num_logical"),
    ],
)
def test_construction_validates_shape_and_range(rows: object, num_logical: int, needle: str) -> None:
    with pytest.raises(LayoutError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        LayoutRecord.initial(rows, num_logical)  # type: ignore[arg-type]


def test_with_rows_replaces_layers_and_bumps_version() -> None:
    record = LayoutRecord.initial([[0, 1, 2], [2, 1, 0], [1, 1, 1]], 3)
    moved = record.with_rows([2, 0], [[0, 0, 0], [2, 2, 2]])
    assert moved.version == 1
    assert moved.rows == ((2, 2, 2), (2, 1, 0), (0, 0, 0))
    assert record.version == 0 and record.rows[0] == (0, 1, 2), "records are immutable"
    assert moved.digest == layout_digest(moved.rows)


def test_a_successor_shares_the_layers_it_keeps() -> None:
    """A commit costs the layers it replaces, not the map: the kept layers are the parent's own."""
    record = LayoutRecord.initial([[0, 1, 2], [2, 1, 0], [1, 1, 1]], 3)
    moved = record.with_rows([1], [[0, 0, 0]])
    assert moved.layer_bytes[0] is record.layer_bytes[0] and moved.layer_bytes[2] is record.layer_bytes[2]
    assert moved.layer_bytes[1] == struct.pack("<3q", 0, 0, 0)
    assert moved.map_bytes == record.layer_bytes[0] + moved.layer_bytes[1] + record.layer_bytes[2]


@pytest.mark.parametrize(
    ("layers", "rows", "needle"),
    [
        ([0], [[0, 1]], "rows\\[0\\]: 2 slots"),
        ([0], [[0, 1, 3]], "rows\\[0\\]\\[2\\]: 3 is not an expert id"),
        ([0, 1], [[0, 1, 2]], "1 rows for 2 layers"),
        ([0], "abc", "expected a list"),
        ([0], [[0, 1, 2.0]], "rows\\[0\\]\\[2\\]: expected an int, got float"),
        ([0], [[0, 1, 2**63]], "rows\\[0\\]: a value does not fit in int64"),
        ([0], [[0, 1, -1]], "rows\\[0\\]\\[2\\]: -1 is not an expert id"),
        ([5], [[0, 1, 2]], "layers: 5 is not in 0..1"),
    ],
)
def test_with_rows_rejects_bad_rows(layers: list[int], rows: object, needle: str) -> None:
    record = LayoutRecord.initial([[0, 1, 2], [2, 1, 0]], 3)
    with pytest.raises(LayoutError, match=needle):
        record.with_rows(layers, rows)  # type: ignore[arg-type]


def test_from_wire_rejects_a_digest_that_does_not_match() -> None:
    wire = LayoutRecord.initial([[0, 1]], 2).to_wire()
    wire["map"] = [[1, 0]]
    with pytest.raises(LayoutError, match="digest"):
        LayoutRecord.from_wire(wire)


def test_record_is_compact() -> None:
    # DeepSeek-V3 scale: 61 layers x 288 physical slots, 8 bytes a slot.
    rows = [[i % 256 for i in range(288)] for _ in range(61)]
    record = LayoutRecord.initial(rows, 256)
    assert len(record.map_bytes) == 61 * 288 * 8


# Values a row may hold, valid or not: expert ids in and out of range, a bool, a float, a string,
# an int beyond int64; and rows of the right width, of another one, or not rows at all.
_values = st.one_of(
    st.integers(-2, 13), st.booleans(), st.just(1.0), st.just("1"), st.just(2**63), st.integers(-(2**70), 2**70)
)


@st.composite
def rows_of_any_kind(draw: st.DrawFn, num_physical: int) -> object:
    width = draw(st.sampled_from([num_physical, num_physical, num_physical + 1, max(num_physical - 1, 0)]))
    row = draw(st.lists(_values, min_size=width, max_size=width))
    return draw(st.sampled_from([row, tuple(row), array("q", [0] * width), "0" * width, 7]))


@settings(max_examples=300, deadline=None)
@given(maps(), st.data())
def test_every_path_into_a_record_applies_the_same_rule_to_a_row(
    case: tuple[list[list[int]], int], data: st.DataObject
) -> None:
    """A whole map (``build``, ``from_wire``'s way in), a commit's rows (``with_rows``) and a digest
    (``layout_digest``, ``DigestCache``) accept and refuse the same rows, and agree on what they accept."""
    rows, num_logical = case
    record = LayoutRecord.initial(rows, num_logical)
    layer = data.draw(st.integers(0, len(rows) - 1))
    row = data.draw(rows_of_any_kind(len(rows[0])))
    # A whole map takes its width from its first row: only a commit can find that row of the wrong width.
    assume(layer > 0 or not isinstance(row, (list, tuple, array)) or len(row) == len(rows[0]))
    new_map = [*rows[:layer], row, *rows[layer + 1 :]]
    try:
        built = LayoutRecord.build(new_map, num_logical, record.version + 1)
    except LayoutError as error:
        built_error = str(error)
    else:
        built_error = None
    moved = record.successor([layer], [row])
    if built_error is None:
        assert moved == built and moved.digest == built.digest == layout_digest(built.rows)
        assert LayoutRecord.from_wire(built.to_wire()) == built
    else:
        assert isinstance(moved, LayoutError)
        # The same problem, named in the map or in the commit's rows.
        assert str(moved).replace("rows[0]", f"map[{layer}]", 1) == built_error
    # A digest is taken of any map of int64 values: the range of expert ids is not its rule.
    try:
        digest = layout_digest(new_map)
    except LayoutError:
        digest = None
    cache = DigestCache()
    cache.digest(rows)
    try:
        cached = cache.digest(new_map)
    except LayoutError:
        cached = None
    if cached != digest:  # the cache's documented exception: a row of values == the ones it holds is that row
        same_values = isinstance(row, (list, tuple, array)) and list(row) == list(rows[layer])
        assert digest is None and same_values and cached == layout_digest(rows)


def test_a_bool_is_the_expert_id_it_equals() -> None:
    """``struct`` packs a bool as 0 or 1: every path takes it as that id (the digest hashes the id)."""
    record = LayoutRecord.initial([[0, True]], 2)
    assert record == LayoutRecord.initial([[0, 1]], 2) and record.rows == ((0, 1),)
    assert record.with_rows([0], [[True, False]]).rows == ((1, 0),)


def test_more_than_256_experts_are_range_checked_too() -> None:
    record = LayoutRecord.initial([[0, 299]], 300)
    assert record.with_rows([0], [[299, 256]]).rows == ((299, 256),)
    with pytest.raises(LayoutError, match=r"rows\[0\]\[1\]: 300 is not an expert id in 0..299"):
        record.with_rows([0], [[0, 300]])
    with pytest.raises(LayoutError, match=r"map\[0\]\[0\]: -1 is not an expert id in 0..299"):
        LayoutRecord.initial([[-1, 0]], 300)


def test_a_row_with_a_buffer_is_checked_by_its_values() -> None:
    # bytes(array) would read the array's memory (8 bytes a value), not its values.
    record = LayoutRecord.initial([[0, 1, 2]], 3)
    assert record.with_rows([0], [array("q", [2, 1, 0])]).rows == ((2, 1, 0),)
    with pytest.raises(LayoutError, match=r"rows\[0\]\[2\]: 3 is not an expert id"):
        record.with_rows([0], [array("q", [0, 1, 3])])


def _with_rows_or_error(record: LayoutRecord, layers: object, rows: object) -> LayoutRecord | str:
    try:
        return record.with_rows(layers, rows)  # type: ignore[arg-type]
    except LayoutError as error:
        return str(error)


@settings(max_examples=300, deadline=None)
@given(maps(max_layers=3, max_physical=3), st.data())
def test_successor_answers_what_with_rows_answers_whatever_was_asked_before(
    case: tuple[list[list[int]], int], data: st.DataObject
) -> None:
    """``successor`` keeps its last answer: asked again with the same, equal, changed or mutated rows
    (tuples or lists), it must still answer what ``with_rows`` answers for them now."""
    rows, num_logical = case
    record = LayoutRecord.initial(rows, num_logical)
    pool: list[tuple[object, object]] = []
    for _ in range(6):
        if pool and data.draw(st.booleans()):
            layers, asked = data.draw(st.sampled_from(pool))  # the same objects again
            if isinstance(asked, list) and asked and data.draw(st.booleans()):
                asked[0][0] = data.draw(st.integers(-1, num_logical))  # mutated in place since
        else:
            layers = [data.draw(st.integers(0, len(rows)))]
            row = data.draw(st.lists(st.integers(-1, num_logical), min_size=len(rows[0]), max_size=len(rows[0])))
            as_tuples = data.draw(st.booleans())
            asked = ((*row,),) if as_tuples else [row]
            layers = tuple(layers) if as_tuples else layers
            if data.draw(st.booleans()):  # an equal copy, not the same object
                asked = ((*row,),) if as_tuples else [list(row)]
            pool.append((layers, asked))
        answer = record.successor(layers, asked)  # type: ignore[arg-type]
        expected = _with_rows_or_error(record, layers, asked)
        assert (str(answer) if isinstance(answer, LayoutError) else answer) == expected


def test_successor_is_asked_once_for_a_parsed_commit() -> None:
    """The commit's guard, refusal and step ask ``successor`` of the same parsed request: checked once."""
    record = LayoutRecord.initial([[0, 1, 2]], 3)
    layers, rows = (0,), ((2, 1, 0),)
    first = record.successor(layers, rows)
    assert record.successor(layers, rows) is first
    error = record.successor(layers, ((0, 1, 5),))
    assert isinstance(error, LayoutError) and "rows[0][2]: 5 is not an expert id" in str(error)


@pytest.mark.parametrize("lengths", [(16, 8), (16,), (8, 16), (24, 16)])
def test_a_record_refuses_layer_bytes_that_do_not_match_its_shape(lengths: tuple[int, ...]) -> None:
    with pytest.raises(LayoutError, match="lengths do not match the shape"):
        LayoutRecord(2, 2, 2, 0, tuple(b"\0" * n for n in lengths))
