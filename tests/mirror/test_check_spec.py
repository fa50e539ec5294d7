"""``make check-spec``'s reading of TLC's stdout, and its message when TLC is missing."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools.mirror import check_spec

SAMPLES = Path(__file__).resolve().parents[1] / "model_based" / "fixtures" / "tlc-samples"  # real TLC output
needs_samples = pytest.mark.skipif(not SAMPLES.is_dir(), reason=f"TLC's sample outputs are absent: no folder {SAMPLES}")


@needs_samples
def test_reads_a_clean_run() -> None:
    run = check_spec.parse_stdout("Toy", (SAMPLES / "toy_full_stdout.txt").read_text())
    assert run.ok and run.result == "no error found"
    assert (run.distinct, run.generated, run.depth, run.time) == (26, 63, 7, "00s")
    assert run.version == "2026.11.30.031302"


@needs_samples
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
    assert check_spec.main(["--spec-dir", str(SPEC)]) == 2
    assert "missing" in capsys.readouterr().out


def stand_in_tlc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, script: str) -> None:
    """Put a stand-in ``java`` (a shell script printing TLC's real output) and a jar path in place."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text("#!/bin/sh\n" + script)
    java.chmod(0o755)
    jar = tmp_path / "tla2tools.jar"
    jar.write_bytes(b"not really a jar")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(jar))


@needs_samples
def test_runs_tlc_per_model_and_keeps_its_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A stand-in ``java`` that answers like TLC: the runner's command line, dump and verdict."""
    stand_in_tlc(
        monkeypatch,
        tmp_path,
        f'echo "$@" > {tmp_path}/args.txt\n'
        'while [ $# -gt 0 ]; do if [ "$1" = "-dump" ]; then shift 2; touch "$1"; fi; shift; done\n'
        f"cat {SAMPLES / 'toy_full_stdout.txt'}\n",
    )
    spec = Path(__file__).resolve().parents[2] / "spec"
    rc = check_spec.main(["--spec-dir", str(spec), "--model", "MCSmall", "--dump", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "MCSmall: no error found; distinct states 26, depth 7, time 00s" in out
    args = (tmp_path / "args.txt").read_text()
    assert "tlc2.TLC" in args and "-config MCSmall.cfg" in args and "-dump dot,actionlabels" in args
    assert args.strip().endswith("MCSmall.tla")
    assert (tmp_path / "out" / "MCSmall.dot").exists() and (tmp_path / "out" / "MCSmall.stdout.txt").exists()


# --- witnesses -------------------------------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPEC = Path(__file__).resolve().parents[2] / "spec"
MID_MOVE = next(w for w in check_spec.WITNESSES if w.name == "KillMidMoveNextFails")


def test_reads_a_found_witness_and_its_length() -> None:
    """TLC's real stdout of the KillMidMoveNextFails witness run: 16 states, so 15 steps."""
    run = check_spec.parse_witness_stdout(MID_MOVE, (FIXTURES / "witness-KillMidMoveNextFails.stdout.txt").read_text())
    assert run.found and (run.states, run.steps) == (16, 15)
    assert run.distinct == 1643
    assert "witness KillMidMoveNextFails on MCSmall: found, 15 steps (16 states)" in run.line()


@needs_samples
def test_a_witness_whose_invariant_holds_is_not_found() -> None:
    """TLC completing without error means the scenario is unreachable: the witness is missing."""
    run = check_spec.parse_witness_stdout(MID_MOVE, (SAMPLES / "toy_full_stdout.txt").read_text())
    assert not run.found and run.states is None
    assert "invariant NoKillMidMoveNextFails holds" in run.result and "NOT FOUND" in run.line()


@needs_samples
def test_another_violation_is_not_the_witness() -> None:
    """A counterexample of another invariant (here the toy's NotDirty) does not count as found."""
    run = check_spec.parse_witness_stdout(MID_MOVE, (SAMPLES / "toy_tlc_stdout.txt").read_text())
    assert not run.found and run.result == "VIOLATION: Invariant NotDirty is violated."


def test_witness_model_extends_scenarios_with_the_models_constants(tmp_path: Path) -> None:
    chunks = next(w for w in check_spec.WITNESSES if w.model == "MCChunks")
    root = check_spec.witness_model(SPEC, chunks, tmp_path)
    tla = (tmp_path / f"{root}.tla").read_text()
    cfg = (tmp_path / f"{root}.cfg").read_text()
    assert f"MODULE {root}" in tla and "EXTENDS Scenarios" in tla and "MCChunks == {{1}, {2}}" in tla
    assert "MaxMoves = 3" in cfg and "Chunks <- MCChunks" in cfg
    assert cfg.rstrip().endswith(f"INIT ScenarioInit\nNEXT ScenarioNext\nINVARIANT {chunks.invariant}")
    assert "FairSpec" not in cfg and "PROPERTIES" not in cfg  # reachability only: no liveness
    assert (tmp_path / "Scenarios.tla").exists() and (tmp_path / "LayoutProtocol.tla").exists()


def test_main_runs_each_witness_and_keeps_its_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A stand-in ``java`` that answers with the real witness stdout and writes the JSON trace."""
    stand_in_tlc(
        monkeypatch,
        tmp_path,
        f'echo "$@" >> {tmp_path}/args.txt\n'
        'while [ $# -gt 0 ]; do if [ "$1" = "-dumpTrace" ]; then shift 2; echo "{}" > "$1"; fi; shift; done\n'
        f"cat {FIXTURES / 'witness-KillMidMoveNextFails.stdout.txt'}\n",
    )
    traces = tmp_path / "traces"
    argv = ["--spec-dir", str(SPEC), "--no-models", "--witness", MID_MOVE.name, "--traces", str(traces)]
    rc = check_spec.main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "witness KillMidMoveNextFails on MCSmall: found, 15 steps (16 states)" in out
    args = (tmp_path / "args.txt").read_text()
    assert "-config W_KillMidMoveNextFails.cfg" in args and "-dumpTrace json" in args
    assert (traces / "KillMidMoveNextFails.json").exists()
    assert (traces / "KillMidMoveNextFails.stdout.txt").exists()


def test_main_without_tlc_names_what_was_not_checked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("TLA2TOOLS_JAR", raising=False)
    monkeypatch.setattr(check_spec, "CACHE", tmp_path / "none" / "tla2tools.jar")
    assert check_spec.main(["--witnesses"]) == 2
    out = capsys.readouterr().out
    assert "TLC is missing" in out
    assert f"not checked: models {', '.join(check_spec.MODELS)}" in out
    assert "MCRejoin" in check_spec.MODELS
    assert all(w.name in out for w in check_spec.WITNESSES)


def test_an_unknown_witness_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    assert check_spec.main(["--witness", "NoSuchScenario"]) == 2
    assert "unknown witness NoSuchScenario" in capsys.readouterr().out
