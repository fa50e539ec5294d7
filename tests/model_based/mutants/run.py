"""`make mutants`: run the model-based suite against each named mutant and tabulate the killers.

    python -m tests.model_based.mutants.run [--only a,b] [--tests PATH ...] [--timeout S] [--doc FILE]

For each mutant, a fresh `pytest` process runs with `LAYOUT_MUTANT=<name>` and this package's
`site/` first on PYTHONPATH, so `sitecustomize` patches the target module at import, in the test
process and in every daemon process it spawns. A mutant is killed when at least one test fails.
The unmutated suite runs first and must pass (otherwise the table would mean nothing).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tests.model_based.mutants.catalog import ENV, MUTANTS

ROOT = Path(__file__).resolve().parents[3]
SITE = Path(__file__).resolve().parent / "site"
DEFAULT_TESTS = ["tests/model_based"]
# the harness's own tests check the harness, not the protocol: they do not count as killers
IGNORE = ["tests/model_based/test_mutant_harness.py"]


@dataclass
class Result:
    name: str
    failed: list[str] = field(default_factory=list)
    passed: int = 0
    seconds: float = 0.0
    note: str = ""

    @property
    def killed(self) -> bool:
        return bool(self.failed)


def _env(mutant: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(ENV, None)
    if mutant:
        env[ENV] = mutant
    parts = [str(SITE), str(ROOT / "src"), str(ROOT)]
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["LAYOUT_TEST_PROFILE"] = "mutants"  # smaller samples (see the tests' module docstrings)
    return env


def run_one(mutant: str | None, tests: list[str], timeout: float) -> Result:
    res = Result(mutant or "(none)")
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
            "-o", "junit_family=xunit2", *[f"--ignore={d}" for d in IGNORE], *tests,
            *(MUTANTS[mutant].tests if mutant else ()),
        ]  # fmt: skip
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=_env(mutant), capture_output=True, text=True, timeout=timeout)
            tail = (proc.stdout + proc.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            res.seconds = time.monotonic() - t0
            res.note = f"timed out after {timeout:.0f} s"
            res.failed = ["(timeout)"]
            return res
        res.seconds = time.monotonic() - t0
        if not xml.exists():
            res.note = "pytest wrote no report: " + tail.replace("\n", " ")[-300:]
            res.failed = ["(collection or start-up error)"] if proc.returncode else []
            return res
        for case in ET.parse(xml).getroot().iter("testcase"):
            tid = f"{case.get('classname', '')}::{case.get('name', '')}"
            if case.find("failure") is not None or case.find("error") is not None:
                res.failed.append(tid)
            elif case.find("skipped") is None:
                res.passed += 1
        if proc.returncode not in (0, 1):
            res.note = f"pytest exit {proc.returncode}"
            if not res.failed:
                res.failed = [f"(pytest exit {proc.returncode})"]
    return res


def _short(tid: str) -> str:
    return tid.replace("tests.model_based.", "").replace("tests.", "").replace("::", ".")


def table(results: list[Result]) -> str:
    lines = [
        "| mutant | target | rule broken | killed | killing tests (of the suite) | s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        m = MUTANTS[r.name]
        killers = ", ".join(f"`{_short(t)}`" for t in r.failed[:4])
        if len(r.failed) > 4:
            killers += f" and {len(r.failed) - 4} more"
        if m.tests:
            killers += " (also ran: " + ", ".join(f"`{t.split('::')[0]}`" for t in m.tests) + ")"
        lines.append(
            f"| `{r.name}` | `{m.target}` | {m.rule} | {'yes' if r.killed else '**NO**'} | "
            f"{killers or '-'}{(' (' + r.note + ')') if r.note else ''} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    ap.add_argument("--tests", nargs="*", default=DEFAULT_TESTS, help="pytest paths (default: tests/model_based)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant run")
    ap.add_argument("--doc", default="", help="write the table to this Markdown file")
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"unknown mutants: {unknown}; known: {sorted(MUTANTS)}", file=sys.stderr)
        return 2
    t_all = time.monotonic()
    if not args.skip_baseline:
        base = run_one(None, args.tests, args.timeout)
        print(f"baseline (no mutant): {base.passed} passed, {len(base.failed)} failed in {base.seconds:.0f} s")
        if base.failed:
            print("the unmutated suite fails; fix that first:\n  " + "\n  ".join(base.failed), file=sys.stderr)
            return 1
    results = []
    for name in names:
        r = run_one(name, args.tests, args.timeout)
        results.append(r)
        verdict = "killed" if r.killed else "SURVIVED"
        note = f" [{r.note}]" if r.note else ""
        print(f"{name:38s} {verdict} by {len(r.failed)} test(s) in {r.seconds:.0f} s{note}", flush=True)
    out = table(results)
    print()
    print(out)
    survivors = [r.name for r in results if not r.killed]
    total = time.monotonic() - t_all
    summary = f"{len(results) - len(survivors)} of {len(results)} mutants killed in {total:.0f} s"
    print("\n" + summary + (f"; survivors: {survivors}" if survivors else ""))
    if args.doc:
        print("docs: " + _write_doc(Path(args.doc), results, args))
    return 1 if survivors else 0


def _write_doc(path: Path, results: list[Result], args: argparse.Namespace) -> str:
    """Write the table; a run of some mutants (`--only`) replaces their rows and keeps the others."""
    rows: dict[str, str] = {}
    if args.only and path.exists():
        for line in path.read_text().splitlines():
            m = re.match(r"^\| `([a-z0-9_]+)` \|", line)
            if m and m.group(1) in MUTANTS:
                rows[m.group(1)] = line
    lines = table(results).splitlines()
    header = lines[:2]
    for r, line in zip(results, lines[2:], strict=True):
        rows[r.name] = line
    ordered = [rows[n] for n in MUTANTS if n in rows]
    killed = sum(1 for line in ordered if "| yes |" in line)
    summary = f"{killed} of {len(ordered)} mutants killed"
    path.write_text(
        "# Mutants: each protocol rule broken on purpose, and the tests that catch it\n\n"
        "Reproduce: `make mutants` (or `python -m tests.model_based.mutants.run [--only a,b]`, PYTHONPATH=src:.).\n"
        "Each mutant is applied at import time by `tests/model_based/mutants/site/sitecustomize.py` when\n"
        "`LAYOUT_MUTANT=<name>` is set, in the test process and in every process it spawns (daemon processes\n"
        "included); no source file is edited. Each run is `pytest tests/model_based` with\n"
        "`LAYOUT_TEST_PROFILE=mutants` (smaller replay samples, 60 Hypothesis examples), plus the tests the\n"
        "catalog names for a mutant whose rule the bounded models cannot reach (a defensive check: see\n"
        "`tests` in `tests/model_based/mutants/catalog.py`). One mutant by hand:\n\n"
        "    LAYOUT_MUTANT=<name> LAYOUT_TEST_PROFILE=mutants PYTHONPATH=tests/model_based/mutants/site:src:. \\\n"
        "      .venv/bin/python -m pytest tests/model_based\n\n"
        f"Last run: {summary}.\n\n" + "\n".join(header + ordered) + "\n"
    )
    return summary


if __name__ == "__main__":
    raise SystemExit(main())
