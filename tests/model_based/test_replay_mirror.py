"""Replay every committed behaviour against the mirror (the `layout_sm` machines composed by `layout_model.system`).

After each step the mirror's state, rendered as TLA+, must equal the state in the suite (TLC's,
or until TLC's graphs arrive the explorer's own), and the actions the mirror enables there must
be exactly the edges the graph lists out of that state.
"""

from __future__ import annotations

import os
import time
from functools import cache
from typing import Any

import pytest

from layout_model.system import System, load_model
from layout_model.tlc_formats import Suite
from layout_model.values import decode_state_text
from tests.model_based.suites import MODELS, REGENERATE, SPEC, spec_hashes, suite_path

MAX_REPORTED = 8


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


def _same_state(system: System, state: Any, suite: Suite, i: int) -> tuple[bool, bool]:
    """(equal as values, equal as text): text first, the decoded values decide."""
    text = system.render(state)
    if text == suite.texts[i]:
        return True, True
    return decode_state_text(text) == suite.state(i), False


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
                    f"{name} step {n + 1} {label}: mirror state\n{system.render(out[label])}\n"
                    f"differs from the suite's\n{suite.texts[j]}"
                )
                bad.add(j)
                break
            mirror.setdefault(j, out[label])
            i = j
        else:
            successors(i, f"{name} at its end")
    return problems, stats


@pytest.mark.parametrize("model", MODELS)
def test_replay_every_behaviour_against_the_mirror(model: str) -> None:
    if model != "MCSmall" and os.environ.get("LAYOUT_TEST_PROFILE") == "mutants":
        pytest.skip("`make mutants` replays MCSmall only against the mirror")
    suite = load(model)
    t0 = time.monotonic()
    problems, stats = replay(model, suite)
    print(f"{model}: replayed {stats} in {time.monotonic() - t0:.1f} s")
    assert not problems, f"{len(problems)} behaviour(s) of {model} disagree with the mirror:\n" + "\n".join(
        problems[:MAX_REPORTED]
    )
    assert stats["behaviours"] == len(suite.paths)
    assert stats["steps"] == suite.manifest["steps"]
    assert stats["states_checked"] == suite.manifest["suite_states"]


@pytest.mark.parametrize("model", MODELS)
def test_mirror_prints_states_exactly_as_the_graph(model: str) -> None:
    suite = load(model)
    if suite.manifest["source"] != "tlc":
        pytest.skip("the suite comes from the mirror's own dump: its text is the mirror's by construction")
    _, stats = replay(model, suite)
    assert stats["text_differs"] == 0, f"{stats['text_differs']} states equal as values but printed otherwise"
