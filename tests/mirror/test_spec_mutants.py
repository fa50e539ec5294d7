"""``make spec-mutants``: the catalog applies to the spec, the runs it makes, and its reading of TLC.

TLC does not run here: the catalog and the .cfg it derives are checked on the committed spec, and
the verdicts are read from TLC's real stdout (``fixtures/``: a liveness and an action-property
violation of a toy spec, produced by TLC; the toy's invariant violation and clean run in
``tests/model_based/fixtures/tlc-samples/``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tools.mirror import spec_mutants
from tools.mirror.check_spec import MODELS

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOY = Path(__file__).resolve().parents[1] / "model_based" / "fixtures" / "tlc-samples"
SPEC = Path(__file__).resolve().parents[2] / "spec"
TEXT = (SPEC / spec_mutants.SPEC_FILE).read_text()


@pytest.mark.parametrize("mutant", spec_mutants.CATALOG, ids=lambda m: m.name)
def test_each_mutant_changes_the_spec_at_one_place(mutant: spec_mutants.SpecMutant) -> None:
    mutated = mutant.apply(TEXT)
    assert mutated != TEXT
    assert len(mutated.splitlines()) <= len(TEXT.splitlines())  # an edit, not an addition of rules
    assert set(mutant.models) <= set(MODELS)


def test_catalog_names_are_unique_and_every_defence_names_its_reason() -> None:
    names = [m.name for m in spec_mutants.CATALOG]
    assert len(names) == len(set(names))
    for m in spec_mutants.CATALOG:
        if m.defence:
            assert len(m.defence) > 40 and ("tests/" in m.defence or "operator" in m.defence), m.name


def test_a_mutant_whose_text_is_gone_says_so() -> None:
    m = spec_mutants.SpecMutant("gone", "a rule", "NOT IN THE SPEC", "x")
    with pytest.raises(ValueError, match="occurs 0 times"):
        m.apply(TEXT)


def test_prepare_edits_a_copy_never_the_spec(tmp_path: Path) -> None:
    before = TEXT
    mutant = spec_mutants.CATALOG[0]
    spec_mutants.prepare(SPEC, tmp_path, mutant)
    assert (SPEC / spec_mutants.SPEC_FILE).read_text() == before
    assert (tmp_path / spec_mutants.SPEC_FILE).read_text() == mutant.apply(before)
    assert {f"{m}_safety.cfg" for m in MODELS} <= {p.name for p in tmp_path.iterdir()}


@pytest.mark.parametrize("model", MODELS)
def test_safety_cfg_keeps_invariants_and_action_properties_only(model: str) -> None:
    cfg = (SPEC / f"{model}.cfg").read_text()
    safe = spec_mutants.safety_cfg(cfg)
    assert re.search(r"^SPECIFICATION Spec$", safe, re.M) and "FairSpec" not in safe
    named = [p for p in spec_mutants.ACTION_PROPERTIES if re.search(rf"^\s+{p}$", cfg, re.M)]
    assert {"DirtySticky", "VersionMonotonic", "BeginsAlone"} <= set(named)
    for name in ("TypeOK", "SafeRouting", "PendingHasMover", *named):
        assert re.search(rf"^\s+{name}$", safe, re.M), name
    liveness = [p for p in ("WaitEnds", "StartsAlone", "FindingsAgreedServes", "PendingEnds") if p in cfg]
    if "SPECIFICATION FairSpec" in cfg:  # a model checked for safety only (MCRejoinTwoMoves) names none
        assert len(liveness) >= 3  # the standby models leave StartsAlone out (their standby starts among others)
    for name in liveness:
        assert name not in safe
    assert safe.split("SPECIFICATION")[0] == cfg.split("SPECIFICATION")[0]  # the same constants


@pytest.mark.parametrize(
    ("sample", "want"),
    [
        (TOY / "toy_tlc_stdout.txt", "Invariant NotDirty is violated"),
        (FIXTURES / "toy-liveness-violated.stdout.txt", "Temporal property EventuallyDirty was violated"),
        (FIXTURES / "toy-action-property-violated.stdout.txt", "Action property NeverDirtyStep is violated"),
        (TOY / "toy_full_stdout.txt", None),
    ],
)
def test_reads_what_tlc_reports_violated(sample: Path, want: str | None) -> None:
    assert spec_mutants.killed_by(sample.read_text()) == want


def test_a_parse_error_is_not_a_kill() -> None:
    text = "TLC2 Version 2026\n*** Errors: 1\nUnknown operator: `Foo'.\nError: Parsing or semantic analysis failed.\n"
    assert spec_mutants.killed_by(text) is None


def test_verdicts_table_and_exit_without_tlc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from tools.mirror import check_spec

    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setattr(check_spec, "CACHE", tmp_path / "none.jar")
    assert spec_mutants.main(["--spec-dir", str(SPEC)]) == 2
    out = capsys.readouterr().out
    assert "TLC is missing" in out and f"no mutant was judged ({len(spec_mutants.CATALOG)} in the catalog)" in out
    m = spec_mutants.CATALOG[0]
    doc = tmp_path / "t.md"
    spec_mutants.write_doc(doc, [spec_mutants.Verdict(m, "killed", "MCSmall: Invariant X | y is violated")], 3.0, True)
    text = doc.read_text()
    assert f"| `{m.name}` | {m.rule} | MCSmall | killed | MCSmall: Invariant X \\| y is violated |" in text
    assert "1 mutants, 1 killed, 0 defence in depth" in text


def test_several_temporal_properties_violated_at_once_are_a_kill() -> None:
    # TLC's line when one behaviour violates several properties (a mutant of RepairDone's fairness
    # on MCRepair); the old pattern read it as a run error.
    line = "Error: Temporal properties PendingEnds, RepairEnds, and TornMoveRepaired were violated.\n"
    assert spec_mutants.killed_by(line) == line.removeprefix("Error: ").rstrip(".\n")
