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
TEXT = (SPEC / "LayoutProtocol.tla").read_text()
MODULES = (
    "LayoutProtocol", "Scenarios", "MCSmall", "MCFull", "MCChunks", "MCRepair", "MCRepairFails",
    "MCStandby", "MCTwoStandbys", "MCStandbyRepair", "MCRejoin", "TraceLayoutProtocol",
)  # fmt: skip
MODELS = MODULES[2:-1]


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
        "PendingHasMover", "LoadsOnCleanFindings", "SharesOnlyAdopted",
        "StartsAlone", "FindingsAgreedServes", "PendingEnds", "LiveMoveFreesDaemon",
        "OneRole", "OnePromoted", "ClaimsAlone", "BusyOnlyByUnparked", "StandbyTakesOver",
        "ParkedStandbysDoNotBlock", "PartialGrantEnds",
        "RepairingServesNothing", "RejoinsOnlyBehind", "RejoinServes", "OneMapPerVersion",
        "FailedCheckStops", "CheckFailsOnlyOnFault", "ClaimsFollowNotices", "ChunkCommits",
    }  # fmt: skip
    assert required <= defs, sorted(required - defs)


def test_every_witness_is_a_scenario_with_its_invariant() -> None:
    from tools.mirror.check_spec import WITNESSES

    defs = _definitions((SPEC / "Scenarios.tla").read_text())
    for w in WITNESSES:
        assert {w.name, w.invariant} <= defs, w.name
        assert (SPEC / f"{w.model}.cfg").exists(), w.model


def test_scenarios_wrap_every_protocol_action() -> None:
    """Scenarios.tla's actions are the protocol's, under the same names, each tracking ``seen`` (a daemon's
    start tracks its version too: ``TrackStart``)."""
    scen = (SPEC / "Scenarios.tla").read_text()
    nxt = re.search(r"^Next ==\n(.*?)\n\n", TEXT, re.M | re.S)
    assert nxt is not None
    actions = re.findall(r"^\s*\\/ .*?(\w+)\(([^)]*)\)\s*$", nxt[1], re.M)
    assert actions
    for name, params in actions:
        track = r"(Track|TrackStart\(r\))"
        assert re.search(rf"^{name}\({params}\) == P!{name}\({params}\) /\\ {track}$", scen, re.M), name


@pytest.mark.parametrize("name", ("LayoutProtocol", "Scenarios"))
def test_spec_uses_standard_modules_only(name: str) -> None:
    text = (SPEC / f"{name}.tla").read_text()
    extends = re.search(r"^EXTENDS (.*)$", text, re.M)
    assert extends is not None
    used = {m.strip() for m in extends.group(1).split(",")}
    assert used <= {"Naturals", "Integers", "Sequences", "FiniteSets", "TLC"}, used
    assert "--algorithm" not in text  # no PlusCal
