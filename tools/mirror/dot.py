"""The one loader of TLC's state-graph dumps (``-dump dot,actionlabels``).

Used by ``tools.mirror.compare``, the suites of ``tests/model_based`` and their replay, so that all
read TLC's graphs (and the mirror's, written in the same format) into one ``StateGraph``.

API::

    g = load_dot(path)            # or parse_dot(text); a path ending in .gz is read as gzip
    g = parse_dot_lines(lines)    # any iterable of lines: a file is read line by line
    g.texts:   dict[int, str]     # node id (a TLC fingerprint) -> the state as TLA+ text:
                                  #   "/\\ var = value" lines joined by "\\n", exactly as printed
    g.initial: list[int]          # ids of the initial states (drawn ``style = filled``), sorted
    g.edges:   list[Edge]         # Edge(from id, Action such as Attach(e1, 1), to id), in file order
    g.state(id) -> Record         # the state decoded (``tools.mirror.values``), lazily
    g.successors(id) -> list[Edge]
    g.edge_cover() / g.behaviours()   # edge-covering paths, as ``tlc_formats.Behaviour``s

Format facts (from ../shared/tlc-samples/toy_full_graph.dot and TLC's DotStateWriter):
a node line is ``ID [label="...",style = filled]`` for an initial state and
``ID [label="...",tooltip="..."];`` for the others (written when first reached); an edge is
``A -> B [label="Name(args)",color="black",fontcolor="black"];``. In labels ``\\\\`` is a
backslash, ``\\"`` a quote and ``\\n`` a line break.
"""

from __future__ import annotations

import gzip
import hashlib
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from tools.mirror.render import canonical_state
from tools.mirror.tlc_formats import Action, Behaviour, Step, Suite, TlcFormatError
from tools.mirror.values import Record, decode_state_text

__all__ = [
    "Edge",
    "StateGraph",
    "load_dot",
    "open_dot",
    "parse_dot",
    "parse_dot_lines",
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


def fingerprint(text: str) -> int:
    """A signed 64-bit id for a rendered state (stands in for TLC's fingerprint)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


class Edge(NamedTuple):
    """One edge of a state graph: from state ``src``, the spec action ``action``, to state ``dst``.

    A named tuple, not a dataclass: MCFull's graph has 147,889 edges, built and hashed in C.
    """

    src: int
    action: Action
    dst: int


@dataclass
class StateGraph:
    """A state graph as TLC dumps it: node id -> state text, initial ids, labelled edges.

    States are decoded lazily (`state(id)`): decoding costs ~2 ms a state, and a suite needs
    only the states on its paths.
    """

    texts: dict[int, str]
    initial: list[int]
    edges: list[Edge]
    _decoded: dict[int, Record] = field(default_factory=dict, repr=False)

    def state(self, node: int) -> Record:
        if node not in self._decoded:
            self._decoded[node] = decode_state_text(self.texts[node])
        return self._decoded[node]

    def successors(self, node: int) -> list[Edge]:
        return self._out().get(node, [])

    def _out(self) -> dict[int, list[Edge]]:
        if not hasattr(self, "_out_cache"):
            out: dict[int, list[Edge]] = {}
            for e in self._ordered_edges():
                out.setdefault(e.src, []).append(e)
            self._out_cache = out
        return self._out_cache

    def _key(self, node: int) -> int:
        return self._ranks()[node]

    def _ranks(self) -> dict[int, int]:
        """Each node's place in the order of the states' canonical texts (`compare.canonical_state`).

        Node ids are TLC fingerprints (or the mirror's own ids), and TLC prints the variables in
        its own order: ordering by the canonical text (variables sorted by name, values without
        layout, unordered parts sorted) gives the same suite for the same graph, whoever dumped it
        and in whatever line order. Ranks, not the texts, are kept: MCFull has 40,194 states.
        """
        if not hasattr(self, "_rank_cache"):
            keys = sorted((canonical_state(text), node) for node, text in self.texts.items())
            self._rank_cache = {node: i for i, (_, node) in enumerate(keys)}
        return self._rank_cache

    def _ordered_edges(self) -> list[Edge]:
        rank = self._ranks()
        return sorted(self.edges, key=lambda e: (rank[e.src], e.action.label, rank[e.dst]))

    def depths(self) -> dict[int, int]:
        """Breadth-first distance of each reachable node from the initial states."""
        return self._breadth_first()[1]

    def _breadth_first(self) -> tuple[dict[int, Edge | None], dict[int, int]]:
        """From the initial states (canonical order): each reachable node's parent edge and distance."""
        order = sorted(self.initial, key=self._key)
        parent: dict[int, Edge | None] = {n: None for n in order}
        dist = {n: 0 for n in order}
        queue = deque(order)
        while queue:
            n = queue.popleft()
            for e in self.successors(n):
                if e.dst not in parent:
                    parent[e.dst] = e
                    dist[e.dst] = dist[n] + 1
                    queue.append(e.dst)
        return parent, dist

    def edge_cover(self, max_steps: int = 200) -> list[list[Edge]]:
        """Paths from initial states that together take every reachable edge, deterministically.

        For the first untaken edge (by depth of its source, then canonical state order), a path is a shortest path
        to its source and the edge; then it goes on along untaken edges, and where there is none
        out of the current state, along the shortest bridge to the nearest state that has one,
        until `max_steps` (raised for an edge deeper than that) or no untaken edge is reachable.
        Fewer, longer behaviours: each behaviour costs a fresh system when replayed on real daemons.
        """
        parent, dist = self._breadth_first()
        reachable = [e for e in self._ordered_edges() if e.src in dist]
        reachable.sort(key=lambda e: dist[e.src])  # stable: keeps the canonical order within a depth
        untaken = dict.fromkeys(reachable)
        remaining: dict[int, int] = {}
        for e in reachable:
            remaining[e.src] = remaining.get(e.src, 0) + 1

        def take(e: Edge) -> None:
            if e in untaken:
                del untaken[e]
                remaining[e.src] -= 1

        paths: list[list[Edge]] = []
        for target in reachable:
            if target not in untaken:
                continue
            path = _path_from_root(parent, target.src)
            path.append(target)
            for e in path:
                take(e)
            cur = target.dst
            limit = max(max_steps, dist[target.src] + 1)
            while len(path) < limit:
                nxt = next((e for e in self.successors(cur) if e in untaken), None)
                if nxt is not None:
                    take(nxt)
                    path.append(nxt)
                    cur = nxt.dst
                    continue
                bridge = self._bridge(cur, remaining, limit - len(path) - 1)
                if not bridge:
                    break
                for e in bridge:
                    take(e)
                path.extend(bridge)
                cur = bridge[-1].dst
            paths.append(path)
        return paths

    def _bridge(self, start: int, remaining: dict[int, int], budget: int) -> list[Edge] | None:
        """Shortest path from `start` to the nearest state with an untaken out-edge (within budget)."""
        if budget <= 0:
            return None
        back: dict[int, Edge | None] = {start: None}
        frontier = [start]
        for _ in range(budget):
            nxt_frontier: list[int] = []
            for n in frontier:
                for e in self.successors(n):
                    if e.dst in back:
                        continue
                    back[e.dst] = e
                    if remaining.get(e.dst, 0) > 0:
                        return _path_from_root(back, e.dst)
                    nxt_frontier.append(e.dst)
            if not nxt_frontier:
                return None
            frontier = nxt_frontier
        return None

    def behaviour(self, path: Sequence[Edge], name: str = "") -> Behaviour:
        if not path:
            raise TlcFormatError("an empty path has no initial state")
        steps = tuple(Step(e.action, self.state(e.dst)) for e in path)
        return Behaviour(self.state(path[0].src), steps, name=name, source="dot")

    def behaviours(self, max_steps: int = 200, prefix: str = "b") -> list[Behaviour]:
        paths = self.edge_cover(max_steps)
        width = len(str(len(paths)))
        return [self.behaviour(p, f"{prefix}{i:0{width}d}") for i, p in enumerate(paths)]

    def enabled_labels(self, node: int) -> frozenset[str]:
        """The actions TLC lists as successors of a node (labels; a self-loop counts too)."""
        return frozenset(e.action.label for e in self.successors(node))

    def suite(self, manifest: dict[str, Any], max_steps: int = 200) -> Suite:
        """Behaviours that cover this graph's edges, with the text of every state they visit."""
        graph = self
        paths = graph.edge_cover(max_steps)
        index: dict[int, int] = {}
        texts: list[str] = []
        enabled: list[list[str]] = []

        def idx(node: int) -> int:
            if node not in index:
                index[node] = len(texts)
                texts.append(graph.texts[node])
                enabled.append(sorted({e.action.label for e in graph.successors(node)}))
            return index[node]

        width = len(str(len(paths)))
        out = [
            (f"b{i:0{width}d}", idx(p[0].src), [(e.action.label, idx(e.dst)) for e in p]) for i, p in enumerate(paths)
        ]
        reachable = graph.depths()
        manifest = {
            **manifest,
            "graph_states": len(graph.texts),
            "graph_edges": len(graph.edges),
            "edges_covered": len({e for p in paths for e in p}),
            "reachable_edges": sum(1 for e in graph.edges if e.src in reachable),
            "behaviours": len(out),
            "steps": sum(len(p) for p in paths),
            "suite_states": len(texts),
            "max_steps": max_steps,
        }
        return Suite(manifest, texts, enabled, out)


def parse_dot(text: str, source: str = "<dot>") -> StateGraph:
    """Parse the text of a TLC DOT dump."""
    return parse_dot_lines(text.splitlines(), source=source)


def parse_dot_lines(lines: Iterable[str], edges: bool = True, source: str = "<dot>") -> StateGraph:
    """Parse a TLC DOT dump line by line (MCFull's is 119 MB: never held whole in memory).

    Only the label of a node is kept (TLC repeats it as the tooltip), and equal edge labels share one
    ``Action``. ``edges=False``: the states only (edge lines skipped unparsed). A dump without states,
    without an initial state, with an unlabelled edge or with an edge to an unknown state is refused
    (``TlcFormatError``, naming ``source``).
    """
    states: dict[int, str] = {}
    initial: set[int] = set()
    edge_list: list[Edge] = []
    edge_labels: dict[str, Action] = {}
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
                        raise TlcFormatError(
                            f"{source}: edge {m.group(1)} -> {m.group(2)} has no action label (dump with actionlabels)"
                        )
                    action = edge_labels.get(raw)
                    if action is None:
                        action = edge_labels[raw] = Action.parse(unescape(raw).split("\n")[0])
                    edge_list.append(Edge(int(m.group(1)), action, int(m.group(2))))
                    continue
        node = _node(line)
        if node is not None:
            sid, label, initial_state = node
            states[sid] = unescape(label)
            if initial_state:
                initial.add(sid)
    if not states:
        raise TlcFormatError(f"{source}: no states found (not a TLC DOT dump?)")
    missing = ({e.src for e in edge_list} | {e.dst for e in edge_list}) - states.keys()
    if missing:
        raise TlcFormatError(f"{source}: edges name states without a label: {sorted(missing)[:5]}")
    if not initial:
        raise TlcFormatError(f"{source}: no initial state (TLC draws them `style = filled`)")
    return StateGraph(states, sorted(initial), edge_list)


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
    """Load a DOT dump written by TLC or by ``tools.mirror.explore`` (gzip when named ``*.gz``)."""
    p = Path(path)
    if not p.is_file():
        raise TlcFormatError(f"{p}: no such DOT dump")
    with open_dot(p) as f:
        return parse_dot_lines(f, edges, source=str(p))


def _path_from_root(parent: dict[int, Edge | None], node: int) -> list[Edge]:
    """The edges from the search's root to ``node``, following a breadth-first parent map."""
    path: list[Edge] = []
    edge = parent[node]
    while edge is not None:
        path.append(edge)
        edge = parent[edge.src]
    path.reverse()
    return path
