"""The mirror's state graph equals the spec's, state for state and edge for edge.

Why: this is the claim the project rests on (``layout_sm``, the daemon machine and the engine
session every rank runs, is the protocol the spec states). Two references:

- TLC's own graph of ``MCSmall`` (``../shared/tlc/MCSmall.dot.gz`` beside the clone, or
  ``$LAYOUT_TLC_DIR``; skipped where it is absent or was made from another spec);
- ``spec_oracle`` (the spec's actions transcribed without ``layout_sm``), on MCSmall without
  daemon restarts and with one move, which runs everywhere.

A mutant of the engine session (it proceeds on busy begin replies, the catalog's
``session_proceeds_on_busy``) must make both graphs differ.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.mirror.test_explore import SPEC, _variant
from tests.model_based import suites
from tests.model_based.mutants.catalog import MUTANTS
from tests.spec.spec_oracle import dump
from tools.mirror.compare import compare_graphs
from tools.mirror.dot import load_dot
from tools.mirror.explore import explore

import layout_sm.session as session_module


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _variant(tmp_path_factory.mktemp("eq"), "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")


def _tlc_graph() -> Path:
    graph = suites.tlc_graph("MCSmall")
    if graph is None:
        pytest.skip(f"TLC's graph MCSmall.dot.gz is not in {suites.tlc_dir()} (or set LAYOUT_TLC_DIR)")
    return graph


def _same_spec(graph: Path) -> bool:
    """Whether TLC ran on today's spec files (its folder's README states their SHA-256)."""
    now = suites.spec_hashes("MCSmall")
    return {f: suites.tlc_spec_hashes(graph.parent).get(f) for f in now} == now


def _session_proceeds_on_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The catalog's mutant, undone after the test: the session's Decide moves on busy replies."""
    from layout_sm.engine_machines import EngineState

    original = EngineState.all_ok
    MUTANTS["session_proceeds_on_busy"].patch(session_module)
    mutated = EngineState.all_ok
    EngineState.all_ok = original  # type: ignore[method-assign]  # so that monkeypatch restores the original
    monkeypatch.setattr(EngineState, "all_ok", mutated)


def test_mirror_graph_equals_spec_graph(variant: Path, tmp_path: Path) -> None:
    states, edges = dump(variant, "MCSmall", tmp_path / "spec.dot")
    res = explore(variant, "MCSmall", tmp_path / "mirror.dot", progress=None)
    assert res.ok
    diff = compare_graphs(load_dot(tmp_path / "spec.dot"), load_dot(tmp_path / "mirror.dot"))
    assert diff.equal, diff.report("spec", "mirror", limit=2)
    assert (states, edges) == (res.states, res.edges)


def test_mirror_graph_equals_tlcs_graph(tmp_path: Path) -> None:
    tlc = _tlc_graph()
    res = explore(SPEC, "MCSmall", tmp_path / "mirror.dot", progress=None)
    assert res.ok, res.violations[:1]
    diff = compare_graphs(load_dot(tlc), load_dot(tmp_path / "mirror.dot"))
    if not diff.equal and not _same_spec(tlc):
        pytest.skip(f"{tlc} was dumped from another spec (SHA-256 in its README) and differs: rerun TLC")
    assert diff.equal, diff.report("TLC", "mirror", limit=2)


def test_a_session_mutant_breaks_the_equality(variant: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine session proceeds on busy replies: the mirror's graph must differ from the spec's."""
    _session_proceeds_on_busy(monkeypatch)
    dump(variant, "MCSmall", tmp_path / "spec.dot")
    explore(variant, "MCSmall", tmp_path / "mirror.dot", progress=None, stop_on_violation=False)
    diff = compare_graphs(load_dot(tmp_path / "spec.dot"), load_dot(tmp_path / "mirror.dot"))
    assert not diff.equal


def test_a_session_mutant_breaks_the_equality_with_tlc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tlc = _tlc_graph()
    _session_proceeds_on_busy(monkeypatch)
    explore(SPEC, "MCSmall", tmp_path / "mirror.dot", progress=None, stop_on_violation=False)
    diff = compare_graphs(load_dot(tlc), load_dot(tmp_path / "mirror.dot"))
    assert not diff.equal
    print(diff.report("TLC", "mutant mirror", limit=1))
