"""``make check-spec``'s reading of TLC's stdout, and its message when TLC is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from layout_model import check_spec

SAMPLES = Path(__file__).resolve().parents[3] / "shared" / "tlc-samples"


@pytest.mark.skipif(not SAMPLES.exists(), reason="../shared/tlc-samples absent")
def test_reads_a_clean_run() -> None:
    run = check_spec.parse_stdout("Toy", (SAMPLES / "toy_full_stdout.txt").read_text())
    assert run.ok and run.result == "no error found"
    assert (run.distinct, run.generated, run.depth, run.time) == (26, 63, 7, "00s")
    assert run.version == "2026.11.30.031302"


@pytest.mark.skipif(not SAMPLES.exists(), reason="../shared/tlc-samples absent")
def test_reads_a_violation() -> None:
    run = check_spec.parse_stdout("Toy", (SAMPLES / "toy_tlc_stdout.txt").read_text())
    assert not run.ok
    assert run.result == "VIOLATION: Invariant NotDirty is violated."
    assert (run.distinct, run.depth) == (9, 4)


def test_an_unfinished_run_is_not_ok() -> None:
    run = check_spec.parse_stdout("M", "TLC2 Version 1\nStarting...\n", returncode=137)
    assert not run.ok and "did not complete" in run.result


def test_missing_jar_says_what_and_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setattr(check_spec, "CACHE", tmp_path / "none" / "tla2tools.jar")
    jar, message = check_spec.find_jar(fetch=False)
    assert jar is None
    assert "TLA2TOOLS_JAR" in message and str(tmp_path / "none" / "tla2tools.jar") in message
    assert check_spec.RELEASE_URL in message
    monkeypatch.setenv("TLA2TOOLS_JAR", str(tmp_path / "missing.jar"))
    jar, message = check_spec.find_jar(fetch=False)
    assert jar is None and "is not a file" in message


def test_main_exits_2_without_tlc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setattr(check_spec, "CACHE", tmp_path / "none" / "tla2tools.jar")
    assert check_spec.main(["--no-fetch"]) == 2
    assert "missing" in capsys.readouterr().out
