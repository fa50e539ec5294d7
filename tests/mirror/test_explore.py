"""The mirror explorer and the graph compare command.

Why: ``make check-model`` is only worth something if the explorer finds a broken rule, and
``compare`` is only worth something if it reports every kind of difference.
"""

from __future__ import annotations

import inspect
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from statemachine import StateMachine
from tests.layout_sm.broken_declaration import without_guard
from tools.mirror.compare import compare_graphs
from tools.mirror.compare import main as compare_main
from tools.mirror.dot import StateGraph, escape, load_dot
from tools.mirror.explore import explore
from tools.mirror.render import one_line, pretty, state_vars

import layout_sm.daemon as daemon_module
from layout_sm.daemon import CLEAN

SPEC = Path(__file__).resolve().parents[2] / "spec"


def _variant(tmp: Path, model: str, **constants: str) -> Path:
    """A copy of spec/ where ``model``'s constants are overridden (smaller, faster variants)."""
    out = tmp / "spec"
    shutil.copytree(SPEC, out)
    cfg = out / f"{model}.cfg"
    text = cfg.read_text()
    for key, value in constants.items():
        text, n = re.subn(rf"^(\s*{key}\s*=\s*).*$", rf"\g<1>{value}", text, flags=re.M)
        assert n == 1, key
    cfg.write_text(text)
    return out


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("mirror")
    spec = _variant(tmp, "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")
    dot = tmp / "MCSmall.dot"
    res = explore(spec, "MCSmall", dot, progress=None)
    return dot, res


def test_explorer_passes_on_a_smaller_mcsmall(small_graph: tuple[Path, object]) -> None:
    dot, res = small_graph
    assert res.ok, "\n".join(res.violations[:1])
    assert res.states > 500 and res.edges > res.states and res.depth > 15
    g = load_dot(dot)
    assert len(g.texts) == res.states and len(g.edges) == res.edges and len(g.initial) == 1


def test_explorer_passes_on_mcsmall() -> None:
    res = explore(SPEC, "MCSmall", None, progress=None)
    assert res.ok, res.violations[0]
    # The spec's own count (tools/oracle/spec.py), which TLC's distinct states must equal.
    assert (res.states, res.edges) == (14558, 49902)


def test_explorer_passes_on_mcchunks() -> None:
    """Single-layer chunks: TLC's graph has 88,389 states and 323,580 edges, depth 41 (spec/README.md)."""
    res = explore(SPEC, "MCChunks", None, progress=None)
    assert res.ok, res.violations[0]
    assert (res.states, res.edges, res.depth) == (88389, 323580, 41)


@pytest.mark.parametrize(("model", "counts"), [("MCRepair", (14400, 51514)), ("MCRepairFails", (21860, 87568))])
def test_explorer_passes_on_the_repair_models(model: str, counts: tuple[int, int]) -> None:
    """The repair of a torn move: TLC's graphs have these states and edges (spec/README.md),
    and the mirror's graphs equal them (tools.mirror.compare against TLC's dump)."""
    res = explore(SPEC, model, None, progress=None)
    assert res.ok, res.violations[0]
    assert (res.states, res.edges) == counts


def test_explorer_finds_a_repair_that_forgets_the_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of the mirror's environment: the reload restores nothing, so the repaired daemon's
    clean record is not its memory (CleanRecordIsTruth)."""
    from tools.mirror import system as system_module

    original = system_module.System.RepairDone

    def repair_done_without_reload(self: Any, s: Any, r: int) -> Any:
        nxt = original(self, s, r)
        return None if nxt is None else system_module.replace(nxt, truth=s.truth)

    monkeypatch.setattr(system_module.System, "RepairDone", repair_done_without_reload)
    res = explore(SPEC, "MCRepair", None, progress=None)
    assert not res.ok and any("CleanRecordIsTruth" in v for v in res.violations), res.violations[:1]


def test_explorer_passes_on_the_rejoin_model() -> None:
    """A daemon lost and its rejoin: TLC's graph has these states and edges (spec/README.md), the
    self-loops of losing a daemon that holds nothing included."""
    res = explore(SPEC, "MCRejoin", None, progress=None)
    assert res.ok, res.violations[0]
    assert (res.states, res.edges, res.depth) == (50081, 374597, 37)


def test_explorer_finds_a_rejoin_that_reloads_only_some_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of layout_sm: the daemon's rejoin takes the record but reloads only the first layer (its
    outcome records a torn move of layer 0): the rejoined daemon's clean record is not its memory."""
    from dataclasses import replace

    from layout_sm import ladders

    rejoin = ladders.LADDERS["rejoin"]
    whole = rejoin.accepted.change
    assert whole is not None

    def first_layer_only(view: Any, req: Any) -> Any:
        after = whole(view, req)
        return after.evolve(dirty=replace(after.dirty, layers=(0,)))

    monkeypatch.setitem(
        ladders.LADDERS, "rejoin", replace(rejoin, accepted=replace(rejoin.accepted, change=first_layer_only))
    )
    res = explore(SPEC, "MCRejoin", None, progress=None)
    assert not res.ok and any("CleanRecordIsTruth" in v for v in res.violations), res.violations[:1]


def test_explorer_finds_a_broken_begin_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of layout_sm: begin ignores the other attached engines (the conjunct ``alone``, which
    the daemon machine's begin guard and begin's ladder both ask, always holds)."""
    monkeypatch.setattr(daemon_module.DaemonView, "alone", lambda self, engine_id: True)
    spec = _variant(tmp_path, "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")
    res = explore(spec, "MCSmall", None, progress=None)
    assert not res.ok
    assert any("BeginsAlone" in v or "SafeRouting" in v for v in res.violations), res.violations[:1]


def test_explorer_finds_a_guard_dropped_from_the_daemon_machines_declaration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mirror's daemons run the transitions that ``DaemonMachine`` declares (the table its fast
    path derives from the class): with ``alone`` dropped from begin's declared guards, a daemon
    takes a move while another engine is attached, as the fast path's own test shows
    (tests/layout_sm/test_daemon_machine.py), and the explorer finds the spec's rule broken."""
    without_guard(monkeypatch, "begin", CLEAN, "alone")
    spec = _variant(tmp_path, "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")
    res = explore(spec, "MCSmall", None, progress=None)
    assert not res.ok
    assert any("BeginsAlone" in v or "SafeRouting" in v for v in res.violations), res.violations[:1]


def _rerendered(g: StateGraph, shift: int = 7) -> str:
    """The same graph written again: new ids, values re-printed from their one-line form."""
    lines = ["strict digraph DiskGraph {", "subgraph cluster_graph {"]
    for sid, text in sorted(g.texts.items(), reverse=True):
        printed = "\n".join(f"/\\ {k} = {pretty(one_line(v))}" for k, v in state_vars(text).items())
        style = ",style = filled]" if sid in g.initial else f',tooltip="{escape(printed)}"];'
        lines.append(f'{sid + shift} [label="{escape(printed)}"{style}')
    for e in reversed(g.edges):
        lines.append(f'{e.src + shift} -> {e.dst + shift} [label="{e.action.label}",color="black",fontcolor="black"];')
    lines += ["}", "}"]
    return "\n".join(lines)


def test_compare_reports_equality_of_a_rerendering(small_graph: tuple[Path, object], tmp_path: Path) -> None:
    dot, _ = small_graph
    again = tmp_path / "again.dot"
    again.write_text(_rerendered(load_dot(dot)))
    assert compare_graphs(load_dot(dot), load_dot(again)).equal
    assert compare_main([str(dot), str(again)]) == 0


def test_compare_reports_a_changed_state_and_a_missing_edge(small_graph: tuple[Path, object], tmp_path: Path) -> None:
    dot, _ = small_graph
    g = load_dot(dot)
    changed_id = next(sid for sid in g.texts if sid not in g.initial)
    g.texts[changed_id] = g.texts[changed_id].replace("/\\ moves = ", "/\\ moves = 9")
    dropped = g.edges.pop(len(g.edges) // 2)
    diff = compare_graphs(load_dot(dot), g)
    assert not diff.equal
    assert len(diff.only_a_states) == 1 and len(diff.only_b_states) == 1
    assert "moves=9" in diff.only_b_states[0]
    # the changed state's edges differ too; the dropped edge is among those only in A
    assert any(e[1] == "".join(dropped.action.label.split()) for e in diff.only_a_edges)
    bad = tmp_path / "bad.dot"
    bad.write_text(_rerendered(g))
    assert compare_main([str(dot), str(bad), "--max", "2"]) == 1


def _busy_turns_off() -> type[StateMachine]:
    """``layout_sm.engine_machines.RebalanceMachine`` with one rule broken in its declaration: a chunk that
    a daemon answered busy, beside ok begins, is aborted and turns rebalancing off for good (the
    action of a refusal), instead of pausing. Made from the product's own declaration, so that the
    rest of it stays the product's."""
    import layout_sm.engine_machines as machines

    source = inspect.getsource(machines.RebalanceMachine)
    rule = 'beginning.to(aborting, cond="every_rank_began and any_ok", on="pause_after_aborts")'
    assert source.count(rule) == 1, "the rule this test breaks is no longer declared so"
    broken = source.replace(rule, rule.replace("pause_after_aborts", "stop_after_aborts"))
    namespace = dict(vars(machines))
    exec(broken.replace("class RebalanceMachine(", "class BusyTurnsOff(", 1), namespace)
    return namespace["BusyTurnsOff"]


BusyTurnsOff = _busy_turns_off()


def test_the_copy_differs_from_the_declaration_in_one_rule() -> None:
    from layout_sm.declared import Declared
    from layout_sm.engine_machines import EngineState, RebalanceMachine

    ours = Declared.of(RebalanceMachine, EngineState, "rebalance").rules
    theirs = Declared.of(BusyTurnsOff, EngineState, "rebalance").rules

    def rules(table):  # type: ignore[no-untyped-def]
        return {k: [(r.target, [(g.name, g.expected) for g in r.guards], [a.name for a in r.actions]) for r in v]
                for k, v in table.items()}  # fmt: skip

    a, b = rules(ours), rules(theirs)
    assert [k for k in a if a[k] != b[k]] == [("beginning", "decide")]
    ours_decide, theirs_decide = a[("beginning", "decide")], b[("beginning", "decide")]
    assert [i for i, rule in enumerate(ours_decide) if rule != theirs_decide[i]] == [3]


@pytest.mark.parametrize("statemachine", [False, True], ids=["tables", "statemachine"])
def test_a_rule_broken_in_the_declaration_fails_the_mirror_and_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, statemachine: bool
) -> None:
    """The declaration is the one source: broken there, the mirror's graph (explored with either
    engine) leaves the spec's, and the session's own steps (the data-driven chunk scenarios,
    run on the declared tables the engines run) change too."""
    from tests.layout_sm.datadriven import run_file
    from tests.layout_sm.datadriven_session import SessionRunner

    from layout_sm import session

    spec = _variant(tmp_path, "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")
    assert explore(spec, "MCSmall", tmp_path / "mirror.dot", progress=None, statemachine=statemachine).ok
    chunks = Path(__file__).parents[1] / "layout_sm" / "testdata" / "session" / "03_chunks.txt"
    written, produced = run_file(chunks, SessionRunner())
    assert written == produced
    monkeypatch.setattr(session, "RebalanceMachine", BusyTurnsOff)  # the class the session reads its table from
    explore(spec, "MCSmall", tmp_path / "mutant.dot", progress=None, stop_on_violation=False, statemachine=statemachine)
    diff = compare_graphs(load_dot(tmp_path / "mirror.dot"), load_dot(tmp_path / "mutant.dot"))
    assert not diff.equal
    written, produced = run_file(chunks, SessionRunner())
    assert written != produced
    assert "pause(busy)" in written.split("begin 1 busy")[1] and "stop(refused)" in produced.split("begin 1 busy")[1]


def test_both_engines_explore_the_same_graph(tmp_path: Path) -> None:
    """python-statemachine's engine and the declared tables read the same classes the same way."""
    spec = _variant(tmp_path, "MCSmall", DaemonRestarts="FALSE", MaxMoves="1")
    assert explore(spec, "MCSmall", tmp_path / "tables.dot", progress=None).ok
    assert explore(spec, "MCSmall", tmp_path / "statemachine.dot", progress=None, statemachine=True).ok
    assert compare_graphs(load_dot(tmp_path / "tables.dot"), load_dot(tmp_path / "statemachine.dot")).equal
