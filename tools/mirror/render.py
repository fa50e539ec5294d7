"""TLC's layout of printed values and states: the pretty printer, the variable order, the text key.

Why: the mirror's state graph must be comparable with TLC's own ``-dump dot,actionlabels``
graph, and a reviewer must be able to read both the same way. The values themselves and their
one-line text are ``tools.mirror.values`` (``tlc_text``); this module lays that text out as TLC
does, and reads it back.

TLC's printing rules followed here:

- Each variable's text goes through TLC's pretty printer (``tlc2.pprint``, width 80): a value
  longer than the available width is broken over lines, ``[ f |-> v,\\n  g |-> w ]``,
  ``{ a,\\n  b }``, ``<< a,\\n   b >>``, ``( k :> v @@\\n  l :> w )``. If TLC's little parser of
  printed values fails (for example on an identifier with ``_``), TLC prints the one-line text;
  ``pretty`` does the same.
- A state is ``/\\ var = value`` lines, one per variable, in the order TLC keeps the variables:
  not the declaration order but the order in which SANY's symbol table (a ``java.util.Hashtable``
  keyed by the names, ``String.hashCode``) enumerates them, reversed (``sany_variable_order``).
  That order depends on how many symbols the root module's context holds (the table's capacity),
  which only a parse of the whole spec tells: ``fit_variable_order`` finds the capacity from a
  state TLC printed, and ``render_state(..., order=...)`` prints in that order.

Reading back: ``one_line`` undoes the layout, and ``canonical_text``/``canonical_state`` give a
printed value or state a text key that is equal iff the values are equal. Graphs are compared on
that key, not on decoded values: for MCSmall's 7,051 states it takes 0.27 s of CPU, decoding them
(``values.decode_state_text``) 1.7 s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from tools.mirror.values import tlc_text

__all__ = [
    "canonical_state",
    "canonical_text",
    "fit_variable_order",
    "one_line",
    "pretty",
    "render_state",
    "reorder_state",
    "sany_variable_order",
    "state_vars",
]

WIDTH = 80


# -- TLC's pretty printer (tlc2.pprint), re-implemented -----------------------------------

_CONST, _SET, _SEQ, _REC, _PAIR, _FUN, _FPAIR = range(7)


class _ParseFail(Exception):
    pass


class _Node:
    __slots__ = ("first", "kids", "kind", "last")

    def __init__(self, kind: int, first: int, last: int = 0) -> None:
        self.kind = kind
        self.first = first
        self.last = last
        self.kids: list[_Node] = []

    def length(self) -> int:
        return self.last - self.first + 1


class _Parser:
    """Reads TLC's one-line value text back into a tree of positions, as TLC's own does."""

    def __init__(self, s: str, strict: bool = True) -> None:
        self.s = s
        # strict: TLC's own quirks (an identifier is letters and digits only); not strict: any
        # TLA+ identifier, for canonical forms.
        self.word = str.isalnum if strict else (lambda c: c.isalnum() or c == "_")

    def ch(self, i: int) -> str:
        if i >= len(self.s):
            raise _ParseFail("ran off the end")
        return self.s[i]

    def ws(self, i: int) -> int:
        while self.ch(i).isspace():
            i += 1
        return i

    def parse(self, i: int) -> _Node:
        i = self.ws(i)
        c = self.ch(i)
        if c == "{":
            return self._list(i, _SET, 1, "}", 0)
        if c == "<":
            return self._list(i, _SEQ, 2, ">", 1)
        if c == "[":
            return self._pairs(i, _REC, "|->", ",", "]")
        if c == "(":
            return self._pairs(i, _FUN, ":>", "@@", ")")
        if self.s.startswith("SUBSET", i):
            raise _ParseFail("SUBSET values are not used by the spec")
        return self._const(i)

    def _list(self, i: int, kind: int, skip: int, close: str, extra: int) -> _Node:
        node = _Node(kind, i)
        j = self.ws(i + skip)
        while self.ch(j) != close:
            elt = self.parse(j)
            node.kids.append(elt)
            j = self.ws(elt.last + 1)
            if self.ch(j) == ",":
                j += 1
            j = self.ws(j)
        node.last = j + extra
        return node

    def _pairs(self, i: int, kind: int, div: str, sep: str, close: str) -> _Node:
        node = _Node(kind, i)
        j = self.ws(i + 1)
        while self.ch(j) != close:
            pair = _Node(_PAIR if kind == _REC else _FPAIR, j)
            key = self.parse(j)
            k = self.ws(key.last + 1)
            if not self.s.startswith(div, k):
                raise _ParseFail(f"no {div}")
            val = self.parse(self.ws(k + len(div)))
            pair.kids = [key, val]
            pair.last = val.last
            node.kids.append(pair)
            j = self.ws(pair.last + 1)
            if self.s.startswith(sep, j):
                j += len(sep)
            j = self.ws(j)
        node.last = j
        return node

    def _const(self, i: int) -> _Node:
        s = self.s
        first = self.ws(i)
        last = first
        c = self.ch(first)
        if c == '"':
            last += 1
            while self.ch(last) != '"':
                last += 1
            return _Node(_CONST, first, last)
        if c.isdigit():
            j = first
            while j < len(s) and s[j].isdigit():
                j += 1
            if s.startswith("..", j) and j + 2 < len(s) and s[j + 2].isdigit():
                j += 2
                while j < len(s) and s[j].isdigit():
                    j += 1
                return _Node(_CONST, first, j - 1)
        if c == "-":
            last += 1
            while last < len(s) and s[last].isdigit():
                last += 1
            return _Node(_CONST, first, last - 1)
        if self.word(c):
            while last < len(s) and self.word(s[last]):
                last += 1
            return _Node(_CONST, first, last - 1)
        raise _ParseFail(f"illegal character {c!r}")


_SIMPLE = {_SET: ("{ ", " }", "  ", ","), _SEQ: ("<< ", " >>", "   ", ",")}
_PAIRED = {_FUN: ("( ", " )", "  ", " @@", " :>", "    "), _REC: ("[ ", " ]", "  ", ",", " |->", "    ")}


def _fmt(s: str, node: _Node, width: int, trailer: int, pad: str) -> str:
    text = s[node.first : node.last + 1]
    if node.length() <= width - trailer or node.kind == _CONST:
        return text
    if node.kind in _SIMPLE:
        open_, close, npad, sep = _SIMPLE[node.kind]
        inner_w = width - max(len(open_), len(npad))
        inner_pad = pad + npad
        parts = []
        kids = node.kids
        for idx, kid in enumerate(kids):
            if idx < len(kids) - 1:
                parts.append(_fmt(s, kid, inner_w, len(sep), inner_pad) + sep + "\n" + inner_pad)
            else:
                parts.append(_fmt(s, kid, inner_w, trailer + len(close), inner_pad))
        return open_ + "".join(parts) + close
    open_, close, npad, sep, div, divpad = _PAIRED[node.kind]
    w = width - max(len(open_), len(npad))
    tr = trailer + len(close)
    lp = pad + npad
    out = []
    kids = node.kids
    for idx, pair in enumerate(kids):
        arg, val = pair.kids
        a = s[arg.first : arg.last + 1]
        v = s[val.first : val.last + 1]
        # the last pair is followed by the close (its trailer), every other one by sep and a new line
        last = idx == len(kids) - 1
        after_val = tr if last else len(sep)
        end = "" if last else sep + "\n" + lp
        if arg.length() + len(div) + 1 + val.length() + after_val <= w:
            out.append(a + div + " " + v + end)
        else:
            head = a if arg.length() + len(div) <= w else _fmt(s, arg, w, tr + len(div), lp)
            out.append(head + div + "\n" + lp + divpad + _fmt(s, val, w - len(divpad), after_val, lp + divpad) + end)
    return open_ + "".join(out) + close


def pretty(text: str, width: int = WIDTH) -> str:
    """TLC's ``Values.ppr``: the one-line ``text`` broken over lines to fit ``width``."""
    if len(text) <= width:
        return text
    try:
        tree = _Parser(text).parse(0)
        if tree.last < len(text) - 1:
            return text
        return _fmt(text, tree, width, 0, "")
    except (_ParseFail, IndexError):
        return text


def render_state(
    values: Sequence[tuple[str, Any]], text_of: Callable[[Any], str] = tlc_text, order: Sequence[str] | None = None
) -> str:
    """A state as TLC prints it: ``/\\ var = value`` lines (no trailing newline).

    ``order``: the variables in TLC's print order (``sany_variable_order``); default: as given.
    """
    if order is not None:
        by_name = dict(values)
        if set(by_name) != set(order) or len(by_name) != len(values):
            raise ValueError(f"the print order {list(order)} names other variables than {[n for n, _ in values]}")
        values = [(name, by_name[name]) for name in order]
    if len(values) == 1:
        name, v = values[0]
        return f"{name} = {pretty(text_of(v))}"
    return "\n".join(f"/\\ {name} = {pretty(text_of(v))}" for name, v in values)


def reorder_state(text: str, order: Sequence[str]) -> str:
    """A printed state (``/\\ var = value`` lines) with its variables in ``order`` (TLC's, say)."""
    chunks = text.split("\n/\\ ")
    if len(chunks) != len(order) or not chunks[0].startswith("/\\ "):
        raise ValueError(f"not a state of the variables {list(order)}: {text[:200]!r}")
    chunks[0] = chunks[0][3:]
    by_name = {chunk.partition(" = ")[0]: chunk for chunk in chunks}
    try:
        return "\n".join("/\\ " + by_name[name] for name in order)
    except KeyError as exc:
        raise ValueError(f"the state has no variable {exc} (it has {sorted(by_name)})") from None


# -- the order in which TLC prints the variables --------------------------------------------
#
# TLCStateMut.toString prints the variables in the order of its `vars` array, which SpecProcessor
# takes from ModuleNode.getVariableDecls(): the root module's Context.getVariableDecls() reversed.
# That one enumerates Context.table, a java.util.Hashtable<UniqueString, Pair>, and
# UniqueString.hashCode() is String.hashCode() of the name. A Hashtable starts with 11 buckets and
# grows to 2n+1 when its count reaches 3/4 of n; a new entry goes to the head of its bucket's chain;
# a rehash walks the old buckets from last to first and each chain from its head, putting each entry
# at the head of its new chain; elements() walks the buckets from last to first, each chain from its
# head. The other symbols of the context (operators, constants, the standard modules' definitions)
# change only how large the table grows, not the variables' order among themselves.

HASHTABLE_INITIAL_CAPACITY = 11  # java.util.Hashtable()
HASHTABLE_MAX_CAPACITY = 1_572_863  # far beyond any spec's symbol count (11 grown 17 times)


def java_string_hash(s: str) -> int:
    """``String.hashCode()``: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, as a 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def hashtable_capacities(limit: int = HASHTABLE_MAX_CAPACITY) -> list[int]:
    """The capacities a default ``java.util.Hashtable`` passes through: 11, 23, 47, 95, ..."""
    out = [HASHTABLE_INITIAL_CAPACITY]
    while out[-1] * 2 + 1 <= limit:
        out.append(out[-1] * 2 + 1)
    return out


def _bucket(name: str, capacity: int) -> int:
    return (java_string_hash(name) & 0x7FFFFFFF) % capacity


def sany_variable_order(declared: Sequence[str], capacity: int, inserted_at: int | None = None) -> tuple[str, ...]:
    """The order TLC prints variables in, for a root-module symbol table that ends at ``capacity``.

    The variables enter the table in declaration order while it has ``inserted_at`` buckets
    (default: ``capacity``, no rehash after them); the table then grows to ``capacity``. Variables
    in distinct buckets come out by bucket number; only those that share a bucket depend on
    ``inserted_at``.
    """
    cap = capacity if inserted_at is None else inserted_at
    if cap not in hashtable_capacities() or capacity not in hashtable_capacities() or cap > capacity:
        raise ValueError(f"not the capacities of a growing java.util.Hashtable: {cap} then {capacity}")
    chains: dict[int, list[str]] = {}
    for name in declared:
        chains.setdefault(_bucket(name, cap), []).insert(0, name)
    while cap < capacity:
        new_cap = cap * 2 + 1
        grown: dict[int, list[str]] = {}
        for i in sorted(chains, reverse=True):
            for name in chains[i]:
                grown.setdefault(_bucket(name, new_cap), []).insert(0, name)
        chains, cap = grown, new_cap
    enumerated = [name for i in sorted(chains, reverse=True) for name in chains[i]]
    return tuple(reversed(enumerated))


def fit_variable_order(declared: Sequence[str], printed: Sequence[str]) -> tuple[int, int] | None:
    """(capacity, inserted_at) for which ``sany_variable_order`` gives ``printed``, or None.

    The smallest capacity that fits, and for it the largest ``inserted_at`` (the fewest rehashes).
    """
    if sorted(declared) != sorted(printed):
        return None
    caps = hashtable_capacities()
    for capacity in caps:
        for inserted_at in reversed([c for c in caps if c <= capacity]):
            if sany_variable_order(declared, capacity, inserted_at) == tuple(printed):
                return capacity, inserted_at
    return None


_BREAK = re.compile(r"\n *")


def one_line(text: str) -> str:
    """Undo TLC's pretty printing: the one-line ``toString`` text of a printed value.

    A line break is always preceded by ``,``, `` @@``, `` |->`` or `` :>`` and followed by
    padding; opening and closing delimiters get one inner space. (The spec's strings hold
    neither line breaks nor escaped quotes.)
    """
    s = _BREAK.sub(" ", text)
    for a, b in _UNPAD:
        if a in s:
            s = _replace_outside_strings(s, a, b)
    return s


_UNPAD = (
    ("{ ", "{"), (" }", "}"), ("<< >>", "\0"), ("<< ", "<<"), (" >>", ">>"), ("( ", "("),
    (" )", ")"), ("[ ", "["), (" ]", "]"), ("\0", "<< >>"),
)  # fmt: skip


def _replace_outside_strings(s: str, old: str, new: str) -> str:
    parts = s.split('"')
    # even indexes are outside string literals (the spec's strings hold no escaped quotes)
    return '"'.join(p.replace(old, new) if i % 2 == 0 else p for i, p in enumerate(parts))


def state_vars(text: str) -> dict[str, str]:
    """Split a printed state into ``{variable: value text}``."""
    if not text.startswith("/\\ "):
        name, _, value = text.partition(" = ")
        return {name.strip(): value}
    out: dict[str, str] = {}
    for chunk in text.split("\n/\\ "):
        chunk = chunk[3:] if chunk.startswith("/\\ ") else chunk
        name, _, value = chunk.partition(" = ")
        out[name.strip()] = value
    return out


def canonical_state(text: str) -> str:
    """One printed state's text key: variables sorted by name, each value's ``canonical_text``."""
    return "\n".join(f"{k}={canonical_text(v)}" for k, v in sorted(state_vars(text).items()))


# TLC prints a set that is an interval value (``1..NumLayers``) as ``a..b``, the same set as ``{a, ..., b}``.
_INTERVAL = re.compile(r"(?<![\w.])(\d+)\.\.(\d+)(?![\w.])")


def _interval_as_set(m: re.Match[str]) -> str:
    return "{" + ", ".join(str(i) for i in range(int(m.group(1)), int(m.group(2)) + 1)) + "}"


@lru_cache(maxsize=100_000)
def canonical_text(text: str) -> str:
    """A printed value in canonical form: equal iff the values are equal.

    Layout whitespace is dropped, and the parts whose order carries no meaning are sorted:
    set elements, record fields, function pairs (TLC orders them by intern order, which
    depends on the TLC version and on the files it parsed first). Text that does not parse
    as a value falls back to whitespace removal.
    """
    flat = _INTERVAL.sub(_interval_as_set, one_line(text))
    try:
        parser = _Parser(flat, strict=False)
        tree = parser.parse(0)
        if tree.last < len(flat.rstrip()) - 1:
            raise _ParseFail("trailing text")
        return _canon(flat, tree)
    except (_ParseFail, IndexError):
        parts = text.split('"')
        return '"'.join("".join(p.split()) if i % 2 == 0 else p for i, p in enumerate(parts))


def _canon(s: str, node: _Node) -> str:
    if node.kind == _CONST:
        return s[node.first : node.last + 1]
    if node.kind == _SET:
        return "{" + ",".join(sorted(_canon(s, k) for k in node.kids)) + "}"
    if node.kind == _SEQ:
        return "<<" + ",".join(_canon(s, k) for k in node.kids) + ">>"
    if node.kind == _REC:
        pairs = sorted(_canon(s, p.kids[0]) + "|->" + _canon(s, p.kids[1]) for p in node.kids)
        return "[" + ",".join(pairs) + "]"
    pairs = sorted(_canon(s, p.kids[0]) + ":>" + _canon(s, p.kids[1]) for p in node.kids)
    return "(" + "@@".join(pairs) + ")"
