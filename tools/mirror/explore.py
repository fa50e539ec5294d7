"""Breadth-first exploration of the mirror, with the spec's invariants, writing TLC's DOT format.

Why: ``make check-model`` proves, without TLC, that the ``layout_sm`` machines composed as the
spec composes them keep the spec's invariants on the same bounded model; and its DOT dump can
be compared state for state and edge for edge with TLC's (``python -m tools.mirror.compare``).

    python -m tools.mirror.explore MCSmall [MCFull] [--spec-dir spec] [--dot-dir DIR | --dump F.dot] [--quiet]

It prints a progress line every few seconds, then the distinct states, edges, depth and time,
and exits non-zero on an invariant or action-property violation (printing the behaviour that
leads to it, rendered as TLC prints states). Distinct states are distinct values of the spec's
variables (``System.project``), as for TLC; the explorer also checks that the mirror keeps no
hidden state (two mirror states with one projection), which would make the graphs differ.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tools.mirror.dot import escape, fingerprint
from tools.mirror.invariants import ACTION_PROPERTIES, INVARIANTS, Vars
from tools.mirror.system import SysState, System, load_model, render_projection
from tools.mirror.values import tlc_intern_order

__all__ = ["Result", "explore", "fingerprint", "main"]


@dataclass
class Result:
    model: str
    states: int = 0
    edges: int = 0
    depth: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    hidden_state: int = 0  # projections reached with different mirror states

    @property
    def ok(self) -> bool:
        return not self.violations and not self.hidden_state

    def summary(self) -> str:
        verdict = "OK" if self.ok else "VIOLATION"
        return (
            f"{self.model}: {verdict}: {self.states} distinct states, {self.edges} edges, "
            f"depth {self.depth}, {self.seconds:.1f} s"
        )


class _DotWriter:
    """Writes the graph as TLC's DotStateWriter does with ``-dump dot,actionlabels``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.ranks: dict[int, list[int]] = {}
        out.write("strict digraph DiskGraph {\nnode [shape=box,style=rounded]\nnodesep=0.35;\n")
        out.write('subgraph cluster_graph {\ncolor="white";\n')

    def initial(self, sid: int, text: str) -> None:
        self.out.write(f'{sid} [label="{escape(text)}",style = filled]\n')
        self.ranks.setdefault(1, []).append(sid)

    def edge(self, a: int, b: int, label: str, new_text: str | None, level: int) -> None:
        self.out.write(f'{a} -> {b} [label="{escape(label)}",color="black",fontcolor="black"];\n')
        if new_text is not None:
            t = escape(new_text)
            self.out.write(f'{b} [label="{t}",tooltip="{t}"];\n')
            self.ranks.setdefault(level, []).append(b)

    def close(self) -> None:
        for level in sorted(self.ranks):
            self.out.write("{rank = same; " + "".join(f"{sid};" for sid in self.ranks[level]) + "}\n")
        self.out.write("}\n}")


def _trace(parents: dict[int, tuple[int, str] | None], texts: dict[int, str], sid: int) -> str:
    steps = []
    while True:
        parent = parents[sid]
        steps.append((parent[1] if parent else "Initial predicate", texts[sid]))
        if parent is None:
            break
        sid = parent[0]
    lines = []
    for i, (action, text) in enumerate(reversed(steps), 1):
        lines.append(f"State {i}: <{action}>\n{text}\n")
    return "\n".join(lines)


def explore(
    spec_dir: str | Path,
    model_name: str,
    dot_path: str | Path | None = None,
    progress: TextIO | None = sys.stderr,
    every_s: float = 5.0,
    stop_on_violation: bool = True,
    statemachine: bool = False,
) -> Result:
    """Explore ``model_name`` breadth first; check invariants; optionally write the DOT graph.

    ``statemachine``: the engine sessions step with python-statemachine's own engine instead of
    the declared tables the engines run (``layout_sm.declared``): the graphs must be equal."""
    model = load_model(spec_dir, model_name)
    tlc_intern_order([*model.engines, "NONE"])  # model values in .cfg order: TLC's intern order
    system = System(model, statemachine=statemachine)
    res = Result(model_name)
    start = time.monotonic()
    last = start

    ids: dict[SysState, int] = {}  # mirror state -> id
    by_projection: dict[tuple[Any, ...], int] = {}  # spec state -> id (must be 1:1 with ids)
    mirror_of: dict[int, SysState] = {}
    texts: dict[int, str] = {}
    parents: dict[int, tuple[int, str] | None] = {}
    level_of: dict[int, int] = {}
    queue: deque[int] = deque()
    out = open(dot_path, "w") if dot_path is not None else None  # noqa: SIM115
    dot = _DotWriter(out) if out is not None else None
    invariants = [(name, inv) for name, inv in INVARIANTS.items() if name in model.invariants]
    properties = [(name, p) for name, p in ACTION_PROPERTIES.items() if name in model.properties]

    def visit(s: SysState, parent: tuple[int, str] | None, level: int) -> tuple[int, bool]:
        sid = ids.get(s)
        if sid is not None:
            return sid, False
        proj = system.project(s)
        text = render_projection(proj)
        sid = fingerprint(text)
        if proj in by_projection:
            # Two mirror states show as one spec state: the mirror keeps hidden state.
            res.hidden_state += 1
            ids[s] = by_projection[proj]
            return by_projection[proj], False
        by_projection[proj] = sid
        ids[s] = sid
        mirror_of[sid] = s
        texts[sid] = text
        parents[sid] = parent
        level_of[sid] = level
        queue.append(sid)
        res.depth = max(res.depth, level)
        v = Vars(proj)
        for name, inv in invariants:
            if not inv(model, v):
                res.violations.append(f"Invariant {name} is violated.\n{_trace(parents, texts, sid)}")
        return sid, True

    try:
        for s in system.initial_states():
            sid, new = visit(s, None, 1)
            if new and dot is not None:
                dot.initial(sid, texts[sid])
        while queue and not (stop_on_violation and res.violations):
            sid = queue.popleft()
            s = mirror_of[sid]
            here = system.step_view(s)
            for action, nxt in system.successors(s):
                nid, new = visit(nxt, (sid, action), level_of[sid] + 1)
                res.edges += 1
                if properties:
                    there = system.step_view(nxt)
                    for name, prop in properties:
                        if not prop(model, here, there, action):
                            res.violations.append(
                                f"Action property {name} is violated by {action}.\n{_trace(parents, texts, nid)}"
                            )
                if dot is not None:
                    dot.edge(sid, nid, action, texts[nid] if new else None, level_of[sid] + 1)
            now = time.monotonic()
            if progress is not None and now - last >= every_s:
                last = now
                progress.write(
                    f"[{model_name}] {now - start:6.1f} s: {len(ids)} distinct states, {res.edges} edges, "
                    f"{len(queue)} on queue, depth {res.depth}\n"
                )
                progress.flush()
    finally:
        if dot is not None and out is not None:
            dot.close()
            out.close()
    res.states = len(by_projection)
    res.seconds = time.monotonic() - start
    if res.hidden_state:
        res.violations.append(
            f"the mirror keeps state the spec does not show: {res.hidden_state} revisits of a spec "
            f"state reached a different mirror state"
        )
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="model names, e.g. MCSmall MCFull")
    ap.add_argument("--spec-dir", default="spec")
    ap.add_argument("--dot-dir", default=None, help="write <dir>/<Model>.dot in TLC's dump format")
    ap.add_argument(
        "--dump",
        default=None,
        help="export the whole reachable graph of one model to this file (for trace suites): "
        "violations are printed as warnings and do not stop the run or fail it",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument(
        "--statemachine",
        action="store_true",
        help="engine steps through python-statemachine's own engine (the reference for the declared tables)",
    )
    args = ap.parse_args(argv)
    if args.dump and len(args.models) != 1:
        ap.error("--dump takes one model")
    failed = False
    for name in args.models:
        dot = Path(args.dump) if args.dump else None
        if args.dot_dir:
            Path(args.dot_dir).mkdir(parents=True, exist_ok=True)
            dot = Path(args.dot_dir) / f"{name}.dot"
        progress = None if args.quiet else sys.stderr
        res = explore(
            args.spec_dir, name, dot, progress=progress, stop_on_violation=not args.dump, statemachine=args.statemachine
        )
        if args.dump:
            for v in res.violations[:1]:
                print(f"warning ({len(res.violations)} violations; the first):\n{v}", file=sys.stderr)
            print(
                f"{name}: {res.states} distinct states, {res.edges} edges, depth {res.depth}, "
                f"{res.seconds:.1f} s (graph: {dot})"
            )
            continue
        for v in res.violations:
            print(v)
        print(res.summary() + (f" (graph: {dot})" if dot else ""))
        failed |= not res.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
