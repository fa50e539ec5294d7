"""TLC's outputs loaded into one behaviour format, and edge-covering suites derived from state graphs.

A `Behaviour` is an initial state and a list of `Step`s; each step is an `Action` (the spec
action's name and its parameter values) and the full state after it. States are `Record`s
of the spec's variables, with values decoded by `layout_model.values`. Every TLC output
loads into this one format:

- `load_dot_graph` / `StateGraph`: the state-graph dump (`-dump dot,actionlabels`): node
  labels are states as TLA+ text, edge labels are actions such as `Attach(e1)`, initial
  states are the nodes drawn `style = filled`. `StateGraph.edge_cover()` derives behaviours
  that cover every edge; `StateGraph.behaviour(path)` turns a path into a behaviour.
- `load_json_trace`: the `-dumpTrace json` counterexample (`action` triples with `name`,
  `context`, `parameters`).
- `load_simulate_trace` / `load_tla_trace`: `-simulate num=..,file=..` trace modules (and
  TLC's stdout error trace): `STATE_i == /\\ var = value ...` preceded by
  `\\* <Action(args) line .. of module M>`.

Suites (`Suite`: edge-covering behaviours with TLC's text of the states they visit and the
actions TLC lists out of each) are written and read as JSON, one per model under
`tests/model_based/traces/<Model>/`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layout_model import dot
from layout_model.compare import canonical_state
from layout_model.values import (
    Record,
    Value,
    decode_json,
    decode_state_text,
    decode_text,
    model_values_from_cfg,
    render,
)

__all__ = [
    "SUITE_FORMAT",
    "Action",
    "Behaviour",
    "Edge",
    "StateGraph",
    "Step",
    "Suite",
    "TlcFormatError",
    "file_sha256",
    "load_dot_graph",
    "load_dumptrace_tla",
    "load_json_trace",
    "load_simulate_trace",
    "load_tla_trace",
    "parse_dot",
]

SUITE_FORMAT = "layout-model-suite/v2"


class TlcFormatError(ValueError):
    """A TLC output file that does not have the expected shape (names the file and the place)."""


@dataclass(frozen=True)
class Action:
    """A spec action and its parameter values: `Attach(e1)` is `Action("Attach", (ModelValue("e1"),))`."""

    name: str
    args: tuple[Value, ...] = ()

    @property
    def label(self) -> str:
        return self.name + ("(" + ", ".join(render(a) for a in self.args) + ")" if self.args else "")

    @classmethod
    def parse(cls, label: str) -> Action:
        """Read an action label as TLC prints it: `Name` or `Name(v1, v2, ...)` with TLA+ values."""
        m = re.fullmatch(r"\s*([A-Za-z_][\w!]*)\s*(?:\((.*)\))?\s*", label, flags=re.S)
        if not m:
            raise TlcFormatError(f"not an action label: {label!r}")
        name, args = m.group(1), m.group(2)
        if args is None or not args.strip():
            return cls(name)
        # the arguments are TLA+ values separated by commas: read them as one tuple
        return cls(name, tuple(decode_text("<<" + args + ">>")))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Step:
    action: Action
    state: Record


@dataclass(frozen=True)
class Behaviour:
    """An initial state and the steps taken from it (each step: action, full state after it)."""

    init: Record
    steps: tuple[Step, ...]
    name: str = ""
    source: str = ""

    @property
    def states(self) -> list[Record]:
        return [self.init, *(s.state for s in self.steps)]

    def __len__(self) -> int:
        return len(self.steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "init": _state_json(self.init),
            "steps": [{"action": s.action.label, "state": _state_json(s.state)} for s in self.steps],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any], source: str = "suite") -> Behaviour:
        return cls(
            init=_state_from_json(obj["init"]),
            steps=tuple(Step(Action.parse(s["action"]), _state_from_json(s["state"])) for s in obj["steps"]),
            name=obj.get("name", ""),
            source=source,
        )


def _state_json(state: Record) -> dict[str, str]:
    # states are kept as TLA+ text per variable: exact (no JSON type loss) and readable in a diff
    return {k: render(v) for k, v in state.items()}


def _state_from_json(obj: dict[str, str]) -> Record:
    return Record((k, decode_text(v)) for k, v in obj.items())


# ---------------------------------------------------------------------------------------------
# DOT state graphs (-dump dot,actionlabels)


def _norm(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Edge:
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
        order = sorted(self.initial, key=self._key)
        dist = {n: 0 for n in order}
        queue = deque(order)
        while queue:
            n = queue.popleft()
            for e in self.successors(n):
                if e.dst not in dist:
                    dist[e.dst] = dist[n] + 1
                    queue.append(e.dst)
        return dist

    def edge_cover(self, max_steps: int = 200) -> list[list[Edge]]:
        """Paths from initial states that together take every reachable edge, deterministically.

        For the first untaken edge (by depth of its source, then canonical state order), a path is a shortest path
        to its source and the edge; then it goes on along untaken edges, and where there is none
        out of the current state, along the shortest bridge to the nearest state that has one,
        until `max_steps` (raised for an edge deeper than that) or no untaken edge is reachable.
        Fewer, longer behaviours: each behaviour costs a fresh system when replayed on real daemons.
        """
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


def parse_dot(text: str, source: str = "<dot>") -> StateGraph:
    """Read TLC's `-dump dot,actionlabels` output (or the mirror's, same format).

    The DOT text is read by the project's one DOT loader, `layout_model.dot`; this adds the decoded
    actions, the checks, and the lazily decoded states.
    """
    return _from_raw(dot.parse_dot(text), source)


def load_dot_graph(path: str | Path) -> StateGraph:
    """Load a DOT dump from a file, line by line (gzip when its name ends in `.gz`)."""
    p = Path(path)
    if not p.is_file():
        raise TlcFormatError(f"{p}: no such DOT dump")
    return _from_raw(dot.load_dot(p), str(p))


def _from_raw(raw: dot.StateGraph, source: str) -> StateGraph:
    if not raw.states:
        raise TlcFormatError(f"{source}: no states found (not a TLC DOT dump?)")
    labels: dict[str, Action] = {}
    edges: list[Edge] = []
    for src, dst, label in raw.edges:
        if not label:
            raise TlcFormatError(f"{source}: edge {src} -> {dst} has no action label (dump with actionlabels)")
        if label not in labels:
            labels[label] = Action.parse(label)
        edges.append(Edge(src, labels[label], dst))
    missing = ({e.src for e in edges} | {e.dst for e in edges}) - set(raw.states)
    if missing:
        raise TlcFormatError(f"{source}: edges name states without a label: {sorted(missing)[:5]}")
    initial = sorted(raw.initial)
    if not initial:
        raise TlcFormatError(f"{source}: no initial state (TLC draws them `style = filled`)")
    return StateGraph(raw.states, initial, edges)


# ---------------------------------------------------------------------------------------------
# -dumpTrace json


def load_json_trace(
    path: str | Path,
    *,
    model_values: Iterable[str] | None = None,
    cfg: str | Path | None = None,
    like: Record | Sequence[Record] | None = None,
) -> Behaviour:
    """Load a `-dumpTrace json` counterexample.

    JSON erases types (see `layout_model.values`): give the model values (or the .cfg to read them
    from) and, to restore sets, typed example states `like` (e.g. the states the mirror reaches, or
    the same trace from TLC's stdout). Without examples, arrays decode as sequences.
    """
    p = Path(path)
    obj = json.loads(p.read_text())
    mvs = set(model_values or ())
    if cfg is not None:
        mvs |= model_values_from_cfg(Path(cfg).read_text())
    try:
        ce = obj["counterexample"]
        triples = ce["action"]
        states = ce["state"]
    except (KeyError, TypeError) as exc:
        raise TlcFormatError(f"{p}: not a TLC -dumpTrace json file (no counterexample.action/state)") from exc

    examples = [like] if isinstance(like, Record) else list(like or [])

    def dec(raw: dict[str, Any]) -> Record:
        return decode_json(raw, model_values=mvs, like=examples)  # type: ignore[return-value]

    init = dec(states[0][1])
    steps: list[Step] = []
    for i, triple in enumerate(triples):
        _before, act, after = triple
        params = act.get("parameters") or []
        ctx = act.get("context") or {}
        args = tuple(decode_json(ctx[name], model_values=mvs) for name in params if name in ctx)
        state = dec(after[1])
        if i == 0 and _before[0] != states[0][0]:
            raise TlcFormatError(f"{p}: first action does not start in the first state")
        steps.append(Step(Action(act["name"], args), state))
    return Behaviour(init, tuple(steps), name=p.stem, source="json")


# ---------------------------------------------------------------------------------------------
# -simulate trace modules and TLC's printed error traces

_SIM_STATE = re.compile(
    r"(?:\\\*\s*<(?P<label>[^\n]*)>\s*\n)?\s*STATE_(?P<idx>\d+)\s*==\s*\n(?P<body>.*?)(?=\n\s*\n|\n\\\*|\n=+|\Z)",
    re.S,
)
_OUT_STATE = re.compile(
    r"^State (?P<idx>\d+): <(?P<label>[^\n]*)>\n(?P<body>.*?)(?=\n\s*\n|\nState \d+:|\Z)", re.S | re.M
)
_LOCATION = re.compile(r"\s+line \d+, col \d+ to line \d+, col \d+ of module \S+$")


def _label_action(label: str) -> Action:
    return Action.parse(_LOCATION.sub("", label))


def _trace_from_states(found: list[tuple[int, str, str]], source: str, name: str) -> Behaviour:
    if not found:
        raise TlcFormatError(f"{name}: no states found")
    found.sort(key=lambda t: t[0])
    if [i for i, _, _ in found] != list(range(1, len(found) + 1)):
        raise TlcFormatError(f"{name}: states are not numbered 1..n")
    init = decode_state_text(found[0][2])
    steps = tuple(Step(_label_action(label), decode_state_text(body)) for _, label, body in found[1:])
    return Behaviour(init, steps, name=name, source=source)


def load_simulate_trace(path: str | Path) -> Behaviour:
    """Load a module written by `-simulate file=...` (or `-dumpTrace tla` style STATE_i definitions)."""
    p = Path(path)
    text = p.read_text()
    found = [(int(m["idx"]), m["label"] or "", m["body"]) for m in _SIM_STATE.finditer(text)]
    return _trace_from_states(found, "simulate", p.stem)


def load_dumptrace_tla(path: str | Path) -> Behaviour:
    """Load a `-dumpTrace tla` module (`CounterExample == [action |-> {...}, state |-> {...}]`)."""
    p = Path(path)
    text = p.read_text()
    m = re.search(r"CounterExample\s*==\s*(.*?)\n=+\s*$", text, flags=re.S)
    if not m:
        raise TlcFormatError(f"{p}: no `CounterExample ==` definition")
    ce = decode_text(m.group(1))
    if not isinstance(ce, Record) or "action" not in ce or "state" not in ce:
        raise TlcFormatError(f"{p}: CounterExample is not [action |-> ..., state |-> ...]")
    states = sorted(ce["state"], key=lambda t: t[0])
    triples = sorted(ce["action"], key=lambda t: t[0][0])
    steps: list[Step] = []
    for (_i, _before), act, (_j, after) in triples:
        params = act.get("parameters", ())
        ctx = act.get("context", Record())
        steps.append(Step(Action(act["name"], tuple(ctx[n] for n in params if n in ctx)), after))
    return Behaviour(states[0][1], tuple(steps), name=p.stem, source="dumptrace-tla")


def load_tla_trace(text: str, name: str = "stdout") -> Behaviour:
    """Load the error trace TLC prints on stdout (`State i: <Action(args) line ...>` blocks)."""
    found = [(int(m["idx"]), m["label"], m["body"]) for m in _OUT_STATE.finditer(text)]
    return _trace_from_states(found, "stdout", name)


# ---------------------------------------------------------------------------------------------
# Suites (JSON, committed under tests/model_based/traces/<Model>/)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class Suite:
    """Behaviours that cover a state graph's edges, with TLC's text of every state they visit.

    Stored as JSON (gzip when the name ends in `.gz`): a table of the visited states (the text
    TLC printed, and the labels of every edge TLC lists out of it), and each behaviour as an
    initial state index and `[action label, state index]` steps. States decode lazily (~2 ms
    each), so a test can compare text first and decode only on a difference.
    """

    manifest: dict[str, Any]
    texts: list[str]
    enabled: list[list[str]]
    paths: list[tuple[str, int, list[tuple[str, int]]]]  # (name, init index, [(label, index)])
    _decoded: dict[int, Record] = field(default_factory=dict, repr=False)
    _actions: dict[str, Action] = field(default_factory=dict, repr=False)

    @classmethod
    def from_graph(cls, graph: StateGraph, manifest: dict[str, Any], max_steps: int = 200) -> Suite:
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
        return cls(manifest, texts, enabled, out)

    def state(self, i: int) -> Record:
        if i not in self._decoded:
            self._decoded[i] = decode_state_text(self.texts[i])
        return self._decoded[i]

    def action(self, label: str) -> Action:
        if label not in self._actions:
            self._actions[label] = Action.parse(label)
        return self._actions[label]

    def behaviour(self, k: int) -> Behaviour:
        name, init, steps = self.paths[k]
        return Behaviour(
            self.state(init), tuple(Step(self.action(a), self.state(i)) for a, i in steps), name=name, source="suite"
        )

    def behaviours(self) -> list[Behaviour]:
        return [self.behaviour(k) for k in range(len(self.paths))]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SUITE_FORMAT,
            "manifest": self.manifest,
            "states": [{"state": t, "enabled": en} for t, en in zip(self.texts, self.enabled, strict=True)],
            # (label, index) pairs are written as JSON arrays as they are: no copy into lists
            "behaviours": [{"name": n, "init": i, "steps": st} for n, i, st in self.paths],
        }

    def write(self, path: str | Path) -> None:
        """Write the suite as JSON, gzip when the name ends in `.gz`, encoded and compressed in pieces.

        MCFull's suite is ~110 MB of JSON: json.dumps with an indent builds it from millions of small
        strings at once (~1 GB); here at most ~1 MB of text is held.
        """
        p = Path(path)
        encoder = json.JSONEncoder(indent=0, separators=(",", ":"))
        with p.open("wb") as raw:
            # mtime=0 and no file name in the header: the same suite gives the same bytes
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if p.name.endswith(".gz") else raw
            try:
                pending: list[str] = []
                size = 0
                for chunk in encoder.iterencode(self.to_json()):
                    pending.append(chunk)
                    size += len(chunk)
                    if size >= 1 << 20:
                        out.write("".join(pending).encode())
                        pending, size = [], 0
                pending.append("\n")
                out.write("".join(pending).encode())
            finally:
                if out is not raw:
                    out.close()

    @classmethod
    def load(cls, path: str | Path) -> Suite:
        p = Path(path)
        raw = p.read_bytes()
        doc = json.loads(gzip.decompress(raw) if p.name.endswith(".gz") else raw)
        if doc.get("format") != SUITE_FORMAT:
            raise TlcFormatError(f"{p}: format is {doc.get('format')!r}, expected {SUITE_FORMAT!r}")
        return cls(
            doc["manifest"],
            [s["state"] for s in doc["states"]],
            [s["enabled"] for s in doc["states"]],
            [(b["name"], b["init"], [(a, i) for a, i in b["steps"]]) for b in doc["behaviours"]],
        )


def _path_from_root(parent: dict[int, Edge | None], node: int) -> list[Edge]:
    """The edges from the search's root to ``node``, following a breadth-first parent map."""
    path: list[Edge] = []
    edge = parent[node]
    while edge is not None:
        path.append(edge)
        edge = parent[edge.src]
    path.reverse()
    return path
