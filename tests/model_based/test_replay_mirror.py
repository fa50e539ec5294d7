"""Replay every committed behaviour against the mirror (the `layout_sm` machines composed by `tools.mirror.system`).

After each step the mirror's state, rendered as TLA+, must equal the state in the suite (TLC's
text: the suites are derived from TLC's own graphs), and the actions the mirror enables there must
be exactly the edges the graph lists out of that state. The mirror prints the variables in the
order TLC does (`tools.mirror.render.sany_variable_order`, fitted to TLC's graph when the suite is
derived and recorded in its manifest), so the texts must be equal character for character.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import pytest
from tools.mirror.dot import load_dot
from tools.mirror.render import reorder_state, sany_variable_order
from tools.mirror.system import VARIABLES, System, load_model
from tools.mirror.tlc_formats import Suite

from tests.model_based.suites import (
    MODELS,
    REGENERATE,
    SPEC,
    spec_hashes,
    suite_path,
    tlc_dir,
    tlc_graph,
    tlc_spec_hashes,
)

MAX_REPORTED = 8
MUTANTS = os.environ.get("LAYOUT_TEST_PROFILE") == "mutants"  # `make mutants`: one run per mutant


@cache
def load(model: str) -> Suite:
    path = suite_path(model)
    if not path.exists():
        pytest.fail(f"no committed suite for {model} at {path}; build it with `{REGENERATE}`")
    return Suite.load(path)


@pytest.mark.parametrize("model", MODELS)
def test_suite_was_derived_from_this_spec(model: str) -> None:
    manifest = load(model).manifest
    now = spec_hashes(model)
    stale = {f: (manifest["spec_sha256"].get(f), h) for f, h in now.items() if manifest["spec_sha256"].get(f) != h}
    assert not stale, (
        f"tests/model_based/traces/{model} was derived from another spec/config than spec/ "
        f"(file: (suite's SHA-256, current SHA-256)): {stale}. Regenerate the suites with `{REGENERATE}`"
        f" (or `python -m tests.model_based.suites --model {model}`) and commit them."
    )


@pytest.mark.parametrize("model", MODELS)
def test_suite_covers_every_edge(model: str) -> None:
    m = load(model).manifest
    assert m["edges_covered"] == m["reachable_edges"] == m["graph_edges"], m
    assert m["behaviours"] == len(load(model).paths) > 0


def render(system: System, state: Any, suite: Suite) -> str:
    """The mirror's state printed as the suite's graph prints states (TLC's order of the variables)."""
    order = suite.manifest.get("variable_order") or VARIABLES
    return reorder_state(system.render(state), order)


def _same_state(system: System, state: Any, suite: Suite, i: int) -> tuple[bool, bool]:
    """(equal as values, equal as text): text first, the decoded values decide."""
    text = render(system, state, suite)
    if text == suite.texts[i]:
        return True, True
    return system.spec_state(state) == suite.state(i), False


def replay(model: str, suite: Suite, limit: int | None = None) -> tuple[list[str], dict[str, int]]:
    """Replay the suite's behaviours; each distinct (state, action) step is checked once.

    The mirror is deterministic, so a step already checked from the same suite state gives the
    same mirror state again: the replay walks every behaviour but computes each edge once.
    """
    system = System(load_model(SPEC, model))
    inits = system.initial_states()
    problems: list[str] = []
    stats = {"behaviours": 0, "steps": 0, "edges_checked": 0, "states_checked": 0, "text_differs": 0}
    mirror: dict[int, Any] = {}  # suite state index -> the mirror state that equals it
    succ: dict[int, dict[str, Any]] = {}  # suite state index -> the mirror's successors by label
    bad: set[int] = set()

    def successors(i: int, where: str) -> dict[str, Any] | None:
        if i not in succ:
            out = dict(system.successors(mirror[i]))
            stats["states_checked"] += 1
            if set(out) != set(suite.enabled[i]):
                only_m, only_g = sorted(set(out) - set(suite.enabled[i])), sorted(set(suite.enabled[i]) - set(out))
                problems.append(f"{where}: enabled actions differ: mirror only {only_m}, graph only {only_g}")
                bad.add(i)
            succ[i] = out
        return None if i in bad else succ[i]

    for name, i0, steps in suite.paths[:limit]:
        stats["behaviours"] += 1
        if i0 not in mirror:
            init = next((s for s in inits if _same_state(system, s, suite, i0)[0]), None)
            if init is None:
                problems.append(f"{name}: the suite's initial state is not an initial state of the mirror")
                continue
            mirror[i0] = init
        i = i0
        for n, (label, j) in enumerate(steps):
            out = successors(i, f"{name} before step {n + 1}")
            if out is None:
                break
            stats["steps"] += 1
            if j in mirror and out[label] == mirror[j]:
                i = j
                continue
            same, same_text = _same_state(system, out[label], suite, j)
            stats["edges_checked"] += 1
            stats["text_differs"] += not same_text
            if not same:
                problems.append(
                    f"{name} step {n + 1} {label}: mirror state\n{render(system, out[label], suite)}\n"
                    f"differs from the suite's\n{suite.texts[j]}"
                )
                bad.add(j)
                break
            mirror.setdefault(j, out[label])
            i = j
        else:
            successors(i, f"{name} at its end")
    return problems, stats


@cache
def replay_all(model: str) -> tuple[list[str], dict[str, int], float]:
    """The whole suite replayed once per session (two tests read it: MCFull's replay is ~20 s)."""
    t0 = time.monotonic()
    problems, stats = replay(model, load(model))
    return problems, stats, time.monotonic() - t0


@pytest.mark.parametrize("model", MODELS)
def test_replay_every_behaviour_against_the_mirror(model: str) -> None:
    if model != "MCSmall" and MUTANTS:
        pytest.skip("`make mutants` replays MCSmall only against the mirror")
    suite = load(model)
    problems, stats, seconds = replay_all(model)
    print(f"{model}: replayed {stats} in {seconds:.1f} s")
    assert not problems, f"{len(problems)} behaviour(s) of {model} disagree with the mirror:\n" + "\n".join(
        problems[:MAX_REPORTED]
    )
    assert stats["behaviours"] == len(suite.paths)
    assert stats["steps"] == suite.manifest["steps"]
    assert stats["states_checked"] == suite.manifest["suite_states"]


@pytest.mark.parametrize("model", MODELS)
def test_mirror_prints_states_exactly_as_the_graph(model: str) -> None:
    if model != "MCSmall" and MUTANTS:
        pytest.skip("`make mutants` replays MCSmall only against the mirror")
    suite = load(model)
    if suite.manifest["source"] != "tlc":
        pytest.skip("the suite comes from the mirror's own dump: its text is the mirror's by construction")
    _, stats, _ = replay_all(model)
    assert stats["text_differs"] == 0, f"{stats['text_differs']} states equal as values but printed otherwise"


@pytest.mark.parametrize("model", MODELS)
def test_tlcs_variable_order_is_sanys_symbol_table_order(model: str) -> None:
    """TLC's print order of the variables is explained by the rule, not only recorded."""
    m = load(model).manifest
    if m["source"] != "tlc":
        pytest.skip("the suite comes from the mirror's own dump, printed in declaration order")
    assert m["sany_symbol_table"] is not None, (
        f"TLC printed {model}'s variables in an order that no java.util.Hashtable capacity explains: "
        f"{m['variable_order']}; see tools.mirror.render.sany_variable_order"
    )
    table = m["sany_symbol_table"]
    assert (
        list(sany_variable_order(VARIABLES, table["capacity"], table["variables_inserted_at"])) == m["variable_order"]
    )
    printed = [line.split(" = ")[0][3:] for line in load(model).texts[0].split("\n") if line.startswith("/\\ ")]
    assert printed == m["variable_order"]


@pytest.mark.parametrize("model", MODELS)
def test_suite_states_are_tlcs_graph_as_printed(model: str) -> None:
    """The suite's states are TLC's real graph's, text for text (../shared/tlc/ beside the clone; CI has it).

    With the replay above (the mirror prints every suite state exactly), the mirror prints every
    state of TLC's graph exactly as TLC does.
    """
    if MUTANTS:
        pytest.skip("`make mutants`: the committed suite against TLC's graph involves no code a mutant changes")
    graph = tlc_graph(model)
    if graph is None:
        pytest.skip(f"TLC's graph {model}.dot.gz is not in {tlc_dir()} (beside the clone in CI; or set LAYOUT_TLC_DIR)")
    m = load(model).manifest
    assert m["source"] == "tlc", f"the {model} suite comes from {m['source']!r}; derive it from TLC's: {REGENERATE}"
    ran_on = tlc_spec_hashes(graph.parent)
    if {f: ran_on.get(f) for f in m["spec_sha256"]} != m["spec_sha256"]:
        # Found by the SHA-256 before the graph is read: TLC's results beside the clone belong to the spec
        # that landed before this one (TLC is run on what lands), and a spec that defines more symbols
        # prints its variables in another order, so the texts cannot be compared until TLC has run on it.
        pytest.skip(
            f"{graph} was dumped from another spec than the committed {model} suite (SHA-256 in "
            f"{graph.parent / 'README.md'}): it cannot judge this suite"
        )
    states = set(load_dot(graph, edges=False).texts.values())
    texts = set(load(model).texts)
    assert len(states) == m["graph_states"] == len(texts), (len(states), m["graph_states"], len(texts))
    assert texts == states, f"{len(texts - states)} suite states are not printed as in {graph}"
