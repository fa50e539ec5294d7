"""Structural cross-check between the spec and the mirror (``tools.mirror.system``).

Why: the graphs can only be equal if the mirror has exactly the spec's actions (same names,
same parameters) and maps every spec variable; this fails fast, before any exploration.
"""

from __future__ import annotations

import re
from pathlib import Path

from tools.mirror import check_spec
from tools.mirror.invariants import ACTION_PROPERTIES, INVARIANTS, LIVENESS
from tools.mirror.system import EVENTS, VARIABLE_SOURCES, VARIABLES, System, load_model

SPEC = Path(__file__).resolve().parents[2] / "spec"
TEXT = (SPEC / "LayoutProtocol.tla").read_text()


def _next_actions() -> dict[str, tuple[str, ...]]:
    body = re.search(r"^Next ==\n(.*?)\n\n", TEXT, re.M | re.S)
    assert body is not None, "no Next definition"
    out = {}
    for disjunct in re.findall(r"^\s*\\/ (.*)$", body.group(1), re.M):
        m = re.search(r"(\w+)\(([^)]*)\)\s*$", disjunct) or re.search(r"(\w+)\s*$", disjunct)
        assert m is not None, disjunct
        params = tuple(p.strip() for p in m.group(2).split(",")) if m.lastindex == 2 else ()
        out[m.group(1)] = params
    return out


def _spec_variables() -> tuple[str, ...]:
    block = re.search(r"^VARIABLES\n(.*?)\n\n", TEXT, re.M | re.S)
    assert block is not None
    return tuple(re.findall(r"^\s*(\w+),?\s*(?:\\\*.*)?$", block.group(1), re.M))


def test_every_spec_action_has_a_mirror_event_and_back() -> None:
    spec = _next_actions()
    assert set(spec) == set(EVENTS), (sorted(set(spec) - set(EVENTS)), sorted(set(EVENTS) - set(spec)))
    assert spec == EVENTS  # same parameters, in the same order


def test_action_definitions_take_the_same_parameters() -> None:
    for name, params in EVENTS.items():
        m = re.search(rf"^{name}\(([^)]*)\) ==", TEXT, re.M)
        assert m is not None, f"no definition of {name}"
        assert tuple(p.strip() for p in m.group(1).split(",")) == params, name


def test_every_event_is_a_method_of_the_system() -> None:
    system = System(load_model(SPEC, "MCSmall"))
    for name in EVENTS:
        assert callable(getattr(system, name, None)), name


def test_every_spec_variable_is_mapped() -> None:
    spec_vars = _spec_variables()
    assert spec_vars == VARIABLES
    assert set(VARIABLE_SOURCES) == set(VARIABLES)
    vars_tuple = re.search(r"^vars == <<(.*?)>>", TEXT, re.M | re.S)
    assert vars_tuple is not None
    assert tuple(v.strip() for v in vars_tuple.group(1).split(",")) == VARIABLES


def test_every_checked_property_has_a_python_twin() -> None:
    for model in check_spec.MODELS:
        m = load_model(SPEC, model)
        assert set(m.invariants) <= set(INVARIANTS), model
        assert set(m.properties) <= set(ACTION_PROPERTIES) | set(LIVENESS), model
