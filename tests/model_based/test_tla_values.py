"""The TLA+ value decoder: TLC's text rendering and TLC's JSON into Python values."""

from __future__ import annotations

import json

import pytest
from tools.mirror.values import (
    Fn,
    Interval,
    ModelValue,
    Record,
    ValueError_,
    decode_json,
    decode_state_text,
    decode_text,
    json_matches,
    model_values_from_cfg,
    tlc_text,
)

E1, E2, NONE = ModelValue("e1"), ModelValue("e2"), ModelValue("NONE")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("42", 42),
        ("-3", -3),
        ("TRUE", True),
        ("FALSE", False),
        ('"attach"', "attach"),
        ('"a \\"q\\" b\\\\c\\n"', 'a "q" b\\c\n'),
        ("e1", E1),
        ("NONE", NONE),
        ("{}", frozenset()),
        ("{e1, e2}", frozenset({E1, E2})),
        ("{2, 1, 2}", frozenset({1, 2})),
        ("1..3", frozenset({1, 2, 3})),
        ("<<>>", ()),
        ("<<0, -1, <<e1>>>>", (0, -1, (E1,))),
        ("[version |-> 0, dirty |-> FALSE]", Record(version=0, dirty=False)),
        (
            "[ version |-> 0,\n  pending |-> [eng |-> e1, layers |-> {1}],\n  dirty |-> FALSE ]",
            Record(version=0, pending=Record(eng=E1, layers=frozenset({1})), dirty=False),
        ),
        # functions with :> and @@: any domain, canonicalised as TLA+ equality demands
        ("(e1 :> 1 @@ e2 :> -2)", Fn({E1: 1, E2: -2})),
        ('(e1 :> {} @@ e2 :> {<<1, "x">>})', Fn({E1: frozenset(), E2: frozenset({(1, "x")})})),
        ('(1 :> "a" @@ 2 :> "b")', ("a", "b")),  # domain 1..n: a sequence
        ('(2 :> "b" @@ 1 :> "a")', ("a", "b")),
        ("(1 :> 5 @@ 3 :> 6)", Fn({1: 5, 3: 6})),  # not 1..n: stays a function
        ('("a" :> 1 @@ "b" :> TRUE)', Record(a=1, b=True)),  # string domain: a record
        ("(e1 :> 1 @@ e1 :> 2)", Fn({E1: 1})),  # @@ keeps the left value
        ("[d1 |-> (e1 :> [v |-> 1])]", Record(d1=Fn({E1: Record(v=1)}))),
    ],
)
def test_decode_text(text: str, value: object) -> None:
    got = decode_text(text)
    assert got == value
    assert type(got) is type(value)


def test_types_are_distinct() -> None:
    # a model value is not the string of its name; a set is not the sequence of its elements
    assert decode_text("e1") != decode_text('"e1"')
    assert decode_text("{1, 2}") != decode_text("<<1, 2>>")
    assert decode_text("<<1, 2>>") != decode_text("<<2, 1>>")
    assert decode_text("{1, 2}") == decode_text("{2, 1}")
    assert decode_text("[a |-> 1, b |-> 2]") == decode_text("[b |-> 2, a |-> 1]")
    assert hash(decode_text("[a |-> {e1}]")) == hash(decode_text("[a |-> {e1}]"))


@pytest.mark.parametrize("bad", ["{1,", "[a |-> ]", "x + 1", "\\A x \\in S : x", ""])
def test_decode_text_rejects_non_values(bad: str) -> None:
    with pytest.raises(ValueError_):
        decode_text(bad)


def test_decode_state_text() -> None:
    text = "\n".join(
        [
            "/\\ attached = {e1}",
            "/\\ rec = [version |-> 0, rows |-> <<0, 0>>, pending |-> NONE]",
            '/\\ log = <<"a">>',
        ]
    )
    st = decode_state_text(text)
    assert st == Record(attached=frozenset({E1}), rec=Record(version=0, rows=(0, 0), pending=NONE), log=("a",))
    assert decode_state_text("x = 1") == Record(x=1)
    with pytest.raises(ValueError_):
        decode_state_text("/\\ x = 1\n/\\ y")


@pytest.mark.parametrize(
    "text",
    [
        '[a |-> {e1, e2}, b |-> <<1, -2>>, c |-> "s\\"q", d |-> TRUE]',
        "(e1 :> {1} @@ e2 :> {})",
        "{<<1, e1>>, <<2, e2>>}",
        "<<>>",
        "{[x |-> 1], [x |-> 2]}",
    ],
)
def test_tlc_text_round_trips(text: str) -> None:
    v = decode_text(text)
    assert decode_text(tlc_text(v)) == v


def test_json_without_hints_reads_arrays_as_sequences() -> None:
    raw = json.loads('{"attached": ["e1"], "rec": {"pending": "NONE", "rows": [0, 0], "dirty": false}}')
    assert decode_json(raw) == Record(attached=("e1",), rec=Record(pending="NONE", rows=(0, 0), dirty=False))
    assert decode_json(raw, model_values={"e1", "NONE"}) == Record(
        attached=(E1,), rec=Record(pending=NONE, rows=(0, 0), dirty=False)
    )


def test_json_with_typed_examples_restores_sets_and_model_values() -> None:
    raw = json.loads('{"attached": ["e2", "e1"], "pending": {"eng": "e1", "layers": [1]}, "log": ["attach"]}')
    examples = [
        decode_state_text("/\\ attached = {} /\\ pending = NONE /\\ log = <<>>"),
        decode_state_text('/\\ attached = {e1} /\\ pending = [eng |-> e1, layers |-> {2}] /\\ log = <<"x">>'),
    ]
    assert decode_json(raw, like=examples) == Record(
        attached=frozenset({E1, E2}), pending=Record(eng=E1, layers=frozenset({1})), log=("attach",)
    )


def test_json_functions_with_non_string_keys() -> None:
    assert decode_json({"1": "a", "2": "b"}) == ("a", "b")
    assert decode_json({"e1": 3}, model_values={"e1"}) == Fn({E1: 3})
    assert decode_json({"e1": [1]}, like=Fn({E1: frozenset({2})}), model_values={"e1"}) == Fn({E1: frozenset({1})})


def test_json_matches_is_equality_modulo_json_erasure() -> None:
    v = decode_text('[attached |-> {e1, e2}, rows |-> <<0, 1>>, s |-> "x", f |-> (e1 :> 1 @@ e2 :> 2)]')
    assert json_matches(v, {"attached": ["e2", "e1"], "rows": [0, 1], "s": "x", "f": {"e1": 1, "e2": 2}})
    assert not json_matches(v, {"attached": ["e2", "e1"], "rows": [1, 0], "s": "x", "f": {"e1": 1, "e2": 2}})
    assert not json_matches(v, {"attached": ["e1"], "rows": [0, 1], "s": "x", "f": {"e1": 1, "e2": 2}})
    assert not json_matches(v, {"attached": ["e2", "e1"], "rows": [0, 1], "s": "x", "f": {"e1": 1}})
    assert not json_matches(v, {"attached": ["e2", "e1"], "rows": [0, 1], "s": "x"})
    assert not json_matches(True, 1)
    assert not json_matches(1, True)


def test_model_values_from_cfg() -> None:
    cfg = "CONSTANTS Engines = {e1, e2}\n          NONE = NONE\n          N = 3\n \\* Other = {o}\nINIT Init\n"
    assert model_values_from_cfg(cfg) == {"e1", "e2", "NONE"}


def test_an_interval_is_its_set_and_prints_as_tlc_keeps_it() -> None:
    # TLC prints `Layers` taken whole as `1..2` and the same set built element by element as `{1, 2}`.
    assert Interval(1, 2) == frozenset({1, 2}) and hash(Interval(1, 2)) == hash(frozenset({1, 2}))
    assert tlc_text(Interval(1, 2)) == "1..2" and tlc_text(frozenset({1, 2})) == "{1, 2}"
    assert decode_text("1..2") == Interval(1, 2)
