"""TLC's witness traces of the seed's scenarios (``spec/Scenarios.tla``), committed and typed.

    python -m tests.model_based.witness_traces --from build/witnesses   (``make witnesses``)

copies each witness's ``-dumpTrace json`` (written by ``make check-spec``) into
``tests/model_based/witnesses/<Name>.json`` and records in ``manifest.json`` the SHA-256 of the
spec files it came from and its length. ``load_witness`` reads one back as a ``Behaviour`` with
typed states: JSON erases sets, so each step is matched, by its action label and its state, to
the mirror's successor (``tools.mirror.system``), whose state is then the typed one. A step the
mirror cannot match is an error naming it: the mirror and TLC disagree on that witness.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from tools.mirror.check_spec import WITNESSES, Witness
from tools.mirror.system import System, load_model
from tools.mirror.tlc_formats import Action, Behaviour, Step, file_sha256
from tools.mirror.values import json_matches

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
WITNESS_DIR = Path(__file__).resolve().parent / "witnesses"
MANIFEST = WITNESS_DIR / "manifest.json"
HISTORY = "seen"  # Scenarios.tla's history variable: not a protocol variable, not replayed
REGENERATE = "make witnesses (TLC needed)"


def witness(name: str) -> Witness:
    return next(w for w in WITNESSES if w.name == name)


def spec_hashes(w: Witness) -> dict[str, str]:
    files = ("LayoutProtocol.tla", "Scenarios.tla", f"{w.model}.tla", f"{w.model}.cfg")
    return {f: file_sha256(SPEC / f) for f in files}


def _raw_states(path: Path) -> list[dict[str, Any]]:
    obj = json.loads(path.read_text())
    states = [dict(s[1]) for s in obj["counterexample"]["state"]]
    for s in states:
        s.pop(HISTORY, None)
    return states


def _raw_actions(path: Path) -> list[tuple[str, list[Any]]]:
    """Each step's action name and parameter values, in the order of its parameters (JSON values)."""
    obj = json.loads(path.read_text())
    out = []
    for _before, act, _after in obj["counterexample"]["action"]:
        ctx = act.get("context") or {}
        out.append((act["name"], [ctx[p] for p in act.get("parameters") or []]))
    return out


def load_witness(name: str, directory: Path = WITNESS_DIR) -> Behaviour:
    """The witness as a typed behaviour, each state the mirror's equal of TLC's."""
    w = witness(name)
    path = directory / f"{name}.json"
    model = load_model(SPEC, w.model)
    system = System(model)
    raw = _raw_states(path)
    actions = _raw_actions(path)
    if len(actions) != len(raw) - 1:
        raise ValueError(f"{path}: {len(raw)} states but {len(actions)} actions")

    def typed(state: Any) -> Any:
        return system.spec_state(state)

    here = next((s for s in system.initial_states() if json_matches(typed(s), raw[0])), None)
    if here is None:
        raise ValueError(f"{path}: no initial state of the mirror's {w.model} equals TLC's")
    init = typed(here)
    steps = []
    for k, ((name, args), want) in enumerate(zip(actions, raw[1:], strict=True), 1):
        found = [
            (action, n)
            for action, n in ((Action.parse(label), n) for label, n in system.successors(here))
            if action.name == name and json_matches(action.args, args) and json_matches(typed(n), want)
        ]
        if len(found) != 1:
            raise ValueError(
                f"{path}: step {k} {name}{tuple(args)}: the mirror has {len(found)} such successors, not 1 "
                f"(TLC's state: {want})"
            )
        action, here = found[0]
        steps.append(Step(action, typed(here)))
    return Behaviour(init, tuple(steps), name=name, source="json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--from", dest="source", type=Path, required=True, help="check_spec's --traces folder")
    args = ap.parse_args(argv)
    WITNESS_DIR.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {}
    missing = []
    for w in WITNESSES:
        src = args.source / f"{w.name}.json"
        if not src.is_file():
            missing.append(w.name)
            continue
        shutil.copy(src, WITNESS_DIR / src.name)
        manifest[w.name] = {
            "model": w.model,
            "what": w.what,
            "steps": len(_raw_states(src)) - 1,
            "spec_sha256": spec_hashes(w),
        }
        load_witness(w.name)  # the mirror must agree before it is committed
    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    for name, m in manifest.items():
        print(f"{name} ({m['model']}): {m['steps']} steps")
    if missing:
        print(f"witness_traces: no trace in {args.source} for {', '.join(missing)}: run make check-spec first")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
