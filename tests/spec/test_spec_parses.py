"""The spec and its models parse (PyPI ``tla`` as a syntax gate) and the configs name what exists.

Why: TLC does not run in CI; a spec that does not even parse, or a .cfg naming an operator the
spec lost, would only be found at review.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tla

SPEC = Path(__file__).resolve().parents[2] / "spec"
MODULES = ("LayoutProtocol", "MCSmall", "MCFull")
MODELS = ("MCSmall", "MCFull")


@pytest.mark.parametrize("name", MODULES)
def test_module_parses(name: str) -> None:
    tree = tla.parse((SPEC / f"{name}.tla").read_text())
    assert tree is not None


def test_the_gate_rejects_a_broken_module() -> None:
    text = (SPEC / "LayoutProtocol.tla").read_text()
    broken = text.replace("Spec == Init /\\ [][Next]_vars", "Spec == Init /\\ [][Next]_vars /\\ (")
    assert broken != text
    with pytest.raises(Exception):  # noqa: B017 (the parser raises its own error types)
        tla.parse(broken)


def _definitions(text: str) -> set[str]:
    return set(re.findall(r"^([A-Z][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*==", text, re.M))


@pytest.mark.parametrize("model", MODELS)
def test_config_names_defined_operators(model: str) -> None:
    defs = _definitions((SPEC / "LayoutProtocol.tla").read_text()) | _definitions((SPEC / f"{model}.tla").read_text())
    cfg = re.sub(r"\\\*[^\n]*", "", (SPEC / f"{model}.cfg").read_text())
    named = re.findall(r"^\s*(?:SPECIFICATION)\s+(\w+)", cfg, re.M)
    for block in re.findall(r"^(?:INVARIANTS?|PROPERTIES|PROPERTY)\b(.*?)(?=^[A-Z]+\b|\Z)", cfg, re.M | re.S):
        named += block.split()
    named += re.findall(r"<-\s*(\w+)", cfg)
    missing = [n for n in named if n not in defs]
    assert named and not missing, f"{model}.cfg names undefined operators {missing}"


def test_required_properties_are_named_operators() -> None:
    defs = _definitions((SPEC / "LayoutProtocol.tla").read_text())
    required = {
        "TypeOK", "SafeRouting", "CleanRecordIsTruth", "OneMover", "AgreedVersions",
        "DirtySticky", "VersionMonotonic", "DeadMoverEndsDirty", "WaitEnds", "FairSpec",
    }  # fmt: skip
    assert required <= defs, sorted(required - defs)


def test_spec_uses_standard_modules_only() -> None:
    text = (SPEC / "LayoutProtocol.tla").read_text()
    extends = re.search(r"^EXTENDS (.*)$", text, re.M)
    assert extends is not None
    used = {m.strip() for m in extends.group(1).split(",")}
    assert used <= {"Naturals", "Integers", "Sequences", "FiniteSets", "TLC"}, used
    assert "--algorithm" not in text  # no PlusCal
