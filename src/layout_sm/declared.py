"""The one runner of this package's machines: a python-statemachine class's declared transitions,
taken without its event loop.

Why: python-statemachine runs every event through its processing loop (queues, callback
registries, signature binding), which costs far more than the guards themselves, and the chunk
protocol takes a step per reply. ``Declared.of(machine_class, model_class, state_field)`` reads the
class's declarations once (its states, its transitions in declaration order, the names of their
``cond``/``unless`` guards and ``on`` actions) into a table, and ``fire`` takes an event as
python-statemachine would: the first transition out of the current state whose guards all hold
runs its actions, then the model's ``state_field`` becomes the target; no such transition raises
``TransitionNotAllowed``. The class stays the one source, for the diagrams, for python-statemachine's
own engine (the reference the tests compare this runner with) and for this table.

What the table supports is what the machines here declare: guards and actions named by strings
(a guard may be ``"a and b and not c"``), each a method of the machine class or, when the machine
has none of that name, of the model class (python-statemachine looks names up in that order),
each given the event's arguments that its signature names (``event`` among them). A method is
looked up by name when it runs, so a method replaced on its class (a mutant of a rule) is what runs.
Anything else in a class (validators, ``before`` or ``after`` callbacks, naming-convention callbacks
such as ``on_enter_<state>``) is refused when the table is built, so the table cannot silently differ
from python-statemachine's reading of the same class.

Of each transition's callback specs the table reads ``func``, ``is_convention``, ``attr_name``,
``expected_value`` and ``group``, which python-statemachine's documentation does not promise: its version
is pinned (``pyproject.toml``), and ``tests/layout_sm/test_declared_api.py`` holds those attributes and the
reading of a guard expression to the library's own, so a new version that changes them fails there first.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from statemachine import StateMachine
from statemachine.exceptions import TransitionNotAllowed

_NAME = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Call:
    """One guard or action: a method of the machine or of the model, and the event arguments it takes."""

    name: str
    params: tuple[str, ...]
    expected: bool = True  # for a guard: the value it must have (False: ``unless`` or ``not``)
    on_machine: bool = False  # a method of the machine class (run on the host), else of the model

    def __call__(self, host: Any, model: Any, arguments: Mapping[str, Any]) -> Any:
        method = getattr(host if self.on_machine else model, self.name)
        return method(*map(arguments.__getitem__, self.params))


@dataclass(frozen=True)
class Rule:
    """One declared transition: its guards, its actions and its target state's value."""

    event: str
    source: str
    target: str
    guards: tuple[Call, ...]
    actions: tuple[Call, ...]

    def allows(self, host: Any, model: Any, arguments: Mapping[str, Any]) -> bool:
        """Every guard holds, asked in order and stopping at the first that does not."""
        for guard in self.guards:
            method = getattr(host if guard.on_machine else model, guard.name)
            if bool(method(*[arguments[p] for p in guard.params])) is not guard.expected:
                return False
        return True


class Declared:
    """The table of one machine class over one model class (see the module docstring)."""

    def __init__(self, machine: type[StateMachine], model: type, state_field: str) -> None:
        self.machine = machine
        self.state_field = state_field
        self.states = {s.value: s for s in machine.states}
        rules: dict[tuple[str, str], list[Rule]] = {}
        for state in machine.states:
            for transition in state.transitions:
                guards, actions = _calls(machine, model, transition)
                for event in transition.events:
                    rule = Rule(str(event), state.value, transition.target.value, guards, actions)
                    rules.setdefault((state.value, str(event)), []).append(rule)
        self.rules = {key: tuple(value) for key, value in rules.items()}
        self.events = frozenset(event for _, event in self.rules)

    @classmethod
    @cache
    def of(cls, machine: type[StateMachine], model: type, state_field: str) -> Declared:
        """Built once per (machine class, model class, state field)."""
        return cls(machine, model, state_field)

    def rule(self, model: Any, event: str, arguments: Mapping[str, Any], host: Any = None) -> Rule:
        """The transition ``event`` takes from the model's state now (raises when none may)."""
        state = getattr(model, self.state_field)
        for rule in self.rules.get((state, event), ()):
            if rule.allows(host, model, arguments):
                return rule
        raise TransitionNotAllowed(_event(self.machine, event), {self.states[state]})

    def fire(self, model: Any, event: str, /, **kwargs: Any) -> Any:
        """Take ``event``: run the actions of the transition it takes, then enter its target.

        Returns what the last action returned (python-statemachine's ``send`` returns it too).
        """
        return self.fire_on(None, model, event, {"event": event, **kwargs})

    def fire_on(self, host: Any, model: Any, event: str, arguments: Mapping[str, Any]) -> Any:
        """``fire``, with ``host`` (an instance of the machine class) for the machine's own methods
        and the event's ``arguments`` as a mapping (``event`` among them, when a callback names it)."""
        rule, result = self.take(host, model, event, arguments)
        setattr(model, self.state_field, rule.target)
        return result

    def take(self, host: Any, model: Any, event: str, arguments: Mapping[str, Any]) -> tuple[Rule, Any]:
        """The transition ``event`` takes, with its actions run, before its target is entered: for a
        machine whose state is read off its model rather than written (the daemon's phase is its view's)."""
        rule = self.rule(model, event, arguments, host)
        result = None
        for action in rule.actions:
            result = action(host, model, arguments)
        return rule, result


def _calls(machine: type[StateMachine], model: type, transition: Any) -> tuple[tuple[Call, ...], tuple[Call, ...]]:
    """A transition's guards and actions, read from python-statemachine's public callback groups."""
    for group in (transition.validators, transition.before, transition.on, transition.after, transition.cond):
        for spec in group:
            if spec.is_convention:
                if hasattr(machine, spec.attr_name) or hasattr(model, spec.attr_name):
                    raise TypeError(f"{machine.__name__}: convention callback {spec.attr_name!r} is not supported")
            elif group is not transition.cond and group is not transition.on:
                raise TypeError(f"{machine.__name__}: {spec.group.name.lower()} callbacks are not supported")
    guards: list[Call] = []
    for spec in transition.cond:
        if not isinstance(spec.func, str):
            raise TypeError(f"{machine.__name__}: guards must be named by strings, not {spec.func!r}")
        for name, expected in _conjuncts(spec.func):
            guards.append(_call(machine, model, name, expected is spec.expected_value))
    actions: list[Call] = []
    for spec in transition.on:
        if spec.is_convention:
            continue
        if not isinstance(spec.func, str):
            raise TypeError(f"{machine.__name__}: actions must be named by strings, not {spec.func!r}")
        actions.append(_call(machine, model, spec.func))
    for state in (transition.source, transition.target):
        for name in (f"on_enter_{state.id}", f"on_exit_{state.id}", "on_enter_state", "on_exit_state"):
            if hasattr(machine, name) or hasattr(model, name):
                raise TypeError(f"{machine.__name__}: convention callback {name!r} is not supported")
    return tuple(guards), tuple(actions)


def _conjuncts(expression: str) -> list[tuple[str, bool]]:
    """``"a and not b"`` as [("a", True), ("b", False)]; only ``and`` and ``not`` are supported."""
    out = []
    for term in expression.split(" and "):
        words = term.split()
        expected = True
        if len(words) == 2 and words[0] == "not":
            words, expected = words[1:], False
        if len(words) != 1 or not _NAME.fullmatch(words[0]):
            raise TypeError(f"guard {expression!r}: only names joined by 'and' (and 'not name') are supported")
        out.append((words[0], expected))
    return out


def _call(machine: type[StateMachine], model: type, name: str, expected: bool = True) -> Call:
    # python-statemachine looks a name up on the machine before the model: so does the table.
    on_machine = any(name in vars(base) for base in machine.__mro__ if base not in StateMachine.__mro__)
    function = getattr(machine if on_machine else model, name, None)
    if not callable(function):
        raise TypeError(f"{machine.__name__}: {name!r} is not a method of it or of {model.__name__}")
    parameters = list(inspect.signature(function).parameters.values())[1:]
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not p.empty for p in parameters):
        raise TypeError(f"{model.__name__}.{name}: only plain parameters (the event's arguments) are supported")
    return Call(name, tuple(p.name for p in parameters), expected, on_machine)


def _event(machine: type[StateMachine], event: str) -> Any:
    for candidate in machine.events:
        if candidate.id == event:
            return candidate
    return None


__all__ = ["Call", "Declared", "Rule"]
