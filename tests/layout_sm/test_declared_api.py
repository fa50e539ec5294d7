"""What ``layout_sm.declared`` reads of python-statemachine beyond its documented API, pinned and held here.

The runner reads each transition's callback specs (``transition.cond``, ``.on`` and the other groups) and,
of each spec, ``func``, ``is_convention``, ``attr_name``, ``expected_value`` and ``group``: attributes the
library's documentation does not promise. ``pyproject.toml`` pins the version (``python-statemachine==``);
these tests fail on a version where those attributes are gone or mean something else, before any machine
runs differently. The guard expressions the runner reads itself (``"a and not b"``) are held to the
library's own evaluation of the same expressions.
"""

from __future__ import annotations

import re
from pathlib import Path

import statemachine
from statemachine import State, StateMachine
from statemachine.exceptions import TransitionNotAllowed

from layout_sm.declared import Declared

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


class Sample(StateMachine):
    a = State(initial=True)
    b = State(final=True)
    go = a.to(b, cond="first and not second", unless="third", on="act")

    def __init__(self, truths: dict[str, bool]) -> None:
        self.truths, self.acted = truths, False
        super().__init__()

    def first(self) -> bool:
        return self.truths["first"]

    def second(self) -> bool:
        return self.truths["second"]

    def third(self) -> bool:
        return self.truths["third"]

    def act(self) -> None:
        self.acted = True


def test_the_version_declared_reads_is_the_pinned_one() -> None:
    pinned = re.search(r'"python-statemachine==([^"]+)"', PYPROJECT.read_text())
    assert pinned is not None and statemachine.__version__ == pinned.group(1)


def test_the_callback_specs_carry_what_the_runner_reads() -> None:
    (transition,) = Sample.a.transitions
    cond = list(transition.cond)
    assert [(spec.func, spec.expected_value, spec.is_convention) for spec in cond] == [
        ("first and not second", True, False),
        ("third", False, False),
    ]
    assert all(isinstance(spec.attr_name, str) for spec in cond)
    (action,) = [spec for spec in transition.on if not spec.is_convention]
    assert action.func == "act" and action.group is not None and action.group.name == "ON"


def test_the_runner_reads_a_guard_as_the_library_evaluates_it() -> None:
    table = Declared(Sample, Sample, "current_state_value")
    (rule,) = table.rules[("a", "go")]
    assert [(g.name, g.expected) for g in rule.guards] == [("first", True), ("second", False), ("third", False)]
    for first in (False, True):
        for second in (False, True):
            for third in (False, True):
                machine = Sample({"first": first, "second": second, "third": third})
                ours = rule.allows(machine, machine, {})
                try:
                    machine.send("go")
                    theirs = True
                except TransitionNotAllowed:
                    theirs = False
                assert ours == theirs == (first and not second and not third), (first, second, third)
