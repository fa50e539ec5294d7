"""The committed suites: where they are, what they were derived from, and how to rebuild them.

    python -m tests.model_based.suites [--model MCSmall ...] [--dot GRAPH.dot] [--max-steps N]

For each model, the state graph comes from TLC when `../shared/tlc/` holds its dump
(`<Model>.dot`, or `<Model>_graph.dot`; TLC's stdout beside it gives the version line), else
from the mirror explorer's own dump (same format). The suite covers every edge
(`layout_model.tlc_formats.StateGraph.edge_cover`, deterministic) and is written to
`tests/model_based/traces/<Model>/suite.json.gz` with a manifest: the SHA-256 of the spec, the
model's .tla and .cfg, the graph's source and TLC version, and the counts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from layout_model.tlc_formats import StateGraph, Suite, file_sha256, load_dot_graph

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
TRACES = Path(__file__).resolve().parent / "traces"
SHARED_TLC = ROOT.parent / "shared" / "tlc"
MODELS = ("MCSmall", "MCFull")
MAX_STEPS = 40
REGENERATE = "make traces"


def suite_path(model: str) -> Path:
    return TRACES / model / "suite.json.gz"


def spec_hashes(model: str) -> dict[str, str]:
    """The SHA-256 of every spec file a model's graph depends on."""
    return {
        "LayoutProtocol.tla": file_sha256(SPEC / "LayoutProtocol.tla"),
        f"{model}.tla": file_sha256(SPEC / f"{model}.tla"),
        f"{model}.cfg": file_sha256(SPEC / f"{model}.cfg"),
    }


def tlc_dump(model: str) -> Path | None:
    for name in (f"{model}.dot", f"{model}_graph.dot", f"{model.lower()}.dot", f"{model.lower()}_graph.dot"):
        p = SHARED_TLC / name
        if p.exists():
            return p
    return None


def _tlc_version(dot: Path) -> str:
    for stdout in sorted(dot.parent.glob("*stdout*")) + sorted(dot.parent.glob("*.out")):
        m = re.search(r"^TLC2 Version (\S+)", stdout.read_text(errors="replace"), re.M)
        if m:
            return m.group(1)
    return "unknown"


def mirror_dump(model: str, out: Path) -> str:
    """The mirror explorer's own dump, written in TLC's format (`make check-model`'s explorer).

    Returns its verdict line: a graph with an invariant violation still makes a suite (the
    replay then shows where code and spec part), but the manifest says so.
    """
    cmd = [sys.executable, "-m", "layout_model.explore", model, "--spec-dir", str(SPEC), "--dump", str(out), "--quiet"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if not out.exists():
        raise SystemExit(f"the explorer wrote no graph for {model}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{model}:")]
    return lines[-1] if lines else f"explorer exit {proc.returncode}"


def build(model: str, dot: Path | None = None, max_steps: int = MAX_STEPS) -> Suite:
    manifest: dict[str, Any] = {"model": model, "spec_sha256": spec_hashes(model)}
    if dot is None:
        dot = tlc_dump(model)
    if dot is not None:
        manifest.update(source="tlc", dot=str(dot.name), tlc_version=_tlc_version(dot))
        graph: StateGraph = load_dot_graph(dot)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"{model}.dot"
            verdict = mirror_dump(model, out)
            manifest.update(source="mirror", dot="layout_model.explore", tlc_version=None, explorer=verdict)
            graph = load_dot_graph(out)
    return Suite.from_graph(graph, manifest, max_steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", choices=MODELS, help="default: every model")
    ap.add_argument("--dot", type=Path, help="derive from this DOT dump (one --model only)")
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS)
    args = ap.parse_args(argv)
    models = args.model or list(MODELS)
    if args.dot is not None and len(models) != 1:
        ap.error("--dot needs exactly one --model")
    for model in models:
        t0 = time.monotonic()
        suite = build(model, args.dot, args.max_steps)
        path = suite_path(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        suite.write(path)
        m = suite.manifest
        print(
            f"[traces] {model}: {m['behaviours']} behaviours, {m['steps']} steps, {m['edges_covered']} of "
            f"{m['graph_edges']} edges covered, {m['graph_states']} states (source {m['source']}) "
            f"-> {path.relative_to(ROOT)} in {time.monotonic() - t0:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
