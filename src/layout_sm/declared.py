"""A python-statemachine class's declared transitions, evaluated directly from a table.

Why: python-statemachine runs every event through its processing loop (queues, callback
registries, signature binding), which costs hundreds of microseconds an event; the engine's
chunk protocol takes a step per reply. ``Declared.of(machine_class, model_class, state_field)``
reads the class's declarations once (its states, its transitions in declaration order, and the
names of their ``cond``/``unless`` guards and ``on`` actions) into a table, and ``fire`` takes an
event as python-statemachine would: the first transition out of the current state whose guards
hold runs its actions, then the model's ``state_field`` becomes the target; no transition raises
``TransitionNotAllowed``. Nothing is declared twice: the class stays the one source, for the
diagrams, for python-statemachine's own engine and for this table.

What the table supports is what the machines here declare: guards and actions named by strings
(a guard may be ``"a and b and not c"``), each a method of the machine class or, when the machine
has none of that name, of the model class (python-statemachine looks names up in that order),
each given the event's keyword arguments its signature names. A machine-class method runs on the
instance handed to ``fire`` as ``host`` (so a machine built once can be reused). Anything else in
a class (validators, ``before`` or ``after`` callbacks, naming-convention callbacks such as
``on_enter_<state>``) is refused when the table is built, so the table cannot silently differ
from python-statemachine's reading of the same class.
"""

from __future__ import annotations

import inspect
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

from statemachine import StateMachine
from statemachine.callbacks import CallbackGroup
from statemachine.exceptions import TransitionNotAllowed

_NAME = re.compile(r"[A-Za-z_]\w*")
# What a part of a compiled guard may be: a name, ``name.name`` or ``name['name']``.
_SOURCE_PART = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\['[A-Za-z_]\w*'\])?")


@dataclass(frozen=True)
class Call:
    """One guard or action: a method of the machine or of the model, and the event arguments it takes."""

    name: str
    function: Callable[..., Any]
    params: tuple[str, ...]
    expected: bool = True  # for a guard: the value it must have (False: ``unless`` or ``not``)
    on_machine: bool = False  # a method of the machine class (run on the host), else of the model
    # ``invoke(receiver, kwargs)``: the call on the host or the model, made once for its parameters
    # (a step makes a dozen calls).
    invoke: Callable[[Any, dict[str, Any]], Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "invoke", _invoker(self.name, self.params))

    def __call__(self, host: Any, model: Any, kwargs: dict[str, Any]) -> Any:
        return self.invoke(host if self.on_machine else model, kwargs)


def _invoker(name: str, params: tuple[str, ...]) -> Callable[[Any, dict[str, Any]], Any]:
    # Looked up by name on every call, as python-statemachine resolves it: a method replaced on the
    # class (a mutant of a rule) is the one that runs.
    if not params:
        return lambda receiver, kwargs: getattr(receiver, name)()
    if len(params) == 1:
        (one,) = params
        return lambda receiver, kwargs: getattr(receiver, name)(kwargs[one])
    return lambda receiver, kwargs: getattr(receiver, name)(*[kwargs[p] for p in params])


@dataclass(frozen=True)
class Rule:
    """One declared transition: its guards, its actions and its target state's value."""

    event: str
    source: str
    target: str
    guards: tuple[Call, ...]
    actions: tuple[Call, ...]
    # Whether every guard holds (``all_hold``), compiled once: ``allows(host, model, kwargs)``.
    allows: Callable[[Any, Any, dict[str, Any]], bool] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        terms = [(_call_source(g), g.expected) for g in self.guards]
        object.__setattr__(self, "allows", all_hold(("host", "model", "kwargs"), terms))


def call_source(receiver: str, method: str, arguments: Sequence[str]) -> str:
    """``receiver.method(arguments...)`` as Python source, for ``all_hold``: the method is looked up by
    name when it runs (a method replaced on the class is what runs). Every part must be a name or a
    dotted or subscripted name; anything else is refused."""
    for part in (receiver, method, *arguments):
        if not _SOURCE_PART.fullmatch(part):
            raise ValueError(f"{part!r} cannot be part of a declared guard")
    return f"{receiver}.{method}({', '.join(arguments)})"


def _call_source(call: Call) -> str:
    """``call`` over ``host``, ``model`` and ``kwargs``, as ``Call.invoke`` makes it."""
    return call_source("host" if call.on_machine else "model", call.name, [f"kwargs[{p!r}]" for p in call.params])


def all_hold(params: tuple[str, ...], terms: Sequence[tuple[str, bool]]) -> Callable[..., bool]:
    """One function of ``params`` telling whether every term (a Python expression over them, and the
    truth it must have) has it, asked in order and stopping at the first that does not. A machine asks
    a transition's guards on every step: compiled once, one call asks them all, where a call per guard
    costs as much again as the guards themselves. The callers build the terms from the names of
    declared methods and of their parameters only (``call_source``)."""
    body = " and ".join(f"({expression})" if expected else f"not ({expression})" for expression, expected in terms)
    source = f"def all_hold({', '.join(params)}):\n    return bool({body or 'True'})\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<declared guards>", "exec"), namespace)
    return cast(Callable[..., bool], namespace["all_hold"])


# A field of a declared text that ``text_maker`` compiles: a path of attributes (``req.engine_id``).
_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def text_maker(text: str, fields: dict[str, str]) -> Callable[[Any], tuple[str, dict[str, Any]]] | None:
    """One function of ``words`` making ``(text.format_map(words), {field: words[path]})``, where
    ``words[path]`` reads ``path`` as attributes of ``words``: compiled once, where ``format_map``
    asks each word through ``__getitem__`` on every reply. The same words in the same order, and
    the same formatting (``format(value, spec)`` after the conversion). None when a field of
    ``text`` or a path in ``fields`` is more than a path of attributes: the caller formats as before."""
    parts: list[str] = []
    constants: dict[str, Any] = {"_format": format, "_repr": repr, "_ascii": ascii}
    for literal, name, spec, conversion in string.Formatter().parse(text):
        if literal:
            constants[f"_t{len(constants)}"] = literal
            parts.append(f"_t{len(constants) - 1}")
        if name is None:
            continue
        if not _PATH.fullmatch(name) or (spec and "{" in spec) or conversion not in (None, "r", "s", "a"):
            return None
        value = f"words.{name}"
        if conversion is not None:
            value = {"r": "_repr", "s": "str", "a": "_ascii"}[conversion] + f"({value})"
        constants[f"_t{len(constants)}"] = spec
        parts.append(f"_format({value}, _t{len(constants) - 1})")
    if not all(_NAME.fullmatch(f) and _PATH.fullmatch(p) for f, p in fields.items()):
        return None
    data = ", ".join(f"{f!r}: words.{p}" for f, p in fields.items())
    source = f"def make_text(words):\n    return ''.join(({', '.join(parts)}{',' if parts else ''})), {{{data}}}\n"
    exec(compile(source, "<declared text>", "exec"), constants)
    return cast(Callable[[Any], tuple[str, dict[str, Any]]], constants["make_text"])


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

    def rule(self, model: Any, event: str, kwargs: dict[str, Any], host: Any = None) -> Rule:
        """The transition ``event`` takes from the model's state now (raises when none may)."""
        state = getattr(model, self.state_field)
        for rule in self.rules.get((state, event), ()):
            if rule.allows(host, model, kwargs):
                return rule
        raise TransitionNotAllowed(_event(self.machine, event), {self.states[state]})

    def fire(self, model: Any, event: str, /, **kwargs: Any) -> Any:
        """Take ``event``: run the actions of the transition it takes, then enter its target.

        Returns what the last action returned (python-statemachine's ``send`` returns it too).
        """
        return self.fire_on(None, model, event, **kwargs)

    def fire_on(self, host: Any, model: Any, event: str, /, **kwargs: Any) -> Any:
        """``fire``, with ``host`` (an instance of the machine class) for the machine's own methods."""
        rule = self.rule(model, event, kwargs, host)
        result = None
        for action in rule.actions:
            result = action(host, model, kwargs)
        setattr(model, self.state_field, rule.target)
        return result


def _calls(machine: type[StateMachine], model: type, transition: Any) -> tuple[tuple[Call, ...], tuple[Call, ...]]:
    guards: list[Call] = []
    actions: list[Call] = []
    for spec in transition._specs:
        if spec.is_convention:
            if hasattr(machine, spec.attr_name) or hasattr(model, spec.attr_name):
                raise TypeError(f"{machine.__name__}: convention callback {spec.attr_name!r} is not supported")
            continue
        if not isinstance(spec.func, str):
            raise TypeError(f"{machine.__name__}: callbacks must be named by strings, not {spec.func!r}")
        if spec.group is CallbackGroup.COND:
            for name, expected in _conjuncts(spec.func):
                guards.append(_call(machine, model, name, expected is spec.expected_value))
        elif spec.group is CallbackGroup.ON:
            actions.append(_call(machine, model, spec.func))
        else:
            raise TypeError(f"{machine.__name__}: {spec.group.name.lower()} callbacks are not supported")
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
    return Call(name, function, tuple(p.name for p in parameters), expected, on_machine)


def _event(machine: type[StateMachine], event: str) -> Any:
    for candidate in machine.events:
        if candidate.id == event:
            return candidate
    return None


__all__ = ["Call", "Declared", "Rule", "all_hold", "call_source"]
