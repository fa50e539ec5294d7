"""The spec oracle (``tools.oracle.spec``): its graph is TLC's, and the mirror's, and it imports no ``layout_sm``.

Why: the oracle is the reference that judges ``layout_sm`` without TLC, so it must not share code with
it (checked in a fresh interpreter, whose ``sys.modules`` tells every module an import pulled in), and
it must be the spec: TLC's own graphs, where ``../shared/tlc/`` holds them for this spec, equal its
graphs state for state and edge for edge; the mirror's graphs of small variants of the models with
standbys, repairs and rejoins equal them everywhere (MCSmall's is ``test_mirror_equals_spec``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.mirror.test_explore import SPEC, _variant
from tests.model_based import suites
from tests.test_import_graph import import_graph
from tools import REPO_DIR, with_project_path
from tools.mirror.compare import compare_graphs
from tools.mirror.dot import load_dot
from tools.mirror.explore import explore
from tools.oracle.spec import dump


def test_importing_the_oracle_loads_no_layout_sm() -> None:
    code = (
        "import json, sys\n"
        "import tools.oracle, tools.oracle.spec, tools.oracle.traces, tools.oracle.__main__\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_DIR,
        env=with_project_path({}),
    )
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert "tools.oracle.traces" in loaded
    assert [m for m in loaded if m == "layout_sm" or m.startswith(("layout_sm.", "statemachine"))] == []
    assert not [m for m in loaded if m in ("tools.mirror.system", "tools.trace_check", "tools.mirror.trace_tla")]


def test_no_import_of_the_oracle_reaches_layout_sm() -> None:
    """Every import in the sources (lazy ones inside functions too), followed transitively."""
    graph = import_graph()
    reached, todo = set(), [m for m in graph if m == "tools.oracle" or m.startswith("tools.oracle.")]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph.get(module, ()))
    assert sorted(m for m in reached if m.startswith("layout_sm") or m.endswith(("mirror.system", "trace_check"))) == []
    assert {"tools.oracle.spec", "tools.oracle.traces", "tools.mirror.model", "tools.mirror.trace_logs"} <= reached


@pytest.mark.parametrize(
    ("model", "constants"),
    [
        ("MCTwoStandbys", {"NumRanks": "1"}),
        ("MCStandbyRepair", {"MaxMoves": "0"}),
        ("MCRepairFails", {"MaxMoves": "1"}),
        ("MCRejoin", {"NumRanks": "2"}),
        ("MCDurable", {"MaxMoves": "1"}),
    ],
)
def test_the_oracle_s_graph_equals_the_mirror_s(model: str, constants: dict[str, str], tmp_path: Path) -> None:
    spec = _variant(tmp_path, model, **constants)
    counts = dump(spec, model, tmp_path / "oracle.dot")
    res = explore(spec, model, tmp_path / "mirror.dot", progress=None)
    assert res.ok, res.violations[:1]
    diff = compare_graphs(load_dot(tmp_path / "oracle.dot"), load_dot(tmp_path / "mirror.dot"))
    assert diff.equal, diff.report("oracle", "mirror", limit=2)
    assert counts == (res.states, res.edges)


# Three of the smaller models, a second or two each (all nine are equal: spec/README.md).
@pytest.mark.parametrize("model", ["MCSmall", "MCRepair", "MCTwoStandbys"])
def test_the_oracle_s_graph_equals_tlc_s(model: str, tmp_path: Path) -> None:
    path, why_not = suites.current_tlc_graph(model)
    if path is None:
        pytest.skip(why_not)
    states, edges = dump(SPEC, model, tmp_path / "oracle.dot")
    tlc = load_dot(path)
    diff = compare_graphs(tlc, load_dot(tmp_path / "oracle.dot"))
    assert diff.equal, diff.report("TLC", "oracle", limit=2)
    assert (states, edges) == (len(tlc.texts), len(tlc.edges))
