"""The mirror's state graph equals the spec's, state for state and edge for edge.

Why: this is the claim the project rests on (``layout_sm``, the daemon machine and the engine
session every rank runs, is the protocol the spec states). Two references:

- TLC's own graph of ``MCSmall`` (``../shared/tlc/MCSmall.dot.gz`` beside the clone, or
  ``$LAYOUT_TLC_DIR``; skipped where it is absent). A graph TLC dumped from an older spec, which
  lacks variables the spec declares now, is compared without them, as ``make check`` does, provided
  they keep one value in the mirror's graph (then the spec's graph is the dumped one plus constant
  columns); otherwise, or where a dump of other spec files still differs (a spec changed on purpose,
  which TLC checks once it lands), the two cannot be compared, and the test skips saying so. A dump
  of the current spec files must be equal;
- ``tools.oracle.spec`` (the spec's actions transcribed without ``layout_sm``), on MCSmall without
  daemon restarts and with one move, which runs everywhere.

A mutant of the engine session (it proceeds on busy begin replies, the catalog's
``session_proceeds_on_busy``) must make both graphs differ, where the unbroken session's graphs
are equal; and either reference with one edge removed must fail the comparison.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

import pytest
from tests.mirror.test_explore import SPEC, _variant
from tests.model_based import suites
from tests.model_based.mutants.catalog import MUTANTS
from tools.mirror.compare import compare_graphs
from tools.mirror.dot import StateGraph, load_dot, open_dot
from tools.mirror.explore import explore
from tools.mirror.render import state_vars
from tools.oracle.spec import dump

import layout_sm.session as session_module

_EDGE_LINE = re.compile(r"^-?\d+ -> -?\d+ \[")


class Reference(NamedTuple):
    path: Path
    graph: StateGraph


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _variant(tmp_path_factory.mktemp("eq"), "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")


@pytest.fixture(scope="module")
def oracle(variant: Path, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The spec oracle's graph of the variant."""
    path = tmp_path_factory.mktemp("oracle") / "spec.dot"
    dump(variant, "MCSmall", path)
    return Reference(path, load_dot(path))


@pytest.fixture(scope="module")
def mirror_variant(variant: Path, tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    """The unbroken mirror's graph of the variant."""
    path = tmp_path_factory.mktemp("mirror-variant") / "mirror.dot"
    res = explore(variant, "MCSmall", path, progress=None)
    assert res.ok, res.violations[:1]
    return load_dot(path)


@pytest.fixture(scope="module")
def tlc() -> Reference:
    path, why_not = suites.current_tlc_graph("MCSmall")  # a stale graph is skipped before it is read
    if path is None:
        pytest.skip(why_not)
    return Reference(path, load_dot(path))


@pytest.fixture(scope="module")
def mirror_small(tmp_path_factory: pytest.TempPathFactory) -> StateGraph:
    """The unbroken mirror's graph of MCSmall."""
    path = tmp_path_factory.mktemp("mirror-small") / "mirror.dot"
    res = explore(SPEC, "MCSmall", path, progress=None)
    assert res.ok, res.violations[:1]
    return load_dot(path)


def _variables(graph: StateGraph, source: str) -> set[str]:
    return set(suites.printed_variable_order(graph, source))


def _values(graph: StateGraph, variable: str) -> set[str]:
    return {state_vars(text)[variable] for text in graph.texts.values()}


def variables_to_ignore(tlc_path: Path, tlc_graph: StateGraph, other: StateGraph, other_name: str) -> list[str]:
    """The variables only one of TLC's graph and ``other`` prints (a dump of an older or newer spec).

    Skips where the two cannot be compared: such a variable takes several values on its side, so
    dropping it would merge states and the comparison would prove nothing.
    """
    dumped, printed = _variables(tlc_graph, str(tlc_path)), _variables(other, other_name)
    one_sided = [(v, tlc_graph, "TLC's dump") for v in sorted(dumped - printed)]
    one_sided += [(v, other, other_name) for v in sorted(printed - dumped)]
    varying = [f"{v} ({len(_values(g, v))} values in {where})" for v, g, where in one_sided if len(_values(g, v)) > 1]
    if varying:
        pytest.skip(
            f"cannot compare {tlc_path} with {other_name}: a variable only one side prints varies on that side: "
            f"{', '.join(varying)} (TLC's dump lacks {sorted(printed - dumped)} and adds {sorted(dumped - printed)}). "
            f"Rerun TLC on spec/ and put its graphs in {tlc_path.parent}"
        )
    return sorted(dumped ^ printed)


def _assert_equals_tlc(tlc_path: Path, tlc_graph: StateGraph, mirror: StateGraph) -> list[str]:
    """TLC's graph equals the mirror's, compared without the variables only one of them has (returned)."""
    ignored = variables_to_ignore(tlc_path, tlc_graph, mirror, "the mirror's graph of MCSmall")
    diff = compare_graphs(tlc_graph, mirror, ignored)
    context = f"\ncompared without {ignored}" if ignored else ""
    assert diff.equal, diff.report("TLC", "mirror", limit=2) + context
    return ignored


def _without_one_edge(dot: Path, out: Path) -> Path:
    """A copy of a graph in TLC's format with its first edge line left out."""
    with open_dot(dot) as src, out.open("w", encoding="utf-8") as dst:
        removed = False
        for line in src:
            if not removed and _EDGE_LINE.match(line):
                removed = True
                continue
            dst.write(line)
    assert removed, f"{dot} has no edge"
    return out


def _session_proceeds_on_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's mutant, undone after the test: the session's Decide moves on busy replies."""
    from layout_sm.engine_machines import EngineState

    original = EngineState.all_ok
    MUTANTS["session_proceeds_on_busy"].patch(session_module)
    mutated = EngineState.all_ok
    EngineState.all_ok = original  # type: ignore[method-assign]  # so that monkeypatch restores the original
    monkeypatch.setattr(EngineState, "all_ok", mutated)


def _assert_equals_oracle(spec: StateGraph, mirror: StateGraph) -> None:
    diff = compare_graphs(spec, mirror)
    assert diff.equal, diff.report("spec", "mirror", limit=2)


# -- the spec oracle (runs everywhere) ----------------------------------------------------------


def test_mirror_graph_equals_spec_graph(oracle: Reference, mirror_variant: StateGraph) -> None:
    _assert_equals_oracle(oracle.graph, mirror_variant)
    assert (len(oracle.graph.texts), len(oracle.graph.edges)) == (len(mirror_variant.texts), len(mirror_variant.edges))


def test_a_spec_graph_missing_one_edge_is_not_the_mirrors(
    oracle: Reference, mirror_variant: StateGraph, tmp_path: Path
) -> None:
    """The comparison can fail: the oracle's graph with one edge removed differs from the mirror's."""
    less = load_dot(_without_one_edge(oracle.path, tmp_path / "spec-less-one-edge.dot"))
    assert len(less.edges) == len(oracle.graph.edges) - 1
    with pytest.raises(AssertionError, match="edges only in mirror: 1\n"):
        _assert_equals_oracle(less, mirror_variant)


def test_a_session_mutant_breaks_the_equality(
    variant: Path, oracle: Reference, mirror_variant: StateGraph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine session proceeds on busy replies: the mirror's graph must differ from the spec's."""
    _assert_equals_oracle(oracle.graph, mirror_variant)  # unbroken, they are equal: the mutant is what differs
    _session_proceeds_on_busy(monkeypatch)
    explore(variant, "MCSmall", tmp_path / "mirror.dot", progress=None, stop_on_violation=False)
    diff = compare_graphs(oracle.graph, load_dot(tmp_path / "mirror.dot"))
    assert not diff.equal


# -- TLC's graph (where ../shared/tlc/ is) --------------------------------------------------------


def test_mirror_graph_equals_tlcs_graph(tlc: Reference, mirror_small: StateGraph) -> None:
    _assert_equals_tlc(tlc.path, tlc.graph, mirror_small)


def test_a_tlc_graph_missing_one_edge_is_not_the_mirrors(
    tlc: Reference, mirror_small: StateGraph, tmp_path: Path
) -> None:
    """The comparison can fail: TLC's graph with one edge removed differs from the unbroken mirror's."""
    less = load_dot(_without_one_edge(tlc.path, tmp_path / "MCSmall-less-one-edge.dot"))
    assert len(less.edges) == len(tlc.graph.edges) - 1
    with pytest.raises(AssertionError, match="edges only in mirror: 1\n"):
        _assert_equals_tlc(tlc.path, less, mirror_small)


def test_a_session_mutant_breaks_the_equality_with_tlc(
    tlc: Reference, mirror_small: StateGraph, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ignored = _assert_equals_tlc(tlc.path, tlc.graph, mirror_small)  # unbroken, equal: the mutant is what differs
    _session_proceeds_on_busy(monkeypatch)
    explore(SPEC, "MCSmall", tmp_path / "mirror.dot", progress=None, stop_on_violation=False)
    diff = compare_graphs(tlc.graph, load_dot(tmp_path / "mirror.dot"), ignored)
    assert not diff.equal
    print(diff.report("TLC", "mutant mirror", limit=1))
