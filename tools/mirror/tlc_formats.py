"""TLC's outputs loaded into one behaviour format, and edge-covering suites derived from state graphs.

A `Behaviour` is an initial state and a list of `Step`s; each step is an `Action` (the spec
action's name and its parameter values) and the full state after it. States are `Record`s
of the spec's variables, with values decoded by `tools.mirror.values`. Every TLC output
loads into this one format:

- `tools.mirror.dot.load_dot` / `StateGraph`: the state-graph dump (`-dump dot,actionlabels`):
  node labels are states as TLA+ text, edge labels are actions such as `Attach(e1)`, initial
  states are the nodes drawn `style = filled`. `StateGraph.edge_cover()` derives behaviours
  that cover every edge; `StateGraph.behaviour(path)` turns a path into a behaviour.
- `load_json_trace`: the `-dumpTrace json` counterexample (`action` triples with `name`,
  `context`, `parameters`).
- `load_simulate_trace` / `load_tla_trace`: `-simulate num=..,file=..` trace modules (and
  TLC's stdout error trace): `STATE_i == /\\ var = value ...` preceded by
  `\\* <Action(args) line .. of module M>`.

Suites (`Suite`: edge-covering behaviours with TLC's text of the states they visit and the
actions TLC lists out of each) are written and read as JSON, one per model under
`tests/model_based/traces/<Model>/`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tools.mirror.values import (
    Record,
    Value,
    decode_json,
    decode_state_text,
    decode_text,
    model_values_from_cfg,
    tlc_text,
)

__all__ = [
    "SUITE_FORMAT",
    "Action",
    "Behaviour",
    "Step",
    "Suite",
    "TlcFormatError",
    "file_sha256",
    "load_dumptrace_tla",
    "load_json_trace",
    "load_simulate_trace",
    "load_tla_trace",
]

SUITE_FORMAT = "layout-model-suite/v2"


class TlcFormatError(ValueError):
    """A TLC output file that does not have the expected shape (names the file and the place)."""


@dataclass(frozen=True)
class Action:
    """A spec action and its parameter values: `Attach(e1)` is `Action("Attach", (ModelValue("e1"),))`."""

    name: str
    args: tuple[Value, ...] = ()

    @cached_property
    def label(self) -> str:
        # cached: a graph's edges share one Action per label, and compare and the cover read it per edge
        return self.name + ("(" + ", ".join(tlc_text(a) for a in self.args) + ")" if self.args else "")

    @classmethod
    def parse(cls, label: str) -> Action:
        """Read an action label as TLC prints it: `Name` or `Name(v1, v2, ...)` with TLA+ values."""
        m = re.fullmatch(r"\s*([A-Za-z_][\w!]*)\s*(?:\((.*)\))?\s*", label, flags=re.S)
        if not m:
            raise TlcFormatError(f"not an action label: {label!r}")
        name, args = m.group(1), m.group(2)
        if args is None or not args.strip():
            return cls(name)
        # the arguments are TLA+ values separated by commas: read them as one tuple
        return cls(name, tuple(decode_text("<<" + args + ">>")))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return self.label


@dataclass(frozen=True)
class Step:
    action: Action
    state: Record


@dataclass(frozen=True)
class Behaviour:
    """An initial state and the steps taken from it (each step: action, full state after it)."""

    init: Record
    steps: tuple[Step, ...]
    name: str = ""
    source: str = ""

    @property
    def states(self) -> list[Record]:
        return [self.init, *(s.state for s in self.steps)]

    def __len__(self) -> int:
        return len(self.steps)


# ---------------------------------------------------------------------------------------------
# -dumpTrace json


def load_json_trace(
    path: str | Path,
    *,
    model_values: Iterable[str] | None = None,
    cfg: str | Path | None = None,
    like: Record | Sequence[Record] | None = None,
) -> Behaviour:
    """Load a `-dumpTrace json` counterexample.

    JSON erases types (see `tools.mirror.values`): give the model values (or the .cfg to read them
    from) and, to restore sets, typed example states `like` (e.g. the states the mirror reaches, or
    the same trace from TLC's stdout). Without examples, arrays decode as sequences.
    """
    p = Path(path)
    obj = json.loads(p.read_text())
    mvs = set(model_values or ())
    if cfg is not None:
        mvs |= model_values_from_cfg(Path(cfg).read_text())
    try:
        ce = obj["counterexample"]
        triples = ce["action"]
        states = ce["state"]
    except (KeyError, TypeError) as exc:
        raise TlcFormatError(f"{p}: not a TLC -dumpTrace json file (no counterexample.action/state)") from exc

    examples = [like] if isinstance(like, Record) else list(like or [])

    def dec(raw: dict[str, Any]) -> Record:
        return decode_json(raw, model_values=mvs, like=examples)  # type: ignore[return-value]

    init = dec(states[0][1])
    steps: list[Step] = []
    for i, triple in enumerate(triples):
        _before, act, after = triple
        params = act.get("parameters") or []
        ctx = act.get("context") or {}
        args = tuple(decode_json(ctx[name], model_values=mvs) for name in params if name in ctx)
        state = dec(after[1])
        if i == 0 and _before[0] != states[0][0]:
            raise TlcFormatError(f"{p}: first action does not start in the first state")
        steps.append(Step(Action(act["name"], args), state))
    return Behaviour(init, tuple(steps), name=p.stem, source="json")


# ---------------------------------------------------------------------------------------------
# -simulate trace modules and TLC's printed error traces

_SIM_STATE = re.compile(
    r"(?:\\\*\s*<(?P<label>[^\n]*)>\s*\n)?\s*STATE_(?P<idx>\d+)\s*==\s*\n(?P<body>.*?)(?=\n\s*\n|\n\\\*|\n=+|\Z)",
    re.S,
)
_OUT_STATE = re.compile(
    r"^State (?P<idx>\d+): <(?P<label>[^\n]*)>\n(?P<body>.*?)(?=\n\s*\n|\nState \d+:|\Z)", re.S | re.M
)
_LOCATION = re.compile(r"\s+line \d+, col \d+ to line \d+, col \d+ of module \S+$")


def _label_action(label: str) -> Action:
    return Action.parse(_LOCATION.sub("", label))


def _trace_from_states(found: list[tuple[int, str, str]], source: str, name: str) -> Behaviour:
    if not found:
        raise TlcFormatError(f"{name}: no states found")
    found.sort(key=lambda t: t[0])
    if [i for i, _, _ in found] != list(range(1, len(found) + 1)):
        raise TlcFormatError(f"{name}: states are not numbered 1..n")
    init = decode_state_text(found[0][2])
    steps = tuple(Step(_label_action(label), decode_state_text(body)) for _, label, body in found[1:])
    return Behaviour(init, steps, name=name, source=source)


def load_simulate_trace(path: str | Path) -> Behaviour:
    """Load a module written by `-simulate file=...` (or `-dumpTrace tla` style STATE_i definitions)."""
    p = Path(path)
    text = p.read_text()
    found = [(int(m["idx"]), m["label"] or "", m["body"]) for m in _SIM_STATE.finditer(text)]
    return _trace_from_states(found, "simulate", p.stem)


def load_dumptrace_tla(path: str | Path) -> Behaviour:
    """Load a `-dumpTrace tla` module (`CounterExample == [action |-> {...}, state |-> {...}]`)."""
    p = Path(path)
    text = p.read_text()
    m = re.search(r"CounterExample\s*==\s*(.*?)\n=+\s*$", text, flags=re.S)
    if not m:
        raise TlcFormatError(f"{p}: no `CounterExample ==` definition")
    ce = decode_text(m.group(1))
    if not isinstance(ce, Record) or "action" not in ce or "state" not in ce:
        raise TlcFormatError(f"{p}: CounterExample is not [action |-> ..., state |-> ...]")
    states = sorted(ce["state"], key=lambda t: t[0])
    triples = sorted(ce["action"], key=lambda t: t[0][0])
    steps: list[Step] = []
    for (_i, _before), act, (_j, after) in triples:
        params = act.get("parameters", ())
        ctx = act.get("context", Record())
        steps.append(Step(Action(act["name"], tuple(ctx[n] for n in params if n in ctx)), after))
    return Behaviour(states[0][1], tuple(steps), name=p.stem, source="dumptrace-tla")


def load_tla_trace(text: str, name: str = "stdout") -> Behaviour:
    """Load the error trace TLC prints on stdout (`State i: <Action(args) line ...>` blocks)."""
    found = [(int(m["idx"]), m["label"], m["body"]) for m in _OUT_STATE.finditer(text)]
    return _trace_from_states(found, "stdout", name)


# ---------------------------------------------------------------------------------------------
# Suites (JSON, committed under tests/model_based/traces/<Model>/)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass
class Suite:
    """Behaviours that cover a state graph's edges, with TLC's text of every state they visit.

    Stored as JSON (gzip when the name ends in `.gz`): a table of the visited states (the text
    TLC printed, and the labels of every edge TLC lists out of it), and each behaviour as an
    initial state index and `[action label, state index]` steps. States decode lazily (~2 ms
    each), so a test can compare text first and decode only on a difference.
    """

    manifest: dict[str, Any]
    texts: list[str]
    enabled: list[list[str]]
    paths: list[tuple[str, int, list[tuple[str, int]]]]  # (name, init index, [(label, index)])
    _decoded: dict[int, Record] = field(default_factory=dict, repr=False)
    _actions: dict[str, Action] = field(default_factory=dict, repr=False)

    def state(self, i: int) -> Record:
        if i not in self._decoded:
            self._decoded[i] = decode_state_text(self.texts[i])
        return self._decoded[i]

    def action(self, label: str) -> Action:
        if label not in self._actions:
            self._actions[label] = Action.parse(label)
        return self._actions[label]

    def behaviour(self, k: int) -> Behaviour:
        name, init, steps = self.paths[k]
        return Behaviour(
            self.state(init), tuple(Step(self.action(a), self.state(i)) for a, i in steps), name=name, source="suite"
        )

    def behaviours(self) -> list[Behaviour]:
        return [self.behaviour(k) for k in range(len(self.paths))]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SUITE_FORMAT,
            "manifest": self.manifest,
            "states": [{"state": t, "enabled": en} for t, en in zip(self.texts, self.enabled, strict=True)],
            # (label, index) pairs are written as JSON arrays as they are: no copy into lists
            "behaviours": [{"name": n, "init": i, "steps": st} for n, i, st in self.paths],
        }

    def write(self, path: str | Path) -> None:
        """Write the suite as JSON, gzip when the name ends in `.gz`, encoded and compressed in pieces.

        MCFull's suite is ~110 MB of JSON: json.dumps with an indent builds it from millions of small
        strings at once (~1 GB); here at most ~1 MB of text is held.
        """
        p = Path(path)
        encoder = json.JSONEncoder(indent=0, separators=(",", ":"))
        with p.open("wb") as raw:
            # mtime=0 and no file name in the header: the same suite gives the same bytes
            out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if p.name.endswith(".gz") else raw
            try:
                pending: list[str] = []
                size = 0
                for chunk in encoder.iterencode(self.to_json()):
                    pending.append(chunk)
                    size += len(chunk)
                    if size >= 1 << 20:
                        out.write("".join(pending).encode())
                        pending, size = [], 0
                pending.append("\n")
                out.write("".join(pending).encode())
            finally:
                if out is not raw:
                    out.close()

    @classmethod
    def load(cls, path: str | Path) -> Suite:
        p = Path(path)
        raw = p.read_bytes()
        doc = json.loads(gzip.decompress(raw) if p.name.endswith(".gz") else raw)
        if doc.get("format") != SUITE_FORMAT:
            raise TlcFormatError(f"{p}: format is {doc.get('format')!r}, expected {SUITE_FORMAT!r}")
        return cls(
            doc["manifest"],
            [s["state"] for s in doc["states"]],
            [s["enabled"] for s in doc["states"]],
            [(b["name"], b["init"], [(a, i) for a, i in b["steps"]]) for b in doc["behaviours"]],
        )
