"""Run TLC on every model in spec/ and summarise each run (``make check-spec``).

Why: TLC is the judge of the spec, but it does not install from the package registries here;
this runner finds it, runs it the same way every time, and reads its stdout for the verdict.

    python -m layout_model.check_spec [--model MCSmall ...] [--dump DIR] [--spec-dir spec]

The jar: ``$TLA2TOOLS_JAR``, else the pinned official release cached outside the repository at
``~/.cache/tla2tools/<VERSION>/tla2tools.jar``, fetched once with curl from the official GitHub
release when the network allows. Without Java or the jar it says exactly what is missing and
how to provide it, and exits 2. Per model it prints the result, the distinct states, the depth
and the time; it exits 1 on any violation (invariant, action property, liveness, deadlock is
not checked: the models end when every engine is gone). With ``--dump DIR`` it also writes
``DIR/<Model>.dot`` (``-dump dot,actionlabels``) and TLC's stdout as ``DIR/<Model>.stdout.txt``.

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
import time
from dataclasses import dataclass
from pathlib import Path

VERSION = "v1.7.4"
RELEASE_URL = f"https://github.com/tlaplus/tlaplus/releases/download/{VERSION}/tla2tools.jar"
CACHE = Path.home() / ".cache" / "tla2tools" / VERSION / "tla2tools.jar"
MODELS = ("MCSmall", "MCFull")


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


def find_jar(fetch: bool = True) -> tuple[Path | None, str]:
    """The jar to use, or None and a message saying what is missing and how to provide it."""
    env = os.environ.get("TLA2TOOLS_JAR")
    if env:
        p = Path(env).expanduser()
        if p.is_file():
            return p, f"TLA2TOOLS_JAR={p}"
        return None, f"TLA2TOOLS_JAR={env} is not a file. Point it at tla2tools.jar ({RELEASE_URL})."
    if CACHE.is_file():
        return CACHE, f"cached {VERSION} at {CACHE}"
    if fetch and shutil.which("curl"):
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = CACHE.with_suffix(".part")
        r = subprocess.run(
            ["curl", "-fsSL", "--max-time", "60", "-o", str(tmp), RELEASE_URL], capture_output=True, text=True
        )
        if r.returncode == 0 and tmp.is_file() and tmp.stat().st_size > 1_000_000:
            tmp.rename(CACHE)
            return CACHE, f"fetched {VERSION} into {CACHE}"
        tmp.unlink(missing_ok=True)
        why = (r.stderr or "").strip().splitlines()[-1:] or ["no network?"]
        fetched = f"Fetching {RELEASE_URL} failed ({why[0]})."
    elif fetch:
        fetched = "curl is not available to fetch it."
    else:
        fetched = "It was not fetched (--no-fetch)."
    return None, (
        "TLC is missing: no tla2tools.jar. "
        f"{fetched} Provide it in one of two ways:\n"
        f"  1. export TLA2TOOLS_JAR=/path/to/tla2tools.jar   (any official release, {VERSION} or later)\n"
        f"  2. put the official {VERSION} jar at {CACHE}\n"
        f"     (curl -fsSL -o {CACHE} {RELEASE_URL})\n"
        "The jar is never stored in the repository."
    )


def run_model(jar: Path, spec_dir: Path, model: str, dump: Path | None, workers: str = "auto") -> TlcRun:
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", help="default: every model (MCSmall, MCFull)")
    ap.add_argument("--spec-dir", type=Path, default=Path("spec"))
    ap.add_argument("--dump", type=Path, default=None, help="also write <DIR>/<Model>.dot and its stdout")
    ap.add_argument("--no-fetch", action="store_true", help="never try the network")
    args = ap.parse_args(argv)
    if shutil.which("java") is None:
        print(
            "check-spec: Java is missing: TLC needs a Java 11+ runtime on PATH (e.g. apt-get install "
            "openjdk-17-jre-headless)."
        )
        return 2
    jar, how = find_jar(fetch=not args.no_fetch)
    if jar is None:
        print(f"check-spec: {how}")
        return 2
    print(f"check-spec: TLC from {how}")
    failed = False
    for model in args.model or MODELS:
        run = run_model(jar, args.spec_dir, model, args.dump)
        print(run.line())
        failed |= not run.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
