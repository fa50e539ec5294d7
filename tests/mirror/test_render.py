"""``tools.mirror.values.tlc_text`` and ``tools.mirror.render`` print values as TLC does (checked against TLC's own
sample dump)."""

from __future__ import annotations

from pathlib import Path

from tools.mirror.dot import load_dot
from tools.mirror.render import canonical_text, one_line, pretty, state_vars
from tools.mirror.values import Fn, ModelValue, Record, decode_text, tlc_intern_order, tlc_text

SAMPLES = Path(__file__).resolve().parents[1] / "model_based" / "fixtures" / "tlc-samples"


def test_pretty_printer_reproduces_every_value_of_tlcs_dump() -> None:
    g = load_dot(SAMPLES / "toy_full_graph.dot")
    assert len(g.texts) == 26 and len(g.initial) == 1
    multi_line = 0
    for text in g.texts.values():
        for value in state_vars(text).values():
            assert pretty(one_line(value)) == value
            multi_line += "\n" in value
    assert multi_line > 0  # the sample exercises the line breaking


def test_record_broken_like_tlc() -> None:
    tlc_intern_order(["e1", "e2", "NONE"])
    rec = Record(version=0, rows=(0, 0), pending=Record(eng=ModelValue("e1"), layers=frozenset({1})), dirty=False)
    one_line_text = "[version |-> 0, rows |-> <<0, 0>>, pending |-> [eng |-> e1, layers |-> {1}], dirty |-> FALSE]"
    assert tlc_text(rec) == one_line_text
    assert pretty(tlc_text(rec)) == (
        "[ version |-> 0,\n  rows |-> <<0, 0>>,\n  pending |-> [eng |-> e1, layers |-> {1}],\n  dirty |-> FALSE ]"
    )


def test_values_in_tlc_order_and_syntax() -> None:
    tlc_intern_order(["e3", "e1", "e2", "NONE"])
    assert tlc_text(frozenset({ModelValue("e1"), ModelValue("e3")})) == "{e3, e1}"  # intern order, not names
    tlc_intern_order(["e1", "e2", "e3", "NONE"])
    assert tlc_text(frozenset({ModelValue("e3"), ModelValue("e1")})) == "{e1, e3}"
    assert tlc_text(frozenset({3, 1, 2})) == "{1, 2, 3}"
    assert tlc_text(frozenset()) == "{}"
    assert tlc_text(()) == "<<>>"
    assert tlc_text(Fn(((ModelValue("e2"), "x"), (ModelValue("e1"), TRUE_)))) == '(e1 :> TRUE @@ e2 :> "x")'
    assert tlc_text(Fn(())) == "<< >>"


TRUE_ = True


def test_canonical_ignores_layout_only() -> None:
    a = '[ step |-> "a b",\n  chunk |-> {1, 2} ]'
    assert canonical_text(a) == canonical_text('[step |-> "a b", chunk |-> {1,2}]')
    assert canonical_text(a) != canonical_text('[step |-> "ab", chunk |-> {1, 2}]')


def test_unparsable_values_stay_on_one_line() -> None:
    long = "[" + ", ".join(f"field_{i} |-> {i}" for i in range(12)) + "]"  # '_' stops TLC's parser
    assert pretty(long) == long


def test_canonical_ignores_orders_that_carry_no_meaning() -> None:
    assert canonical_text("[a |-> {e2, e1}, b |-> (e2 :> 1 @@ e1 :> 2)]") == canonical_text(
        "[ b |-> (e1 :> 2 @@ e2 :> 1),\n  a |-> {e1, e2} ]"
    )
    assert canonical_text("<<1, 2>>") != canonical_text("<<2, 1>>")  # sequences keep their order
    assert canonical_text("[a |-> 1]") != canonical_text("[a |-> 2]")
    assert canonical_text("{no_record}") == "{no_record}"  # identifiers with '_' still canonicalise


def test_canonical_text_is_value_equality() -> None:
    """The text key that graphs are compared on says "equal" exactly when the decoded values are equal.

    Every value of TLC's sample dump, and each again with its sets, records and functions printed in
    another order (``tlc_text`` of the decoded value with its record fields reversed, under a reversed
    intern order).
    """
    texts = sorted({v for t in load_dot(SAMPLES / "toy_full_graph.dot").texts.values() for v in state_vars(t).values()})
    values = [decode_text(t) for t in texts]
    names = sorted({x.name for v in values for x in _model_values(v)}, reverse=True)
    tlc_intern_order(names)
    reprinted = [tlc_text(_fields_reversed(v)) for v in values]
    assert reprinted != [one_line(t) for t in texts]  # some order did change
    tlc_intern_order([])
    decoded = values + [decode_text(t) for t in reprinted]
    for a, va in zip(texts + reprinted, decoded, strict=True):
        for b, vb in zip(texts + reprinted, decoded, strict=True):
            assert (canonical_text(a) == canonical_text(b)) == (va == vb), (a, b)
    assert len(set(values)) == len(texts) >= 12


def _fields_reversed(v: object) -> object:
    if isinstance(v, Record):
        return Record((k, _fields_reversed(w)) for k, w in reversed(v.items()))
    if isinstance(v, Fn):
        return Fn((k, _fields_reversed(w)) for k, w in v.items())
    if isinstance(v, tuple):
        return tuple(_fields_reversed(w) for w in v)
    if isinstance(v, frozenset):
        return frozenset(_fields_reversed(w) for w in v)
    return v


def _model_values(v: object) -> list[ModelValue]:
    if isinstance(v, ModelValue):
        return [v]
    if isinstance(v, Record | Fn):
        return [x for k, w in v.items() for x in _model_values(k) + _model_values(w)]
    if isinstance(v, tuple | frozenset):
        return [x for w in v for x in _model_values(w)]
    return []
