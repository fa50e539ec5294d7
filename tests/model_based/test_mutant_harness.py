"""The mutant harness itself: every named mutant applies to its target, only where it is asked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.model_based.mutants.catalog import ENV, MUTANTS

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "tests" / "model_based" / "mutants" / "site"

PROBE = """
import importlib, json, os
from tests.model_based.mutants.catalog import MUTANTS
m = MUTANTS[os.environ["LAYOUT_MUTANT"]]
mod = importlib.import_module(m.target)
print(json.dumps({"applied": getattr(mod, "__layout_mutant__", None)}))
"""


def _probe(name: str | None) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SITE), str(ROOT / "src"), str(ROOT)]))
    env.pop(ENV, None)
    if name:
        env[ENV] = name
    code = PROBE if name else "import layout_sm.daemon as d; print(getattr(d, '__layout_mutant__', None))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_at_least_twenty_named_mutants_with_a_rule_each() -> None:
    assert len(MUTANTS) >= 20
    assert all(m.rule and m.target for m in MUTANTS.values())


def test_each_mutant_is_applied_at_import_in_a_fresh_process() -> None:
    # one process per target module is enough to show the hook; every mutant must name its own
    for name in MUTANTS:
        assert f'"applied": "{name}"' in _probe(name), name


def test_no_mutant_without_the_environment_variable() -> None:
    assert _probe(None) == "None"


REPLACES_ONLY = """
import importlib, inspect, json
from tests.model_based.mutants.catalog import MUTANTS
added = {}
for name, m in MUTANTS.items():
    mod = importlib.reload(importlib.import_module(m.target))
    before = {n: {a for c in v.__mro__ for a in vars(c)} if inspect.isclass(v) else None for n, v in vars(mod).items()}
    m.patch(mod)
    new = [n for n in vars(mod) if n not in before and n != "__layout_mutant__"]
    for n, v in vars(mod).items():
        new += [f"{n}.{a}" for a in vars(v) if a not in before[n]] if before.get(n) is not None else []
    if new:
        added[name] = new
print(json.dumps(added))
"""


def test_each_mutant_replaces_a_name_its_target_defines() -> None:
    # A patch that adds a name instead of replacing one breaks nothing: its mutant would look alive
    # only because the code it meant to break was renamed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop(ENV, None)
    out = subprocess.run([sys.executable, "-c", REPLACES_ONLY], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "{}"
