"""The one loader of TLC's state-graph dumps (``-dump dot,actionlabels``).

Used by ``layout_model.compare`` and by the trace replay of ``tests/model_based`` (issue 6),
so that both read TLC's graphs (and the mirror's, written in the same format) the same way.

API::

    g = load_dot(path)            # or parse_dot(text); a path ending in .gz is read as gzip
    g = parse_dot_lines(lines)    # any iterable of lines: a file is read line by line
    g.states:  dict[int, str]     # node id (a TLC fingerprint) -> the state as TLA+ text:
                                  #   "/\\ var = value" lines joined by "\\n", exactly as printed
    g.initial: set[int]           # ids of the initial states (drawn ``style = filled``)
    g.edges:   list[tuple[int, int, str]]   # (from id, to id, action label such as
                                            #  "Attach(e1, 1)"), in file order
    g.successors(id) -> list[tuple[str, int]]
    split_label("Attach(e1, 1)") -> ("Attach", ["e1", "1"])
    state_vars(text) -> dict[str, str]   # variable -> its value text (pretty layout kept)

Format facts (from ../shared/tlc-samples/toy_full_graph.dot and TLC's DotStateWriter):
a node line is ``ID [label="...",style = filled]`` for an initial state and
``ID [label="...",tooltip="..."];`` for the others (written when first reached); an edge is
``A -> B [label="Name(args)",color="black",fontcolor="black"];``. In labels ``\\\\`` is a
backslash, ``\\"`` a quote and ``\\n`` a line break.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

__all__ = [
    "StateGraph",
    "load_dot",
    "open_dot",
    "parse_dot",
    "parse_dot_lines",
    "split_label",
    "state_vars",
    "unescape",
]

# `[^"\\]+` takes a run of plain characters at once: a state's label is ~1.5 kB (MCFull has 40,194)
_NODE = re.compile(r'^(-?\d+) \[label="((?:[^"\\]+|\\.)*)"')
_EDGE = re.compile(r'^(-?\d+) -> (-?\d+)(?: \[label="((?:[^"\\]+|\\.)*)"[^\]]*\])?;?\s*$')
_EDGE_START = re.compile(r"^-?\d+ -> -?\d+")


_ESCAPED = re.compile(r"\\(.)", re.S)


def unescape(s: str) -> str:
    """Decode a DOT label as TLC escapes it.

    TLC's DotStateWriter escapes only a backslash, a quote and a line break; those three are undone
    by plain replacements (fast); any other escape falls back to dropping the backslash.
    """
    if "\\" not in s:
        return s
    if "\0" not in s:
        plain = s.replace("\\\\", "\0").replace('\\"', '"').replace("\\n", "\n")
        if "\\" not in plain:
            return plain.replace("\0", "\\")
    return _ESCAPED.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), s)


def escape(s: str) -> str:
    """Encode a label as TLC's DotStateWriter does."""
    return s.replace("\\", "\\\\").replace('"', '\\"').strip().replace("\n", "\\n")


@dataclass
class StateGraph:
    """States by id, initial ids, and labelled edges of one dumped graph."""

    states: dict[int, str] = field(default_factory=dict)
    initial: set[int] = field(default_factory=set)
    edges: list[tuple[int, int, str]] = field(default_factory=list)

    def successors(self, sid: int) -> list[tuple[str, int]]:
        return [(label, b) for a, b, label in self.edges if a == sid]


def parse_dot(text: str) -> StateGraph:
    """Parse the text of a TLC DOT dump."""
    return parse_dot_lines(text.splitlines())


def parse_dot_lines(lines: Iterable[str], edges: bool = True) -> StateGraph:
    """Parse a TLC DOT dump line by line (MCFull's is 119 MB: never held whole in memory).

    Only the label of a node is kept (TLC repeats it as the tooltip), and equal edge labels share one
    string object. ``edges=False``: the states only (edge lines skipped unparsed).
    """
    g = StateGraph()
    states, edge_list, initial = g.states, g.edges, g.initial
    edge_labels: dict[str, str] = {}
    for line in lines:
        if " -> " in line:
            if not edges:
                if _EDGE_START.match(line):
                    continue
            else:
                m = _EDGE.match(line)
                if m:
                    raw = m.group(3)
                    if raw is None:
                        label = ""
                    elif raw in edge_labels:
                        label = edge_labels[raw]
                    else:
                        label = edge_labels[raw] = unescape(raw).split("\n")[0]
                    edge_list.append((int(m.group(1)), int(m.group(2)), label))
                    continue
        node = _node(line)
        if node is not None:
            sid, label, initial_state = node
            states[sid] = unescape(label)
            if initial_state:
                initial.add(sid)
    return g


_INITIAL_END = '",style = filled]'
_NODE_END = '",tooltip="'


def _node(line: str) -> tuple[int, str, bool] | None:
    """(id, escaped label, initial?) of a node line, or None.

    TLC ends a label with `",style = filled]` (initial) or `",tooltip="`: found with `str.find`, much
    faster than a regex over a label full of escapes; an escaped quote before either (a state whose
    string holds that text) sends the line to the regex.
    """
    head = line.find(' [label="')
    if head <= 0:
        return None
    start = head + 9
    for end_mark, initial_state in ((_NODE_END, False), (_INITIAL_END, True)):
        end = line.find(end_mark, start)
        if end != -1 and line[end - 1] != "\\":
            try:
                return int(line[:head]), line[start:end], initial_state
            except ValueError:
                return None
    m = _NODE.match(line)
    if not m:
        return None
    return int(m.group(1)), m.group(2), line.startswith(",style = filled]", m.end())


def open_dot(path: str | Path) -> TextIO:
    """Open a DOT dump for reading as text, unpacking it on the fly when its name ends in ``.gz``."""
    p = Path(path)
    if p.name.endswith(".gz"):
        return gzip.open(p, "rt", encoding="utf-8")
    return p.open(encoding="utf-8")


def load_dot(path: str | Path, edges: bool = True) -> StateGraph:
    """Load a DOT dump written by TLC or by ``layout_model.explore`` (gzip when named ``*.gz``)."""
    with open_dot(path) as f:
        return parse_dot_lines(f, edges)


_LABEL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_!]*)\s*(?:\((.*)\))?\s*$", re.S)


def split_label(label: str) -> tuple[str, list[str]]:
    """``"Attach(e1, 1)"`` -> ``("Attach", ["e1", "1"])``; arguments split at top-level commas."""
    m = _LABEL.match(label)
    if not m:
        return label.strip(), []
    name, inner = m.group(1), m.group(2)
    if inner is None or not inner.strip():
        return name, []
    args, depth, cur, in_str = [], 0, [], False
    for c in inner:
        if c == '"':
            in_str = not in_str
        elif not in_str and c in "{[(<":
            depth += 1
        elif not in_str and c in "}])>":
            depth -= 1
        if c == "," and depth == 0 and not in_str:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    args.append("".join(cur).strip())
    return name, args


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
