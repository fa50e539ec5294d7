"""``layout_model.render`` prints values as TLC does (checked against TLC's own sample dump)."""

from __future__ import annotations

from pathlib import Path

import pytest

from layout_model.dot import load_dot, state_vars
from layout_model.render import MV, Fn, Rec, canonical, one_line, pretty, tla, tlc_key

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "tlc-samples"


@pytest.mark.skipif(not (SAMPLES / "toy_full_graph.dot").exists(), reason="../shared/tlc-samples absent")
def test_pretty_printer_reproduces_every_value_of_tlcs_dump() -> None:
    g = load_dot(SAMPLES / "toy_full_graph.dot")
    assert len(g.states) == 26 and len(g.initial) == 1
    multi_line = 0
    for text in g.states.values():
        for value in state_vars(text).values():
            assert pretty(one_line(value)) == value
            multi_line += "\n" in value
    assert multi_line > 0  # the sample exercises the line breaking


def test_record_broken_like_tlc() -> None:
    tlc_key(["e1", "e2", "NONE"])
    rec = Rec(
        (
            ("version", 0),
            ("rows", (0, 0)),
            ("pending", Rec((("eng", MV("e1")), ("layers", frozenset({1}))))),
            ("dirty", False),
        )
    )
    assert tla(rec) == "[version |-> 0, rows |-> <<0, 0>>, pending |-> [eng |-> e1, layers |-> {1}], dirty |-> FALSE]"
    assert pretty(tla(rec)) == (
        "[ version |-> 0,\n  rows |-> <<0, 0>>,\n  pending |-> [eng |-> e1, layers |-> {1}],\n  dirty |-> FALSE ]"
    )


def test_values_in_tlc_order_and_syntax() -> None:
    tlc_key(["e1", "e2", "e3", "NONE"])
    assert tla(frozenset({MV("e3"), MV("e1")})) == "{e1, e3}"
    assert tla(frozenset({3, 1, 2})) == "{1, 2, 3}"
    assert tla(frozenset()) == "{}"
    assert tla(()) == "<<>>"
    assert tla(Fn(((MV("e2"), "x"), (MV("e1"), TRUE_)))) == '(e1 :> TRUE @@ e2 :> "x")'
    assert tla(Fn(())) == "<< >>"


TRUE_ = True


def test_canonical_ignores_layout_only() -> None:
    a = '[ step |-> "a b",\n  chunk |-> {1, 2} ]'
    assert canonical(a) == canonical('[step |-> "a b", chunk |-> {1,2}]')
    assert canonical(a) != canonical('[step |-> "ab", chunk |-> {1, 2}]')


def test_unparsable_values_stay_on_one_line() -> None:
    long = "[" + ", ".join(f"field_{i} |-> {i}" for i in range(12)) + "]"  # '_' stops TLC's parser
    assert pretty(long) == long


def test_canonical_ignores_orders_that_carry_no_meaning() -> None:
    assert canonical("[a |-> {e2, e1}, b |-> (e2 :> 1 @@ e1 :> 2)]") == canonical(
        "[ b |-> (e1 :> 2 @@ e2 :> 1),\n  a |-> {e1, e2} ]"
    )
    assert canonical("<<1, 2>>") != canonical("<<2, 1>>")  # sequences keep their order
    assert canonical("[a |-> 1]") != canonical("[a |-> 2]")
    assert canonical("{no_record}") == "{no_record}"  # identifiers with '_' still canonicalise
