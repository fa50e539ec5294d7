"""What the mirror and the spec oracle share, with no ``layout_sm`` in it: a TLC model's constants
(``load_model``), the spec's variables in declaration order, the edge labels TLC prints and a state
rendered as TLC prints it.

Why apart from ``tools.mirror.system``: the oracle (``tools.oracle``) must not import the code under
test, even transitively, and must read the same models and print the same graphs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tools.mirror.render import pretty
from tools.mirror.values import ModelValue, tlc_text

# The spec's variables, in declaration order (the order TLC prints them).
VARIABLES = (
    "dphase", "dver", "dmap", "dpend", "datt", "dnf", "truth",
    "ephase", "efind", "eroute", "ever", "eserv", "eshare", "reb", "moves", "dpark", "eclaim", "dcopy",
)  # fmt: skip


@dataclass(frozen=True)
class Model:
    """The constants of one TLC model (the .cfg, read by ``load_model``)."""

    name: str
    num_ranks: int
    num_layers: int
    engines: tuple[str, ...]
    older: frozenset[str]
    may_lack_record: frozenset[int]
    chunks: tuple[frozenset[int], ...]
    max_moves: int
    daemon_restarts: bool
    repairs: bool = False  # Repairs: the daemons start with auto repair
    repair_may_fail: bool = False  # RepairMayFail
    operator_repairs: bool = False  # OperatorRepairs: an operator may ask a dirty daemon to repair
    standbys: frozenset[str] = frozenset()  # Standbys: engines started as warm standbys
    rejoins: bool = False  # Rejoins: a daemon may be lost; engines have daemons behind the others rejoin
    reply_faults: bool = False  # ReplyFaults: a commit may be refused for its rows, or its reply lost
    durable: bool = False  # Durable: each daemon keeps a durable copy of its record and starts again from it
    invariants: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()

    @property
    def ranks(self) -> range:
        return range(1, self.num_ranks + 1)

    @property
    def layers(self) -> range:
        return range(1, self.num_layers + 1)

    @property
    def newer(self) -> tuple[str, ...]:
        return tuple(e for e in self.engines if e not in self.older)


def _set_of(text: str) -> list[str]:
    inner = text.strip()
    assert inner.startswith("{") and inner.endswith("}"), text
    return re.findall(r"\{[^{}]*\}|[^,{}\s]+", inner[1:-1])


def load_model(spec_dir: str | Path, name: str) -> Model:
    """Read the constants of ``spec/<name>.cfg`` (and the chunks of ``spec/<name>.tla``)."""
    spec_dir = Path(spec_dir)
    cfg = re.sub(r"\\\*[^\n]*", "", (spec_dir / f"{name}.cfg").read_text())
    consts = dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", cfg, re.M))
    subst = dict(re.findall(r"^\s*(\w+)\s*<-\s*(\w+)\s*$", cfg, re.M))
    mc = (spec_dir / f"{name}.tla").read_text()

    def const(key: str) -> str:
        if key in consts:
            return consts[key]
        m = re.search(rf"^{subst[key]}\s*==\s*(.+)$", mc, re.M)
        assert m, f"{name}: no value for {key}"
        return m.group(1).strip()

    def block(keyword: str) -> tuple[str, ...]:
        m = re.search(rf"^{keyword}S?\b(.*?)(?=^[A-Z]+\b|\Z)", cfg, re.M | re.S)
        return tuple(m.group(1).split()) if m else ()

    chunks = tuple(frozenset(int(x) for x in re.findall(r"\d+", c)) for c in _set_of(const("Chunks")))
    return Model(
        name=name,
        num_ranks=int(const("NumRanks")),
        num_layers=int(const("NumLayers")),
        engines=tuple(_set_of(const("Engines"))),
        older=frozenset(_set_of(const("Older"))),
        may_lack_record=frozenset(int(x) for x in _set_of(const("MayLackRecord"))),
        chunks=chunks,
        max_moves=int(const("MaxMoves")),
        daemon_restarts=const("DaemonRestarts") == "TRUE",
        repairs=const("Repairs") == "TRUE",
        repair_may_fail=const("RepairMayFail") == "TRUE",
        operator_repairs=const("OperatorRepairs") == "TRUE",
        standbys=frozenset(_set_of(const("Standbys"))) if "Standbys" in consts else frozenset(),
        rejoins=consts.get("Rejoins") == "TRUE",
        reply_faults=consts.get("ReplyFaults") == "TRUE",
        durable=consts.get("Durable") == "TRUE",
        invariants=block("INVARIANT"),
        properties=block("PROPERTY") or block("PROPERTIES"),
    )


# The spec's reb[e].step for each RebalanceMachine state (the others: "idle").
SPEC_STEP = {"beginning": "begin", "aborting": "abort", "moving": "move", "committing": "commit"}


def render_projection(values: tuple[Any, ...]) -> str:
    return "\n".join(f"/\\ {name} = {_var_text(name, v)}" for name, v in zip(VARIABLES, values, strict=True))


@lru_cache(maxsize=200_000)
def _var_text(name: str, v: Any) -> str:
    # Keyed by the variable too: 0 == False in Python, so (0, 0) and (False, False) would share
    # one cache entry; within one variable the types never mix.
    return pretty(tlc_text(v))


def _tla_cached(v: Any) -> str:
    return tlc_text(v)


def label(name: str, params: tuple[Any, ...]) -> str:
    """The edge label of an action instance, as TLC's ``actionlabels`` prints it."""
    if not params:
        return name
    return f"{name}(" + ", ".join(_tla_cached(_param_value(p)) for p in params) + ")"


def _param_value(p: Any) -> Any:
    if isinstance(p, str):
        return ModelValue(p)
    return p
