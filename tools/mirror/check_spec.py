"""Run TLC on every model in spec/ and summarise each run (``make check-spec``).

Why: TLC is the judge of the spec, but it does not install from the package registries here;
this runner finds it, runs it the same way every time, and reads its stdout for the verdict.

    python -m tools.mirror.check_spec [--model MCSmall ...] [--dump DIR] [--spec-dir spec]
                                      [--witnesses | --witness NAME ...] [--traces DIR]

The jar: ``$TLA2TOOLS_JAR``, else an official release placed by hand at
``~/.cache/tla2tools/<VERSION>/tla2tools.jar`` (nothing is downloaded). Without Java or the jar
it says exactly what is missing, what was therefore not checked, and exits 2. Per model it
prints the result, the distinct states, the depth and the time; it exits 1 on any violation
(invariant, action property, liveness; deadlock is not checked: the models end when every
engine is gone). With ``--dump DIR`` it also writes ``DIR/<Model>.dot``
(``-dump dot,actionlabels``) and TLC's stdout as ``DIR/<Model>.stdout.txt``.

Witnesses (``--witnesses``, or ``--witness NAME``): each of ``WITNESSES`` is a scenario of
``spec/Scenarios.tla`` that must be reachable. TLC runs on a root module that extends
``Scenarios`` and the witness's model, with the model's constants and the one invariant
``No<NAME>``, which must be violated: the counterexample (breadth first, so a shortest one) is
the witness; its length is printed and its ``-dumpTrace json`` is written to ``--traces DIR``.
A witness that TLC does not find (the invariant holds) is a failure (exit 1).

TLC's stdout lines read here (see ../shared/tlc-samples/toy_full_stdout.txt):
``TLC2 Version ...``, ``Model checking completed. No error has been found.``,
``Error: ...``, ``N states generated, M distinct states found, K states left on queue.``,
``The depth of the complete state graph search is D.``, ``Finished in T at (...)``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = "v1.7.4"
RELEASE_URL = f"https://github.com/tlaplus/tlaplus/releases/download/{VERSION}/tla2tools.jar"
CACHE = Path.home() / ".cache" / "tla2tools" / VERSION / "tla2tools.jar"
MODELS = (
    "MCSmall",
    "MCFull",
    "MCChunks",
    "MCRepair",
    "MCRepairFails",
    "MCStandby",
    "MCTwoStandbys",
    "MCStandbyRepair",
    "MCRejoin",
    "MCRejoinTwoMoves",
    "MCDurable",
)


@dataclass
class TlcRun:
    model: str
    ok: bool
    result: str
    version: str = "unknown"
    generated: int | None = None
    distinct: int | None = None
    depth: int | None = None
    time: str = ""
    returncode: int = 0

    def line(self) -> str:
        return (
            f"{self.model}: {self.result}; distinct states {self.distinct}, depth {self.depth}, "
            f"time {self.time} (TLC {self.version})"
        )


def parse_stdout(model: str, text: str, returncode: int = 0) -> TlcRun:
    """Read TLC's verdict and counts from its stdout."""
    version = re.search(r"^TLC2 Version (\S+)", text, re.M)
    counts = re.findall(r"^(\d+) states generated, (\d+) distinct states found", text, re.M)
    depth = re.search(r"^The depth of the complete state graph search is (\d+)\.", text, re.M)
    finished = re.search(r"^Finished in (\S+)", text, re.M)
    errors = re.findall(r"^Error: (.*)$", text, re.M)
    completed = "Model checking completed. No error has been found." in text
    if errors:
        result = "VIOLATION: " + errors[0]
    elif completed:
        result = "no error found"
    else:
        result = f"TLC did not complete (exit code {returncode})"
    return TlcRun(
        model=model,
        ok=completed and not errors and returncode == 0,
        result=result,
        version=version.group(1) if version else "unknown",
        generated=int(counts[-1][0]) if counts else None,
        distinct=int(counts[-1][1]) if counts else None,
        depth=int(depth.group(1)) if depth else None,
        time=finished.group(1) if finished else "",
        returncode=returncode,
    )


def find_jar(fetch: bool = False) -> tuple[Path | None, str]:
    """The jar to use, or None and a message saying what is missing and how to provide it.

    ``fetch`` is accepted for old callers and ignored: nothing is ever downloaded.
    """
    env = os.environ.get("TLA2TOOLS_JAR")
    if env:
        p = Path(env).expanduser()
        if p.is_file():
            return p, f"TLA2TOOLS_JAR={p}"
        return None, f"TLA2TOOLS_JAR={env} is not a file. Point it at tla2tools.jar ({RELEASE_URL})."
    if CACHE.is_file():
        return CACHE, f"{CACHE}"
    return None, (
        "TLC is missing: no tla2tools.jar. Provide it in one of two ways:\n"
        f"  1. export TLA2TOOLS_JAR=/path/to/tla2tools.jar   (an official release, {VERSION} or later:"
        f" {RELEASE_URL})\n"
        f"  2. put that jar at {CACHE}\n"
        "The jar is never stored in the repository."
    )


def run_model(jar: Path, spec_dir: Path, model: str, dump: Path | None, workers: str = "2") -> TlcRun:
    cmd = [
        "java",
        "-XX:+UseParallelGC",
        "-cp",
        str(jar),
        "tlc2.TLC",
        "-workers",
        workers,
        "-deadlock",
        "-config",
        f"{model}.cfg",
        "-metadir",
        str(Path("/tmp") / f"tlc-{model}-{os.getpid()}"),
        "-cleanup",
    ]
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        cmd += ["-dump", "dot,actionlabels", str((dump / f"{model}.dot").resolve())]
    cmd.append(f"{model}.tla")
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=spec_dir, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if dump is not None:
        (dump / f"{model}.stdout.txt").write_text(text)
    run = parse_stdout(model, text, proc.returncode)
    if not run.time:
        run.time = f"{time.monotonic() - start:.0f}s"
    if not run.ok:
        tail = "\n".join(text.strip().splitlines()[-40:])
        print(f"--- TLC output for {model} (last lines) ---\n{tail}\n---")
    return run


@dataclass(frozen=True)
class Witness:
    """A scenario of ``spec/Scenarios.tla`` that TLC must show reachable, on one model."""

    name: str  # the state predicate in Scenarios.tla; the invariant checked is No<name>
    model: str
    what: str

    @property
    def invariant(self) -> str:
        return f"No{self.name}"


WITNESSES = (
    Witness("RestartAdoptsMovedLayout", "MCSmall", "a restart adopts a moved layout"),
    Witness(
        "StandbyBusyThenMoverMoves",
        "MCSmall",
        "a warm standby makes a move busy; the mover succeeds after the standby leaves",
    ),
    Witness(
        "KillBetweenChunksAdopted",
        "MCChunks",
        "a SIGKILL between chunks leaves the last committed version; the next engine adopts it",
    ),
    Witness("KillMidMoveNextFails", "MCSmall", "a SIGKILL mid-move leaves the daemons dirty; the next engine fails"),
    Witness("OlderRefusedAfterMove", "MCFull", "an older engine is refused after a move"),
    Witness("SeveralChunksMoved", "MCChunks", "a rebalance of several chunks moves every layer"),
    Witness(
        "KillMidMoveRepairedThenAdopted",
        "MCRepair",
        "a SIGKILL mid-move; the daemons repair; the next engine adopts the base version and serves",
    ),
    Witness(
        "StandbyFollowsMoves",
        "MCStandby",
        "the primary commits two moves while the standby is parked, then dies; the standby promotes"
        " and serves the moved layout",
    ),
    Witness(
        "StandbyAfterDirtyFails",
        "MCStandby",
        "the primary dies mid-move; the daemons are dirty; the standby fails with the dirty reason",
    ),
    Witness(
        "TwoStandbysOnePromotes",
        "MCTwoStandbys",
        "two standbys parked when the primary dies: one promotes, the other's claim is taken and it stays parked",
    ),
    Witness(
        "StandbyWaitsOutRepair",
        "MCStandbyRepair",
        "the primary dies mid-move beside the parked standby; the daemons repair, then tell the standby,"
        " which promotes at the repaired base version",
    ),
    Witness(
        "DaemonLostAndRejoined",
        "MCRejoin",
        "a daemon is lost at a moved version and starts again from disk; the next engine has it rejoin"
        " at the others' version and serves it from every daemon",
    ),
    Witness(
        "CommitUnrecordedStopsRebalancing",
        "MCSmall",
        "a daemon does not record a commit (refused, or never received): the check fails, rebalancing stops,"
        " the engine serves on with the moved layout while that daemon keeps the move pending",
    ),
    Witness(
        "BeginUncountedRepaired",
        "MCRepair",
        "a daemon takes a begin whose reply is lost: rebalancing stops, the daemon keeps the move pending until"
        " the engine dies, is repaired at the base version, and the next engine adopts it and serves",
    ),
    Witness(
        "FullRestartServesCopy",
        "MCDurable",
        "a move committed and copied; every daemon lost and started again from its durable copy; the next"
        " engine adopts the moved version from every daemon and serves it",
    ),
    Witness(
        "FullRestartBehindRejoined",
        "MCDurable",
        "every daemon lost and started again, one from a copy behind the others' (its writer had not run, or"
        " its file was unusable); the next engine has it rejoin at the newest copy's version and serves it",
    ),
    Witness(
        "DaemonBehindRejoined",
        "MCRejoinTwoMoves",
        "a daemon did not record the second chunk's commit, its mover died and it was repaired at version 1;"
        " the next engine has it rejoin at version 2 and serves it from every daemon",
    ),
)


@dataclass
class WitnessRun:
    witness: Witness
    found: bool
    result: str
    states: int | None = None  # states in the counterexample, the initial one included
    distinct: int | None = None
    time: str = ""

    @property
    def steps(self) -> int | None:
        return None if self.states is None else self.states - 1

    def line(self) -> str:
        w = self.witness
        how = f"found, {self.steps} steps ({self.states} states)" if self.found else f"NOT FOUND ({self.result})"
        return f"witness {w.name} on {w.model}: {how}; {self.distinct} distinct states, {self.time}: {w.what}"


def parse_witness_stdout(witness: Witness, text: str, returncode: int = 0) -> WitnessRun:
    """Read a witness run: found when TLC reports exactly the witness's invariant violated."""
    run = parse_stdout(witness.model, text, returncode)
    states = [int(n) for n in re.findall(r"^State (\d+): <", text, re.M)]
    violated = f"Invariant {witness.invariant} is violated." in text
    if violated and states:
        return WitnessRun(witness, True, "reachable", max(states), run.distinct, run.time)
    if run.ok:
        result = f"TLC found no state where {witness.name} holds: invariant {witness.invariant} holds"
    else:
        result = run.result
    return WitnessRun(witness, False, result, None, run.distinct, run.time)


_CFG_SECTION = re.compile(
    r"^(SPECIFICATION|INIT|NEXT|INVARIANTS?|PROPERTIES|PROPERTY|CONSTRAINTS?|SYMMETRY|VIEW)\b", re.M
)


def witness_model(spec_dir: Path, witness: Witness, workdir: Path) -> str:
    """Write the root module and .cfg of a witness run into ``workdir``; return the module name.

    The root module is the model's module extending ``Scenarios`` instead of ``LayoutProtocol``
    (so the model's definitions, e.g. ``MCChunks``, stay); the .cfg keeps the model's constants.
    """
    for f in spec_dir.glob("*.tla"):
        shutil.copy(f, workdir / f.name)
    root = f"W_{witness.name}"
    tla = (spec_dir / f"{witness.model}.tla").read_text()
    if "EXTENDS LayoutProtocol" not in tla:
        raise ValueError(f"{witness.model}.tla does not extend LayoutProtocol: cannot build the witness module")
    tla = re.sub(r"MODULE\s+\w+", f"MODULE {root}", tla, count=1).replace("EXTENDS LayoutProtocol", "EXTENDS Scenarios")
    cfg = (spec_dir / f"{witness.model}.cfg").read_text()
    m = _CFG_SECTION.search(cfg)
    constants = cfg[: m.start()] if m else cfg
    (workdir / f"{root}.tla").write_text(tla)
    (workdir / f"{root}.cfg").write_text(
        f"{constants.rstrip()}\nINIT ScenarioInit\nNEXT ScenarioNext\nINVARIANT {witness.invariant}\n"
    )
    return root


def scrub(text: str, workdir: Path, jar: Path) -> str:
    """TLC's stdout without this machine's paths (the work folder, the jar, Java's temp folders)."""
    text = text.replace(str(workdir), "<workdir>").replace(str(jar), "tla2tools.jar")
    return re.sub(r"/tmp/tlc-\d+", "<tmpdir>", text)


def run_witness(
    jar: Path, spec_dir: Path, witness: Witness, traces: Path | None, workers: str = "2", quiet: bool = False
) -> WitnessRun:
    with tempfile.TemporaryDirectory(prefix=f"witness-{witness.name}-") as tmp:
        work = Path(tmp)
        root = witness_model(spec_dir, witness, work)
        cmd = ["java", "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC", "-workers", workers, "-deadlock"]
        cmd += ["-config", f"{root}.cfg", "-metadir", str(work / "states"), "-noGenerateSpecTE"]
        trace = work / f"{witness.name}.json"
        cmd += ["-dumpTrace", "json", str(trace), f"{root}.tla"]
        start = time.monotonic()
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        text = scrub(proc.stdout + proc.stderr, work, jar)
        run = parse_witness_stdout(witness, text, proc.returncode)
        if not run.time:
            run.time = f"{time.monotonic() - start:.0f}s"
        if traces is not None:
            traces.mkdir(parents=True, exist_ok=True)
            (traces / f"{witness.name}.stdout.txt").write_text(text)
            if run.found and trace.is_file():
                shutil.copy(trace, traces / trace.name)
        if not run.found and not quiet:
            tail = "\n".join(text.strip().splitlines()[-30:])
            print(f"--- TLC output for witness {witness.name} (last lines) ---\n{tail}\n---")
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help=f"default: every model ({', '.join(MODELS)})")
    ap.add_argument("--no-models", action="store_true", help="run only the witnesses")
    ap.add_argument("--spec-dir", type=Path, default=Path("spec"))
    ap.add_argument("--dump", type=Path, default=None, help="also write <DIR>/<Model>.dot and its stdout")
    ap.add_argument("--witnesses", action="store_true", help="also show every witness of WITNESSES reachable")
    ap.add_argument("--witness", action="append", default=[], help="one witness by name (repeatable)")
    ap.add_argument("--traces", type=Path, default=None, help="write each witness's -dumpTrace json here")
    ap.add_argument("--workers", default="2", help="TLC's -workers (default 2)")
    args = ap.parse_args(argv)
    by_name = {w.name: w for w in WITNESSES}
    unknown = [n for n in args.witness if n not in by_name]
    if unknown:
        print(f"check-spec: unknown witness {', '.join(unknown)}; known: {', '.join(by_name)}")
        return 2
    witnesses = list(WITNESSES) if args.witnesses else [by_name[n] for n in args.witness]
    models = [] if args.no_models else (args.model or list(MODELS))
    unchecked = (
        f"not checked: models {', '.join(models) or '(none)'}; "
        f"witnesses {', '.join(w.name for w in witnesses) or '(none)'}"
    )
    if shutil.which("java") is None:
        print(
            "check-spec: Java is missing: TLC needs a Java 11+ runtime on PATH (e.g. apt-get install "
            f"openjdk-17-jre-headless).\ncheck-spec: {unchecked}"
        )
        return 2
    jar, how = find_jar()
    if jar is None:
        print(f"check-spec: {how}\ncheck-spec: {unchecked}")
        return 2
    print(f"check-spec: TLC from {how}")
    failed = False
    for model in models:
        run = run_model(jar, args.spec_dir, model, args.dump, workers=args.workers)
        print(run.line(), flush=True)
        failed |= not run.ok
    for w in witnesses:
        wrun = run_witness(jar, args.spec_dir, w, args.traces, workers=args.workers)
        print(wrun.line(), flush=True)
        failed |= not wrun.found
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
