"""Where the suites come from: TLC's graphs in ../shared/tlc/, checked against spec/; TLC's variable order.

Where TLC's graphs are there, the committed traces are held against them: each replay suite walks
exactly its model's graph (every state and edge, nothing else), and each witness (``witnesses/``)
starts in an initial state of its model's graph and takes only its edges.

The variable-order fixtures are TLC's real output (`fixtures/tlc-samples/README.md`): 40 variables
printed by TLC from a module that declares them (`VarOrderBase`) and from one that EXTENDS it
(`VarOrderRoot`, as the spec's models extend `LayoutProtocol`).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

import pytest
from tools.mirror.check_spec import WITNESSES
from tools.mirror.compare import compare_graphs
from tools.mirror.dot import Edge, StateGraph, load_dot
from tools.mirror.render import fit_variable_order, java_string_hash, sany_variable_order
from tools.mirror.system import VARIABLES, render_projection
from tools.mirror.tlc_formats import Suite

from tests.model_based import suites
from tests.model_based.witness_traces import load_witness
from tests.spec.test_mirror_equals_spec import variables_to_ignore

SAMPLES = Path(__file__).parent / "fixtures" / "tlc-samples"


def test_java_string_hash() -> None:
    # values of Java's "...".hashCode()
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("dphase") == -1325422697
    assert java_string_hash("polygenelubricants") == -2147483648


@pytest.mark.parametrize(
    ("module", "table"),
    [("VarOrderBase", (191, 191)), ("VarOrderRoot", (383, 191))],
)
def test_sany_variable_order_is_tlcs(module: str, table: tuple[int, int]) -> None:
    sample = json.loads((SAMPLES / "variable_order.json").read_text())
    declared, printed = sample["declared"], sample[module]
    assert printed != declared
    assert fit_variable_order(declared, printed) == table
    assert sany_variable_order(declared, *table) == tuple(printed)
    # the variables that share a bucket are what `inserted_at` decides: the extending module's
    # variables entered a smaller table than the one they end in
    if table[0] != table[1]:
        assert sany_variable_order(declared, table[0]) != tuple(printed)


def test_toy_sample_order() -> None:
    graph = load_dot(SAMPLES / "toy_full_graph.dot")
    printed = suites.printed_variable_order(graph, "toy")
    assert printed == ("attached", "rec", "log")  # declared: rec, attached, log
    assert fit_variable_order(("rec", "attached", "log"), printed) is not None


def _tlc_dir(tmp_path: Path, model: str, hashes: dict[str, str]) -> Path:
    where = tmp_path / "tlc"
    where.mkdir()
    rows = "\n".join(f"| {f} | {h} |" for f, h in hashes.items())
    (where / "README.md").write_text(f"| file | SHA-256 |\n| --- | --- |\n{rows}\n")
    with gzip.open(where / f"{model}.dot.gz", "wt") as f:
        f.write((SAMPLES / "toy_full_graph.dot").read_text())
    return where


def test_a_graph_of_another_spec_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashes = suites.spec_hashes("MCSmall")
    other = {**hashes, "LayoutProtocol.tla": "0" * 64}
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(_tlc_dir(tmp_path, "MCSmall", other)))
    with pytest.raises(suites.StaleGraph, match=r"another spec than spec/(.|\n)*LayoutProtocol.tla: TLC ran on 0000"):
        suites.build("MCSmall")


def test_a_missing_graph_or_unstated_spec_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(tmp_path))
    with pytest.raises(suites.StaleGraph, match="no TLC graph of MCSmall"):
        suites.build("MCSmall")
    where = _tlc_dir(tmp_path, "MCSmall", suites.spec_hashes("MCSmall"))
    (where / "README.md").unlink()
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(where))
    with pytest.raises(suites.StaleGraph, match="states no SHA-256"):
        suites.build("MCSmall")


def test_a_current_graph_is_read_from_gzip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = _tlc_dir(tmp_path, "MCSmall", suites.spec_hashes("MCSmall"))
    shutil.copy(SAMPLES / "toy_full_stdout.txt", where / "MCSmall.stdout.txt")
    monkeypatch.setenv("LAYOUT_TLC_DIR", str(where))
    suite = suites.build("MCSmall")
    m = suite.manifest
    assert m["source"] == "tlc" and m["dot"] == "MCSmall.dot.gz"
    assert re.fullmatch(r"[0-9a-f]{64}", m["dot_sha256"])
    assert m["tlc_version"] != "unknown"
    assert m["variable_order"] == ["attached", "rec", "log"]
    assert m["edges_covered"] == m["graph_edges"] > 0


# -- the committed suites and witnesses are TLC's (where ../shared/tlc/ is) ------------------------

MUTANTS = os.environ.get("LAYOUT_TEST_PROFILE") == "mutants"  # `make mutants`: one run per mutant


def _tlc_reference(model: str) -> tuple[Path, StateGraph]:
    if MUTANTS:
        pytest.skip("`make mutants`: the committed traces against TLC's graphs involve no code a mutant changes")
    graph, why_not = suites.current_tlc_graph(model)
    if graph is None:
        pytest.skip(why_not)
    return graph, _load_tlc(graph)


@lru_cache(maxsize=2)  # the graphs are large: the last two, as the tests ask for them
def _load_tlc(graph: Path) -> StateGraph:
    return load_dot(graph)


def _suite_graph(suite: Suite) -> StateGraph:
    """The states and steps of a suite's behaviours, as a graph (node id: the state's index)."""
    edges = {Edge(i, suite.action(label), j) for _, i0, steps in suite.paths for i, (label, j) in _walk(i0, steps)}
    return StateGraph(dict(enumerate(suite.texts)), sorted({i0 for _, i0, _ in suite.paths}), list(edges))


def _walk(i0: int, steps: list[tuple[str, int]]) -> Iterator[tuple[int, tuple[str, int]]]:
    i = i0
    for label, j in steps:
        yield i, (label, j)
        i = j


def _witness_graph(name: str) -> StateGraph:
    """A witness's states and steps, as a graph: each state printed from the value TLC's JSON holds."""
    behaviour = load_witness(name)
    states = [behaviour.init, *(step.state for step in behaviour.steps)]
    ids: dict[str, int] = {}
    for state in states:
        ids.setdefault(render_projection(tuple(state[v] for v in VARIABLES)), len(ids))
    node = [ids[render_projection(tuple(s[v] for v in VARIABLES))] for s in states]
    edges = [Edge(node[k], step.action, node[k + 1]) for k, step in enumerate(behaviour.steps)]
    return StateGraph({i: text for text, i in ids.items()}, [node[0]], edges)


@pytest.mark.parametrize("model", suites.MODELS)
def test_suite_is_tlcs_graph(model: str) -> None:
    """A replay suite's behaviours visit exactly TLC's states and take exactly TLC's edges."""
    tlc_path, tlc = _tlc_reference(model)
    suite = Suite.load(suites.suite_path(model))
    walked = _suite_graph(suite)
    diff = compare_graphs(tlc, walked, variables_to_ignore(tlc_path, tlc, walked, f"the {model} suite"))
    assert diff.equal, diff.report("TLC", f"the {model} suite", limit=2) + f"\nrebuild it: {suites.REGENERATE}"


@pytest.mark.parametrize("name", [w.name for w in WITNESSES])
def test_witness_is_a_path_of_tlcs_graph(name: str) -> None:
    """A witness starts in an initial state of TLC's graph of its model and takes only its edges."""
    w = next(w for w in WITNESSES if w.name == name)
    tlc_path, tlc = _tlc_reference(w.model)
    walked = _witness_graph(name)
    diff = compare_graphs(tlc, walked, variables_to_ignore(tlc_path, tlc, walked, f"witness {name}"))
    outside = diff.only_b_initial + diff.only_b_states + diff.only_b_edges
    assert not outside, diff.report("TLC", f"witness {name}", limit=2)
    assert diff.counts[3] == len(walked.edges) > 0
