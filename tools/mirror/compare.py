"""Compare two state graphs in TLC's DOT dump format, state for state and edge for edge.

Why: the mirror's graph must be TLC's graph. Node ids differ (TLC's are fingerprints), so
states are matched by their canonical rendering: the ``/\\ var = value`` lines sorted by
variable, each value without the pretty printer's layout and with the orders that carry no
meaning sorted (set elements, record fields, function pairs: ``render.canonical_state``), so that a
TLC version that orders names differently still compares equal. Edges
are matched as (canonical source state, action label without spaces, canonical target state).

    python -m tools.mirror.compare A.dot B.dot [--max N] [--ignore-var NAME ...]

``--ignore-var`` drops a variable from both sides before matching: a spec that adds variables
(the standby's ``dpark``, ``eclaim``) whose values never change in a model is compared with the
dump of the spec before them (it is then the same graph plus constant columns).

Prints every difference (states only in A or B, edges only in A or B, initial states that
differ) and exits 0 iff the graphs are equal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools.mirror.dot import StateGraph, load_dot
from tools.mirror.render import canonical_state, canonical_text, state_vars

__all__ = ["Diff", "compare_graphs", "main"]


@dataclass
class Diff:
    only_a_states: list[str] = field(default_factory=list)
    only_b_states: list[str] = field(default_factory=list)
    only_a_initial: list[str] = field(default_factory=list)
    only_b_initial: list[str] = field(default_factory=list)
    only_a_edges: list[tuple[str, str, str]] = field(default_factory=list)
    only_b_edges: list[tuple[str, str, str]] = field(default_factory=list)
    counts: tuple[int, int, int, int] = (0, 0, 0, 0)  # states A, edges A, states B, edges B
    names_only: bool = False  # edges compared by action name only (a TLC without parameter labels)

    @property
    def equal(self) -> bool:
        return not (
            self.only_a_states
            or self.only_b_states
            or self.only_a_initial
            or self.only_b_initial
            or self.only_a_edges
            or self.only_b_edges
        )

    def report(self, name_a: str = "A", name_b: str = "B", limit: int | None = None) -> str:
        lines = [
            f"{name_a}: {self.counts[0]} states, {self.counts[1]} edges; "
            f"{name_b}: {self.counts[2]} states, {self.counts[3]} edges"
            + ("; edges compared by action name (a graph has no parameters in its labels)" if self.names_only else "")
        ]

        def section(title: str, items: list, fmt: callable) -> None:  # type: ignore[valid-type]
            if not items:
                return
            lines.append(f"{title}: {len(items)}")
            for item in items[:limit] if limit else items:
                lines.append(fmt(item))
            if limit and len(items) > limit:
                lines.append(f"  ... {len(items) - limit} more")

        def st(s: str) -> str:
            return "  state:\n    " + s.replace("\n", "\n    ")

        def ed(e: tuple[str, str, str]) -> str:
            return (
                f"  edge {e[1]}:\n    from "
                + e[0].replace("\n", "\n         ")
                + "\n    to   "
                + e[2].replace("\n", "\n         ")
            )

        section(f"initial states only in {name_a}", self.only_a_initial, st)
        section(f"initial states only in {name_b}", self.only_b_initial, st)
        section(f"states only in {name_a}", self.only_a_states, st)
        section(f"states only in {name_b}", self.only_b_states, st)
        section(f"edges only in {name_a}", self.only_a_edges, ed)
        section(f"edges only in {name_b}", self.only_b_edges, ed)
        lines.append("EQUAL" if self.equal else "DIFFERENT")
        return "\n".join(lines)


def _label(label: str, names_only: bool) -> str:
    text = "".join(label.split())
    return text.split("(", 1)[0] if names_only else text


def _state_key(text: str, ignore: frozenset[str]) -> str:
    if not ignore:
        return canonical_state(text)
    kept = {k: v for k, v in state_vars(text).items() if k not in ignore}
    return "\n".join(f"{k}={canonical_text(v)}" for k, v in sorted(kept.items()))


def _canon(
    g: StateGraph, names_only: bool, ignore: frozenset[str] = frozenset()
) -> tuple[dict[int, str], set[str], set[tuple[str, str, str]]]:
    canon = {sid: _state_key(text, ignore) for sid, text in g.texts.items()}
    initial = {canon[sid] for sid in g.initial if sid in canon}
    edges = set()
    for e in g.edges:
        a, b = e.src, e.dst
        edges.add(
            (
                canon.get(a, f"<unknown node {a}>"),
                _label(e.action.label, names_only),
                canon.get(b, f"<unknown node {b}>"),
            )
        )
    return canon, initial, edges


def _has_parameters(g: StateGraph) -> bool:
    return any(e.action.args for e in g.edges)


def compare_graphs(a: StateGraph, b: StateGraph, ignore: Iterable[str] = ()) -> Diff:
    """Every state and edge of ``a`` missing from ``b`` and the reverse.

    TLC releases before the ones that print action parameters label edges with the action
    name only (``Attach``); when either graph has no parameters in any label, edges are
    compared by action name (the states still identify them).
    """
    names_only = bool(a.edges and b.edges) and not (_has_parameters(a) and _has_parameters(b))
    dropped = frozenset(ignore)
    ca, ia, ea = _canon(a, names_only, dropped)
    cb, ib, eb = _canon(b, names_only, dropped)
    sa, sb = set(ca.values()), set(cb.values())
    return Diff(
        only_a_states=sorted(sa - sb),
        only_b_states=sorted(sb - sa),
        only_a_initial=sorted(ia - ib),
        only_b_initial=sorted(ib - ia),
        only_a_edges=sorted(ea - eb),
        only_b_edges=sorted(eb - ea),
        counts=(len(sa), len(ea), len(sb), len(eb)),
        names_only=names_only,
    )


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--max", type=int, default=None, help="list at most N items per section")
    ap.add_argument("--ignore-var", action="append", default=[], help="drop this variable on both sides (repeatable)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    diff = compare_graphs(load_dot(args.a), load_dot(args.b), args.ignore_var)
    print(diff.report(str(args.a), str(args.b), args.max))
    return 0 if diff.equal else 1


if __name__ == "__main__":
    sys.exit(main())
