"""The project's one vocabulary of TLA+ values: the classes, TLC's printer, and the decoders.

The mirror (`tools.mirror.system`) builds its states from these classes, `tlc_text` prints them
as TLC does (the renderer and the mirror's DOT graphs), and TLC's outputs decode into them: TLA+
text (state graphs, `-simulate` trace modules, stdout, `-dumpTrace tla`) and JSON (`-dumpTrace
json`). So a state from any TLC output compares with `==` against any other and against the
mirror's:

| TLA+ value                                   | Python value                            |
| -------------------------------------------- | --------------------------------------- |
| `TRUE`, `FALSE`                              | `bool`                                  |
| `3`, `-2`                                    | `int`                                   |
| `"text"`                                     | `str`                                   |
| model value `e1`, `NONE`                     | `ModelValue("e1")`                      |
| set `{...}`, interval `a..b`                 | `frozenset`                             |
| sequence / tuple `<<...>>`                   | `tuple`                                 |
| record `[f |-> v, ...]`                      | `Record` (hashable mapping, str keys)   |
| function `(k :> v @@ ...)` (other domains)   | `Fn` (hashable mapping)                 |

TLA+ equality is the classes' equality: records and functions compare as mappings (the order of
their fields or pairs carries no meaning), and `function_value` builds the one value of a
function: a function whose domain is `1..n` *is* a sequence (TLC prints it as `<<...>>`), and a
function whose domain is a non-empty set of strings *is* a record, so `("a" :> 1)` decodes to
`Record(a=1)` and `(1 :> "x" @@ 2 :> "y")` to `("x", "y")`.

TLA+ text is parsed by the PyPI `tla` package (`tla.parse_expr`); this module only maps its
syntax tree to values. It takes about 2 ms for a few hundred characters: fine for test suites,
not for 10^6 states (a whole graph is compared on its text: `render.canonical_state`).

TLC's JSON loses type information: sets and sequences both become arrays, strings and model
values both become strings, records and functions both become objects. `decode_json` can
restore the types from a typed example (`like`, e.g. the same state decoded from text or
rendered by the mirror) and from the names of the model values (`model_values`, see
`model_values_from_cfg`); without them an array decodes to a tuple and a string to `str`.
`json_matches(value, obj)` compares a typed value with raw JSON modulo exactly that loss.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Collection, ItemsView, Iterable, Iterator, KeysView, Mapping, Sequence, ValuesView
from functools import lru_cache
from typing import Any, ClassVar, TypeAlias

import tla

__all__ = [
    "Fn",
    "Interval",
    "ModelValue",
    "Record",
    "Value",
    "ValueError_",
    "decode_json",
    "decode_state_text",
    "decode_text",
    "function_value",
    "json_matches",
    "model_values_from_cfg",
    "tlc_intern_order",
    "tlc_sort_key",
    "tlc_text",
]


class ValueError_(ValueError):
    """A text or JSON value that this decoder cannot read (names the offending text)."""


class Interval(frozenset):  # type: ignore[type-arg]
    """A set of consecutive integers that TLC holds as an interval and prints ``lo..hi``: the spec's
    ``Layers`` taken whole. Equal to (and hashed as) the frozenset of its elements, as TLC's values are."""

    def __new__(cls, lo: int, hi: int) -> Interval:
        return super().__new__(cls, range(lo, hi + 1))


class ModelValue:
    """A TLC model value (an uninterpreted constant such as `e1` or `NONE`).

    One object per name: equality and hashing are identity (done in C), because the mirror hashes
    every state it reaches, and most of its functions are keyed by engines.
    """

    __slots__ = ("name",)
    _interned: ClassVar[dict[str, ModelValue]] = {}
    name: str

    def __new__(cls, name: str) -> ModelValue:
        mv = cls._interned.get(name)
        if mv is None:
            mv = super().__new__(cls)
            object.__setattr__(mv, "name", name)
            cls._interned[name] = mv
        return mv

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"a ModelValue is immutable (set {key} on {self!r})")

    def __reduce__(self) -> tuple[type[ModelValue], tuple[str]]:
        return (ModelValue, (self.name,))

    def __lt__(self, other: ModelValue) -> bool:
        if not isinstance(other, ModelValue):
            return NotImplemented
        return self.name < other.name

    def __repr__(self) -> str:
        return f"ModelValue({self.name!r})"


class _FrozenMapping(Mapping[Any, Any]):
    """A hashable, immutable mapping; equality ignores insertion order."""

    __slots__ = ("_d", "_h")

    def __init__(self, items: Mapping[Any, Any] | Iterable[tuple[Any, Any]] = ()) -> None:
        self._d: dict[Any, Any] = dict(items)
        self._h: int | None = None

    def __getitem__(self, key: Any) -> Any:
        return self._d[key]

    # the dict's own views and lookups: the mirror reads its states' records millions of times,
    # and Mapping's generic ones go through __getitem__ for every key
    def items(self) -> ItemsView[Any, Any]:
        return self._d.items()

    def keys(self) -> KeysView[Any]:
        return self._d.keys()

    def values(self) -> ValuesView[Any]:
        return self._d.values()

    def get(self, key: Any, default: Any = None) -> Any:
        return self._d.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __iter__(self) -> Iterator[Any]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        h = self._h
        if h is None:
            # the type in the hash: a record and a function with equal pairs are not equal
            h = self._h = hash((type(self), frozenset(self._d.items())))
        return h

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._d == other._d  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq


class Record(_FrozenMapping):
    """A TLA+ record `[f |-> v, ...]`: a function from field names (str) to values."""

    __slots__ = ()

    def __init__(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), **fields: Any) -> None:
        self._d = dict(items, **fields)
        self._h = None

    def __repr__(self) -> str:
        return "Record(" + ", ".join(f"{k}={v!r}" for k, v in self._d.items()) + ")"


class Fn(_FrozenMapping):
    """A TLA+ function whose domain is neither `1..n` nor a set of strings."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Fn({" + ", ".join(f"{k!r}: {v!r}" for k, v in self._d.items()) + "})"


Value: TypeAlias = bool | int | str | ModelValue | frozenset | tuple | Record | Fn


def function_value(pairs: Collection[tuple[Value, Value]]) -> Value:
    """The TLA+ function with these (key, value) pairs, as the one value TLA+ equality makes it.

    A function on ``1..n`` is the sequence (a tuple), a function on strings is the record, and the
    empty function is ``<<>>``: TLC prints them so, and decoded values must compare with ``==``.
    """
    d = dict(pairs)
    if not d:
        return ()  # TLC prints the empty function as <<>>
    keys = set(d)
    if all(type(k) is int for k in keys) and keys == set(range(1, len(d) + 1)):
        return tuple(d[i] for i in range(1, len(d) + 1))
    if all(type(k) is str for k in keys):
        return Record(d)
    return Fn(d)


# ---------------------------------------------------------------------------------------------
# TLA+ text (through the `tla` package's syntax tree)

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r", "f": "\f"}


def _unquote(lit: str) -> str:
    body = lit[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _parse(text: str) -> Any:
    out = io.StringIO()
    try:
        # the parser prints its stack to stdout on a syntax error: keep that out of test output
        with contextlib.redirect_stdout(out):
            tree = tla.parse_expr(text)
    except Exception as exc:
        raise ValueError_(f"not a TLA+ value (tla.parse_expr failed): {text[:200]!r}") from exc
    if tree is None:
        raise ValueError_(f"not a TLA+ value: {text[:200]!r}")
    return tree


def _fn_pairs(node: Any) -> list[tuple[Value, Value]]:
    """Flatten `k1 :> v1 @@ k2 :> v2 @@ ...` into pairs (`@@` keeps the left value on overlap)."""
    kind = type(node).__name__
    if kind == "Parentheses":
        return _fn_pairs(node.expression)
    if kind == "OperatorApplication" and node.operator == ":>":
        return [(_node(node.arguments[0]), _node(node.arguments[1]))]
    if kind == "OperatorApplication" and node.operator == "@@":
        left, right = _fn_pairs(node.arguments[0]), _fn_pairs(node.arguments[1])
        seen = {k for k, _ in left}
        return left + [(k, v) for k, v in right if k not in seen]
    v = _node(node)
    if isinstance(v, Mapping):
        return list(v.items())
    if isinstance(v, tuple):
        return [(i + 1, x) for i, x in enumerate(v)]
    raise ValueError_(f"not a function in a :>/@@ chain: {v!r}")


def _node(node: Any) -> Value:
    kind = type(node).__name__
    if kind == "IntegralNumeral":
        return int(node.value)
    if kind == "BooleanLiteral":
        return node.value == "TRUE"
    if kind == "StringLiteral":
        return _unquote(node.value)
    if kind == "SetEnumeration":
        return frozenset(_node(x) for x in node.items)
    if kind == "Tuple":
        return tuple(_node(x) for x in node.items)
    if kind == "Record":
        return Record((k, _node(v)) for k, v in node.key_values)
    if kind == "Parentheses":
        return _node(node.expression)
    if kind == "OperatorApplication":
        op, args = node.operator, node.arguments
        if not args:
            return ModelValue(op)  # a bare identifier in a printed value is a model value
        if op == "-" and len(args) == 1:
            v = _node(args[0])
            if type(v) is int:
                return -v
        if op in (":>", "@@"):
            return function_value(_fn_pairs(node))
        if op == ".." and len(args) == 2:
            lo, hi = _node(args[0]), _node(args[1])
            if type(lo) is int and type(hi) is int:
                return frozenset(range(lo, hi + 1))
    raise ValueError_(f"unsupported TLA+ construct in a value: {kind} {getattr(node, 'operator', '')}")


def decode_text(text: str) -> Value:
    """Decode one TLA+ value as TLC prints it (e.g. `[a |-> {e1}, b |-> <<1, "x">>]`)."""
    return _node(_parse(text))


_STATE_LINE = re.compile(r"^/\\ ([A-Za-z_]\w*) = ", re.M)


@lru_cache(maxsize=200_000)
def _decode_cached(text: str) -> Value:
    return decode_text(text)


def decode_state_text(text: str) -> Record:
    """Decode a TLC state, `/\\ var = value` lines (or one `var = value`), into a Record of variables.

    TLC starts each variable's conjunct on a new line with `/\\ `, and a printed value never holds
    a raw line break (strings escape it): each value is decoded on its own and cached by its text.
    States of one graph share most variable values, and the parser's time grows faster than the
    text, so this is many times faster than parsing the whole state (whose parse is the fallback).
    """
    starts = list(_STATE_LINE.finditer(text))
    if starts and starts[0].start() == 0:
        out: dict[str, Value] = {}
        try:
            for m, nxt in zip(starts, [*starts[1:], None], strict=True):
                end = nxt.start() if nxt is not None else len(text)
                out[m.group(1)] = _decode_cached(text[m.end() : end].strip())
            return Record(out)
        except ValueError_:
            pass  # not one value per line after all: parse the state as a whole
    return _decode_whole_state(text)


def _decode_whole_state(text: str) -> Record:
    tree = _parse(text)
    kind = type(tree).__name__
    if kind == "VerticalList":
        conjuncts = [c for item in tree.arguments for c in _flatten_and(item.expression)]
    elif kind == "OperatorApplication" and tree.operator == "/\\":
        conjuncts = _flatten_and(tree)
    else:
        conjuncts = [tree]
    out: dict[str, Value] = {}
    for c in conjuncts:
        if not (type(c).__name__ == "OperatorApplication" and c.operator == "=" and len(c.arguments) == 2):
            raise ValueError_(f"a state conjunct is not `var = value`: {text[:200]!r}")
        var = c.arguments[0]
        if type(var).__name__ != "OperatorApplication" or var.arguments:
            raise ValueError_(f"left side of a state conjunct is not a variable: {text[:200]!r}")
        out[var.operator] = _node(c.arguments[1])
    return Record(out)


def _flatten_and(node: Any) -> list[Any]:
    if type(node).__name__ == "OperatorApplication" and node.operator == "/\\":
        return [x for a in node.arguments for x in _flatten_and(a)]
    return [node]


# ---------------------------------------------------------------------------------------------
# TLC JSON (-dumpTrace json)


def _json_key(key: str, model_values: Collection[str]) -> Value:
    # TLC writes non-string function keys as their JSON text ("1", "\"a\""), model values bare
    try:
        k = json.loads(key)
    except ValueError:
        return ModelValue(key) if key in model_values else key
    return _json(k, model_values, ())


def _children(hints: tuple, pick: Any) -> tuple:
    out: list[Any] = []
    for h in hints:
        with contextlib.suppress(KeyError, IndexError, TypeError, StopIteration):
            out.extend(pick(h))
    return tuple(out)


def _json(obj: Any, model_values: Collection[str], hints: tuple) -> Value:
    # `hints` are typed example values found at the same place in example states: the first one
    # of a compatible kind decides what JSON erased (set or sequence, model value or string)
    if isinstance(obj, bool | int):
        return obj
    if isinstance(obj, str):
        if obj in model_values or any(isinstance(h, ModelValue) and h.name == obj for h in hints):
            return ModelValue(obj)
        # where the examples hold model values and never a string, a string is a model value
        if any(isinstance(h, ModelValue) for h in hints) and not any(isinstance(h, str) for h in hints):
            return ModelValue(obj)
        return obj
    if isinstance(obj, list):
        kind = next((h for h in hints if isinstance(h, frozenset | tuple | Fn | Record)), None)
        if isinstance(kind, frozenset):
            sub = _children(hints, lambda h: list(h) if isinstance(h, frozenset) else [])
            return frozenset(_json(x, model_values, sub) for x in obj)
        if isinstance(kind, Mapping) and not obj:
            return ()  # the empty function is the empty sequence
        return tuple(
            _json(x, model_values, _children(hints, lambda h, i=i: [h[i]] if isinstance(h, tuple) else []))
            for i, x in enumerate(obj)
        )
    if isinstance(obj, dict):
        pairs = [(_json_key(k, model_values), v) for k, v in obj.items()]

        def at(k: Value, kind: type) -> tuple:
            return _children(hints, lambda h: [h[k]] if isinstance(h, kind) else [])

        if all(type(k) is str for k, _ in pairs):
            return Record((k, _json(v, model_values, at(k, Record))) for k, v in pairs)
        return function_value([(k, _json(v, model_values, at(k, Fn))) for k, v in pairs])
    if obj is None:
        raise ValueError_("JSON null is not a TLA+ value")
    raise ValueError_(f"unsupported JSON value: {obj!r}")


def decode_json(obj: Any, *, model_values: Collection[str] = (), like: Value | Sequence[Value] | None = None) -> Value:
    """Decode a TLC JSON value.

    `like` is a typed example of the same shape, or a list of them (e.g. states decoded from text
    or rendered by the mirror): where an example holds a set, the JSON array becomes a set, and
    where it holds a model value the string becomes one. `model_values` names model values.
    """
    hints: tuple = () if like is None else (tuple(like) if isinstance(like, list) else (like,))
    return _json(obj, frozenset(model_values), hints)


def json_matches(value: Value, obj: Any) -> bool:
    """Whether TLC would write `value` as the JSON `obj` (equality modulo what JSON erases)."""
    if isinstance(value, bool) or isinstance(obj, bool):
        return type(value) is bool and type(obj) is bool and value == obj
    if isinstance(value, int):
        return type(obj) is int and value == obj
    if isinstance(value, str):
        return obj == value
    if isinstance(value, ModelValue):
        return obj == value.name
    if isinstance(value, tuple):
        if isinstance(obj, dict) and not value:
            return not obj
        return (
            isinstance(obj, list)
            and len(obj) == len(value)
            and all(json_matches(v, o) for v, o in zip(value, obj, strict=True))
        )
    if isinstance(value, frozenset):
        if not isinstance(obj, list) or len(obj) != len(value):
            return False
        remaining = list(value)
        for o in obj:  # set elements are distinct: match each JSON element to one set element
            hit = next((i for i, v in enumerate(remaining) if json_matches(v, o)), None)
            if hit is None:
                return False
            remaining.pop(hit)
        return True
    if isinstance(value, Record):
        return isinstance(obj, dict) and set(obj) == set(value) and all(json_matches(value[k], obj[k]) for k in value)
    if isinstance(value, Fn):
        if not isinstance(obj, dict) or len(obj) != len(value):
            return False
        for k, o in obj.items():
            key = next((kk for kk in value if json_matches(kk, _loose_key(k))), None)
            if key is None or not json_matches(value[key], o):
                return False
        return True
    return False


def _loose_key(key: str) -> Any:
    try:
        return json.loads(key)
    except ValueError:
        return key


# ---------------------------------------------------------------------------------------------
# Configuration files and rendering


_CFG_ASSIGN = re.compile(r"^\s*(?:CONSTANTS?\s+)?([A-Za-z_]\w*)\s*=\s*(.+?)\s*$")
_IDENT = re.compile(r"^[A-Za-z_]\w*$")


def model_values_from_cfg(cfg_text: str) -> frozenset[str]:
    """Names of the model values a TLC .cfg declares (`C = {a, b}` or `C = C` in a CONSTANTS block)."""
    names: set[str] = set()
    text = re.sub(r"\\\*.*$", "", cfg_text, flags=re.M)
    text = re.sub(r"\(\*.*?\*\)", "", text, flags=re.S)
    for line in text.splitlines():
        m = _CFG_ASSIGN.match(line)
        if not m:
            continue
        rhs = m.group(2)
        is_set = rhs.startswith("{") and rhs.endswith("}")
        items = [x.strip() for x in rhs[1:-1].split(",")] if is_set else [rhs]
        for item in items:
            if _IDENT.match(item) and item not in ("TRUE", "FALSE"):
                names.add(item)
    return frozenset(names)


# Intern order of model values and strings: TLC sorts them by the order in which it first met
# each name, model values of the .cfg first (set by the model: `tlc_intern_order`).
_INTERN_ORDER: dict[str, int] = {}


def tlc_intern_order(names: Iterable[str]) -> None:
    """Tell the printer the intern order of model values and strings (first met, first).

    Names it was not told come after those it was, by name: with no order set, sets of model
    values print sorted by name.
    """
    _INTERN_ORDER.clear()
    for i, name in enumerate(names):
        _INTERN_ORDER.setdefault(name, i)


def tlc_sort_key(v: Value) -> tuple:
    """TLC's order of set elements and function arguments (a total order on values)."""
    if isinstance(v, bool):
        return (0, int(v))
    if isinstance(v, int):
        return (1, v)
    if isinstance(v, ModelValue):
        return (2, _INTERN_ORDER.get(v.name, len(_INTERN_ORDER)), v.name)
    if isinstance(v, str):
        return (3, _INTERN_ORDER.get(v, len(_INTERN_ORDER)), v)
    if isinstance(v, tuple):
        # TLC compares tuples by length first, then element by element.
        return (4, len(v), tuple(tlc_sort_key(x) for x in v))
    if isinstance(v, frozenset):
        return (5, len(v), tuple(sorted(tlc_sort_key(x) for x in v)))
    if isinstance(v, Record):
        return (6, tuple(sorted((k, tlc_sort_key(x)) for k, x in v.items())))
    if isinstance(v, Fn):
        return (7, tuple(sorted((tlc_sort_key(k), tlc_sort_key(x)) for k, x in v.items())))
    raise TypeError(f"not a TLA+ value: {v!r}")


def tlc_text(v: Value) -> str:
    """The one-line text TLC's ``toString`` gives for ``v`` (``render.pretty`` breaks it over lines).

    Sets and function arguments in ``tlc_sort_key`` order; record fields in the order the record
    holds them (TLC's: the spec's declaration order, in which the mirror builds its records).
    """
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, ModelValue):
        return v.name
    if isinstance(v, Interval) and v:
        return f"{min(v)}..{max(v)}"
    if isinstance(v, frozenset):
        return "{" + ", ".join(tlc_text(x) for x in sorted(v, key=tlc_sort_key)) + "}"
    if isinstance(v, tuple):
        return "<<" + ", ".join(tlc_text(x) for x in v) + ">>"
    if isinstance(v, Record):
        return "[" + ", ".join(f"{k} |-> {tlc_text(x)}" for k, x in v.items()) + "]"
    if isinstance(v, Fn):
        if not v:
            return "<< >>"
        keys = sorted(v, key=tlc_sort_key)
        return "(" + " @@ ".join(f"{tlc_text(k)} :> {tlc_text(v[k])}" for k in keys) + ")"
    raise TypeError(f"cannot print {type(v).__name__} {v!r} as TLA+")
