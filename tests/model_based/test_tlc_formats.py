"""TLC's outputs (DOT dump, -dumpTrace json/tla, -simulate modules, stdout) load into one behaviour format.

The fixtures are TLC's real output on a toy spec (copied from ../shared/tlc-samples).
"""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest
from tools.mirror.dot import StateGraph, escape, load_dot, parse_dot, unescape
from tools.mirror.render import canonical_state, one_line, state_vars
from tools.mirror.tlc_formats import (
    Action,
    Behaviour,
    Step,
    Suite,
    TlcFormatError,
    load_dumptrace_tla,
    load_json_trace,
    load_simulate_trace,
    load_tla_trace,
)
from tools.mirror.values import ModelValue, Record, decode_text, json_matches

SAMPLES = Path(__file__).parent / "fixtures" / "tlc-samples"
E1, E2 = ModelValue("e1"), ModelValue("e2")


@pytest.fixture(scope="module")
def graph() -> StateGraph:
    return load_dot(SAMPLES / "toy_full_graph.dot")


@pytest.fixture(scope="module")
def stdout_trace() -> Behaviour:
    return load_tla_trace((SAMPLES / "toy_tlc_stdout.txt").read_text())


def _counts(stdout: str) -> tuple[int, int]:
    m = re.search(r"(\d+) states generated, (\d+) distinct states found", stdout)
    assert m
    return int(m.group(1)), int(m.group(2))


def test_dot_graph_matches_tlc_counts(graph: StateGraph) -> None:
    generated, distinct = _counts((SAMPLES / "toy_full_stdout.txt").read_text())
    assert len(graph.texts) == distinct == 26
    # TLC counts the initial state as generated, and every other generated state is one edge
    assert len(graph.edges) == generated - len(graph.initial) == 62
    assert len(graph.initial) == 1
    init = graph.state(graph.initial[0])
    assert init == Record(
        attached=frozenset(),
        rec=decode_text("[version |-> 0, rows |-> <<0, 0>>, pending |-> NONE, dirty |-> FALSE]"),
        log=(),
    )
    assert len(graph.depths()) == distinct
    assert max(graph.depths().values()) == 6  # TLC: "depth of the complete state graph search is 7" (states)


def test_dot_states_decode_and_are_distinct(graph: StateGraph) -> None:
    states = [graph.state(n) for n in graph.texts]
    assert len(set(states)) == len(states)
    assert all(set(s) == {"attached", "rec", "log"} for s in states)


def test_action_labels() -> None:
    assert Action.parse("Attach(e1)") == Action("Attach", (E1,))
    assert Action.parse("Begin(e1, {1, 2}, <<0>>)") == Action("Begin", (E1, frozenset({1, 2}), (0,)))
    assert Action.parse("Tick") == Action("Tick")
    assert Action.parse("Begin(e1, {1, 2})").label == "Begin(e1, {1, 2})"
    with pytest.raises(TlcFormatError):
        Action.parse("not a label!")


def test_every_format_loads_into_the_same_behaviour(stdout_trace: Behaviour, graph: StateGraph) -> None:
    # the same counterexample, written three ways by one TLC run
    examples = [graph.state(n) for n in graph.texts]
    from_json = load_json_trace(SAMPLES / "toy_counterexample.json", cfg=SAMPLES / "Toy.cfg", like=examples)
    from_tla = load_dumptrace_tla(SAMPLES / "toy_counterexample.tla")
    for b in (stdout_trace, from_json, from_tla):
        assert isinstance(b, Behaviour)
        assert all(
            isinstance(s, Step) and isinstance(s.action, Action) and isinstance(s.state, Record) for s in b.steps
        )
    assert [s.action.label for s in stdout_trace.steps] == ["Attach(e1)", "Begin(e1)", "Detach(e1)"]
    assert from_json.states == stdout_trace.states == from_tla.states
    assert from_json.steps == stdout_trace.steps == from_tla.steps
    assert stdout_trace.steps[-1].state["rec"]["dirty"] is True


def test_json_without_examples_still_matches_exactly_modulo_erasure(stdout_trace: Behaviour) -> None:
    import json

    raw = json.loads((SAMPLES / "toy_counterexample.json").read_text())["counterexample"]["state"]
    for (_, obj), state in zip(raw, stdout_trace.states, strict=True):
        assert json_matches(state, obj)
    loose = load_json_trace(SAMPLES / "toy_counterexample.json", cfg=SAMPLES / "Toy.cfg")
    assert loose.steps[0].state["attached"] == (E1,)  # an array read without a typed example
    assert [s.action for s in loose.steps] == [s.action for s in stdout_trace.steps]


def _is_path_in(graph: StateGraph, b: Behaviour) -> bool:
    by_state = {graph.state(n): n for n in graph.texts}
    node = by_state.get(b.init)
    if node not in graph.initial:
        return False
    for step in b.steps:
        nxt = [e.dst for e in graph.successors(node) if e.action == step.action and graph.state(e.dst) == step.state]
        if len(nxt) != 1:
            return False
        node = nxt[0]
    return True


def test_simulate_trace_is_a_path_of_the_dumped_graph(graph: StateGraph) -> None:
    sim = load_simulate_trace(SAMPLES / "toy_simulate_trace_0_0.tla")
    assert len(sim.steps) == 6
    assert [s.action.label for s in sim.steps][:2] == ["Attach(e1)", "Attach(e2)"]
    assert _is_path_in(graph, sim)
    # and a changed step is not
    bad = Behaviour(sim.init, (*sim.steps[:-1], Step(Action("Begin", (E1,)), sim.steps[-1].state)))
    assert not _is_path_in(graph, bad)


def test_edge_cover_takes_every_edge_once_at_least(graph: StateGraph) -> None:
    paths = graph.edge_cover()
    taken = {e for p in paths for e in p}
    assert taken == set(graph.edges)
    for p in paths:
        assert p[0].src in graph.initial
        assert all(a.dst == b.src for a, b in itertools.pairwise(p))
    for b in graph.behaviours():
        assert _is_path_in(graph, b)


def _relabel(text: str, seed: int) -> str:
    """The same graph with other node ids and another line order (as another dumper would write it)."""
    rng = random.Random(seed)
    ids = sorted(set(re.findall(r"^(-?\d+) ", text, flags=re.M)))
    new = {old: str(rng.randrange(-(2**63), 2**63)) for old in ids}
    lines = text.splitlines()
    head, body, tail = lines[:5], [ln for ln in lines[5:] if re.match(r"^-?\d+ ", ln)], ["}", "}"]
    out = [
        re.sub(
            r"^(-?\d+)( -> (-?\d+))?",
            lambda m: new[m.group(1)] + (f" -> {new[m.group(3)]}" if m.group(2) else ""),
            ln,
        )
        for ln in body
    ]
    # node definitions must keep their style: keep definitions before use is not required by DOT
    rng.shuffle(out)
    return "\n".join(head + out + tail)


def test_edge_cover_is_deterministic_whatever_the_ids_and_line_order(graph: StateGraph) -> None:
    text = (SAMPLES / "toy_full_graph.dot").read_text()
    ref = [(b.name, b.states, [s.action for s in b.steps]) for b in graph.behaviours()]
    for seed in (1, 2):
        other = parse_dot(_relabel(text, seed))
        assert [(b.name, b.states, [s.action for s in b.steps]) for b in other.behaviours()] == ref


def _reprinted(text: str, seed: int) -> str:
    """The same graph as another printer would write it: variables in another order, values on one line.

    (TLC prints the variables in its symbol table's order, the mirror in declaration order.)
    """
    rng = random.Random(seed)
    order: list[str] = []

    def label(m: re.Match[str]) -> str:
        state = state_vars(unescape(m.group(2)))
        if not order:
            order.extend(state)
            rng.shuffle(order)
        lines = ["/\\ " + n + " = " + one_line(state[n]) for n in order]
        return m.group(1) + '"' + escape("\n".join(lines)) + '"'

    return re.sub(r'(\[label=|,tooltip=)"((?:[^"\\]|\\.)*)"(?=,style|,tooltip|\])', label, text)


def _canonical_behaviours(graph: StateGraph) -> list[tuple[str, list[tuple[str, str]]]]:
    suite = graph.suite({"model": "Toy"})
    key = [canonical_state(t) for t in suite.texts]
    return [(key[i0], [(a, key[i]) for a, i in steps]) for _, i0, steps in suite.paths]


def _random_graph_dot(seed: int, states: int = 300) -> str:
    """A reachable random graph in TLC's DOT format (the toy sample is too small to tell orders apart)."""
    rng = random.Random(seed)
    values: list[tuple[int, frozenset[int], int]] = []
    while len(values) < states:
        v = (rng.randrange(9), frozenset(rng.sample(range(6), rng.randrange(4))), rng.randrange(9))
        if v not in values:
            values.append(v)

    def node(i: int, first: bool = False) -> str:
        x, s, z = values[i]
        text = f"/\\ x = {x}\n/\\ s = {{{', '.join(map(str, sorted(s)))}}}\n/\\ z = {z}"
        return f'{i + 1} [label="{escape(text)}"' + (",style = filled]" if first else f',tooltip="{escape(text)}"];')

    lines = ["strict digraph DiskGraph {", "node [shape=box,style=rounded]", "nodesep=0.35;"]
    lines += ["subgraph cluster_graph {", 'color="white";', node(0, True)]
    edges = {(rng.randrange(i), i) for i in range(1, states)} | {
        (rng.randrange(states), rng.randrange(states)) for _ in range(states * 2)
    }
    for a, b in sorted(edges):
        lines.append(f'{a + 1} -> {b + 1} [label="Step({rng.randrange(3)})",color="black",fontcolor="black"];')
    lines += [node(i) for i in range(1, states)] + ["}", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize("sample", ["toy", "random"])
def test_suite_is_the_same_for_equal_graphs_printed_otherwise(sample: str) -> None:
    """TLC's graph and the mirror's are equal but printed otherwise: one suite, not two.

    Before the cover was ordered by canonical states it followed the printed text, and TLC's
    MCSmall graph gave 6,512 behaviours where the mirror's equal graph gave 6,485.
    """
    text = (SAMPLES / "toy_full_graph.dot").read_text() if sample == "toy" else _random_graph_dot(7)
    graph = parse_dot(text)
    ref = _canonical_behaviours(graph)
    suite = graph.suite({"model": "Toy"})
    for seed in (1, 2, 3):
        other = parse_dot(_relabel(_reprinted(text, seed), seed))
        assert other.texts.keys().isdisjoint(graph.texts)  # other ids
        assert set(other.texts.values()) != set(graph.texts.values())  # other text
        assert _canonical_behaviours(other) == ref
        # only ids and line order differ: the very same suite, byte for byte
        same = parse_dot(_relabel(text, seed)).suite({"model": "Toy"})
        assert same.to_json() == suite.to_json()


@pytest.mark.parametrize("name", ["suite.json", "suite.json.gz"])
def test_suite_round_trip(tmp_path: Path, graph: StateGraph, name: str) -> None:
    suite = graph.suite({"model": "Toy"})
    assert suite.manifest["edges_covered"] == suite.manifest["graph_edges"] == len(graph.edges)
    assert suite.manifest["behaviours"] == len(graph.edge_cover())
    suite.write(tmp_path / name)
    back = Suite.load(tmp_path / name)
    assert back.manifest == suite.manifest
    assert [(b.init, b.steps, b.name) for b in back.behaviours()] == [
        (b.init, b.steps, b.name) for b in graph.behaviours()
    ]
    # every visited state carries the actions TLC lists out of it
    by_text = {t: n for n, t in graph.texts.items()}
    for text, enabled in zip(back.texts, back.enabled, strict=True):
        assert set(enabled) == graph.enabled_labels(by_text[text])
    again = tmp_path / ("again-" + name)
    back.write(again)
    assert again.read_bytes() == (tmp_path / name).read_bytes()


def test_malformed_inputs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TlcFormatError):
        parse_dot("strict digraph DiskGraph {\n}\n")
    with pytest.raises(TlcFormatError):
        parse_dot('1 [label="/\\\\ x = 1",style = filled]\n1 -> 2 [label="A"];\n')
    (tmp_path / "x.json").write_text('{"not": "a trace"}')
    with pytest.raises(TlcFormatError):
        load_json_trace(tmp_path / "x.json")
    with pytest.raises(TlcFormatError):
        load_tla_trace("nothing here")
