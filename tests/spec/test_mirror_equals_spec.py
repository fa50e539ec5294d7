"""The mirror's state graph equals the spec's, state for state and edge for edge.

Why: this is the claim the project rests on (the ``layout_sm`` machines are the protocol the
spec states). Until TLC's own graphs arrive under ``../shared/tlc/``, the spec's graph comes from
``spec_oracle`` (the spec's actions transcribed without ``layout_sm``); ``layout_model.compare``
must find no difference. The model is MCSmall without daemon restarts, where the one known
disagreement (spec/README.md, Findings) cannot occur; the full models are compared by hand
(``python -m layout_model.compare``) and the differences reported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.layout_model.test_explore import _variant
from tests.spec.spec_oracle import dump

import layout_sm.engine as engine_module
from layout_model.compare import compare_graphs
from layout_model.dot import load_dot
from layout_model.explore import explore


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _variant(tmp_path_factory.mktemp("eq"), "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")


def test_mirror_graph_equals_spec_graph(variant: Path, tmp_path: Path) -> None:
    states, edges = dump(variant, "MCSmall", tmp_path / "spec.dot")
    res = explore(variant, "MCSmall", tmp_path / "mirror.dot", progress=None)
    assert res.ok
    diff = compare_graphs(load_dot(tmp_path / "spec.dot"), load_dot(tmp_path / "mirror.dot"))
    assert diff.equal, diff.report("spec", "mirror", limit=2)
    assert (states, edges) == (res.states, res.edges)


def test_a_layout_sm_mutant_breaks_the_equality(variant: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk decision that proceeds on busy replies: the graphs must differ."""
    original = engine_module.chunk_decision

    def proceed_on_busy(replies):  # type: ignore[no-untyped-def]
        d = original(replies)
        return engine_module.ChunkDecision("proceed", (), "begun", "") if d.kind == "pause" else d

    import layout_model.system as system_module

    monkeypatch.setattr(system_module, "chunk_decision", proceed_on_busy)
    dump(variant, "MCSmall", tmp_path / "spec.dot")
    explore(variant, "MCSmall", tmp_path / "mirror.dot", progress=None, stop_on_violation=False)
    diff = compare_graphs(load_dot(tmp_path / "spec.dot"), load_dot(tmp_path / "mirror.dot"))
    assert not diff.equal
