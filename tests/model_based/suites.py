"""The committed suites: where they are, what they were derived from, and how to rebuild them.

    python -m tests.model_based.suites [--model MCSmall ...] [--source tlc|mirror] [--dot GRAPH]

Each model's state graph is TLC's own `-dump dot,actionlabels` graph:

- `--source tlc` (the default, `make suites`, and `make traces` where TLC does not run here):
  `../shared/tlc/<Model>.dot.gz` (gzip; `<Model>.dot` also read), beside the clone
  (`LAYOUT_TLC_DIR` names another folder). The `README.md` there gives the SHA-256 of the spec
  files TLC ran on; a graph whose spec is not the current `spec/` is refused.
- `--dot GRAPH`: a graph TLC has just dumped from the current `spec/` (`make traces` where TLC
  runs here).
- `--source mirror`: the mirror explorer's own dump (same format), asked for by name only, for
  a spec change TLC has not yet been run on; the manifest then says `source: mirror`.

The suite covers every edge (`tools.mirror.dot.StateGraph.edge_cover`: canonical, the
same for equal graphs whatever their node ids, line order or variable order) and is written to
`tests/model_based/traces/<Model>/suite.json.gz` with a manifest: the SHA-256 of the spec, the
model's .tla and .cfg, the graph's source, file and SHA-256, TLC's version, the order TLC prints
the variables in (`tools.mirror.render.sany_variable_order`) and the counts.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.mirror.dot import StateGraph, load_dot
from tools.mirror.render import fit_variable_order
from tools.mirror.system import VARIABLES
from tools.mirror.tlc_formats import Suite, TlcFormatError, file_sha256

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec"
TRACES = Path(__file__).resolve().parent / "traces"
MODELS = ("MCSmall", "MCFull", "MCStandby", "MCRejoin")
MAX_STEPS = 40
REGENERATE = "make traces"
_STATE_VARIABLE = re.compile(r"^(?:/\\ )?([A-Za-z_]\w*) = ", re.M)


class StaleGraph(SystemExit):
    """TLC's graph is missing, unreadable, or was dumped from another spec than `spec/`."""


def suite_path(model: str) -> Path:
    return TRACES / model / "suite.json.gz"


def tlc_dir() -> Path:
    """Where TLC's results lie: `../shared/tlc/` beside the clone (CI's copy), or `LAYOUT_TLC_DIR`."""
    return Path(os.environ.get("LAYOUT_TLC_DIR") or ROOT.parent / "shared" / "tlc")


def spec_hashes(model: str) -> dict[str, str]:
    """The SHA-256 of every spec file a model's graph depends on."""
    return {
        "LayoutProtocol.tla": file_sha256(SPEC / "LayoutProtocol.tla"),
        f"{model}.tla": file_sha256(SPEC / f"{model}.tla"),
        f"{model}.cfg": file_sha256(SPEC / f"{model}.cfg"),
    }


def tlc_graph(model: str, where: Path | None = None) -> Path | None:
    """TLC's dumped graph of a model in TLC's results folder, gzip first."""
    where = where or tlc_dir()
    for name in (f"{model}.dot.gz", f"{model}.dot"):
        if (where / name).is_file():
            return where / name
    return None


def tlc_spec_hashes(where: Path) -> dict[str, str]:
    """The spec files' SHA-256 that TLC's results folder states it ran on (its README's table)."""
    readme = where / "README.md"
    if not readme.is_file():
        return {}
    rows = re.findall(r"^\|\s*`?([\w.]+\.(?:tla|cfg))`?\s*\|\s*([0-9a-f]{64})\s*\|", readme.read_text(), re.M)
    return dict(rows)


def stale_spec_files(model: str, graph: Path) -> list[str]:
    """The spec files of ``model`` whose SHA-256 is not the one TLC's results folder states it ran on."""
    stated = tlc_spec_hashes(graph.parent)
    return sorted(f for f, h in spec_hashes(model).items() if stated.get(f) != h)


def current_tlc_graph(model: str) -> tuple[Path | None, str]:
    """TLC's graph of ``model``, when TLC dumped it from the spec in `spec/` (found by the files' SHA-256
    before the graph is read); otherwise None and why, for a test to skip with."""
    graph = tlc_graph(model)
    if graph is None:
        return None, f"TLC's graph {model}.dot.gz is not in {tlc_dir()} (beside the clone; or LAYOUT_TLC_DIR)"
    stale = stale_spec_files(model, graph)
    if stale:
        return None, (
            f"{graph} was dumped by TLC from other spec files than spec/'s ({', '.join(stale)} differ from the "
            f"SHA-256 in {graph.parent / 'README.md'}): it cannot judge this spec until TLC has run on it"
        )
    return graph, ""


def check_graph_is_current(model: str, graph: Path) -> None:
    """Refuse a graph that TLC dumped from another spec than the one in `spec/` (clear message)."""
    stated = tlc_spec_hashes(graph.parent)
    now = spec_hashes(model)
    if not stated:
        raise StaleGraph(
            f"{graph.parent / 'README.md'} states no SHA-256 of the spec files TLC ran on (a table row "
            f"`| LayoutProtocol.tla | <sha256> |` per file), so {graph.name} cannot be checked against spec/. "
            "Add them, or derive from a graph TLC has just dumped (`--dot`)."
        )
    stale = {f: (stated.get(f, "not stated"), h) for f, h in now.items() if stated.get(f) != h}
    if stale:
        details = "\n".join(f"  {f}: TLC ran on {a}, spec/ now has {b}" for f, (a, b) in stale.items())
        raise StaleGraph(
            f"{graph} was dumped by TLC from another spec than spec/ (SHA-256):\n{details}\n"
            "Run TLC on the current spec (`make traces` where TLC runs) and put its graphs there, or, "
            "until then, derive from the mirror by name: `python -m tests.model_based.suites --source mirror`."
        )


def _tlc_version(graph: Path, model: str) -> str:
    where = graph.parent
    candidates = [where / f"{model}.stdout.txt", *sorted(where.glob("*stdout*")), *sorted(where.glob("*.out"))]
    for stdout in candidates:
        if stdout.is_file():
            m = re.search(r"^TLC2 Version (\S+)", stdout.read_text(errors="replace"), re.M)
            if m:
                return m.group(1)
    return "unknown"


def mirror_dump(model: str, out: Path) -> str:
    """The mirror explorer's own dump, written in TLC's format (`make check-model`'s explorer).

    Returns its verdict line: a graph with an invariant violation still makes a suite (the
    replay then shows where code and spec part), but the manifest says so.
    """
    cmd = [sys.executable, "-m", "tools.mirror.explore", model, "--spec-dir", str(SPEC), "--dump", str(out), "--quiet"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if not out.exists():
        raise SystemExit(f"the explorer wrote no graph for {model}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(f"{model}:")]
    return lines[-1] if lines else f"explorer exit {proc.returncode}"


def printed_variable_order(graph: StateGraph, source: str) -> tuple[str, ...]:
    """The order the graph prints the variables in; the same in every state, or the graph is refused."""
    orders = {tuple(_STATE_VARIABLE.findall(text)) for text in graph.texts.values()}
    if len(orders) != 1:
        raise TlcFormatError(f"{source}: the states print their variables in {len(orders)} different orders")
    return orders.pop()


def variable_order_manifest(graph: StateGraph, source: str) -> dict[str, Any]:
    """The graph's print order of the variables, and the SANY symbol table that explains it."""
    order = printed_variable_order(graph, source)
    fit = fit_variable_order(VARIABLES, order)
    table = None if fit is None else {"capacity": fit[0], "variables_inserted_at": fit[1]}
    return {"variable_order": list(order), "sany_symbol_table": table}


def build(model: str, dot: Path | None = None, max_steps: int = MAX_STEPS, source: str = "tlc") -> Suite:
    manifest: dict[str, Any] = {"model": model, "spec_sha256": spec_hashes(model)}
    if source == "mirror":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / f"{model}.dot"
            verdict = mirror_dump(model, out)
            manifest.update(source="mirror", dot="tools.mirror.explore", tlc_version=None, explorer=verdict)
            graph = load_dot(out)
            manifest.update(variable_order_manifest(graph, str(out)))
        return graph.suite(manifest, max_steps)
    if dot is None:
        dot = tlc_graph(model)
        if dot is None:
            raise StaleGraph(
                f"no TLC graph of {model} in {tlc_dir()} (expected {model}.dot.gz, TLC's `-dump dot,actionlabels`"
                " output, gzip). Put TLC's results there (or name the folder with LAYOUT_TLC_DIR), or derive "
                "from the mirror by name: `python -m tests.model_based.suites --source mirror`."
            )
        check_graph_is_current(model, dot)
    t0 = time.monotonic()
    graph = load_dot(dot)
    print(f"[traces] {model}: loaded {dot} ({len(graph.texts)} states, {len(graph.edges)} edges) in "
          f"{time.monotonic() - t0:.1f} s")  # fmt: skip
    manifest.update(
        source="tlc",
        dot=dot.name,
        dot_sha256=file_sha256(dot),
        tlc_version=_tlc_version(dot, model),
        **variable_order_manifest(graph, str(dot)),
    )
    return graph.suite(manifest, max_steps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", choices=MODELS, help="default: every model")
    ap.add_argument("--dot", type=Path, help="derive from this graph TLC dumped from spec/ (one --model only)")
    ap.add_argument("--source", choices=("tlc", "mirror"), default="tlc", help="default: TLC's graphs")
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS)
    args = ap.parse_args(argv)
    models = args.model or list(MODELS)
    if args.dot is not None and (len(models) != 1 or args.source != "tlc"):
        ap.error("--dot needs exactly one --model, and is TLC's graph")
    for model in models:
        t0 = time.monotonic()
        suite = build(model, args.dot, args.max_steps, args.source)
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
