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


@pytest.mark.skipif(not SAMPLES.exists(), reason="../shared/tlc-samples absent")
def test_runs_tlc_per_model_and_keeps_its_outputs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """A stand-in ``java`` that answers like TLC: the runner's command line, dump and verdict."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/args.txt\n'
        'while [ $# -gt 0 ]; do if [ "$1" = "-dump" ]; then shift 2; touch "$1"; fi; shift; done\n'
        f"cat {SAMPLES / 'toy_full_stdout.txt'}\n"
    )
    java.chmod(0o755)
    jar = tmp_path / "tla2tools.jar"
    jar.write_bytes(b"not really a jar")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("TLA2TOOLS_JAR", str(jar))
    spec = Path(__file__).resolve().parents[2] / "spec"
    rc = check_spec.main(["--spec-dir", str(spec), "--model", "MCSmall", "--dump", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "MCSmall: no error found; distinct states 26, depth 7, time 00s" in out
    args = (tmp_path / "args.txt").read_text()
    assert "tlc2.TLC" in args and "-config MCSmall.cfg" in args and "-dump dot,actionlabels" in args
    assert args.strip().endswith("MCSmall.tla")
    assert (tmp_path / "out" / "MCSmall.dot").exists() and (tmp_path / "out" / "MCSmall.stdout.txt").exists()
