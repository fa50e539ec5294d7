"""The protocol core stays pure: no sockets, threads, processes, torch or sglang (STYLE: etcd's raft)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "src" / "layout_sm"
FORBIDDEN = {
    "sglang",
    "torch",
    "socket",
    "threading",
    "multiprocessing",
    "subprocess",
    "asyncio",
    "os",
    "select",
    "selectors",
    "signal",
    "time",
    "random",
    "secrets",
    "numpy",
}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_modules_import_nothing_impure() -> None:
    offenders = {
        path.name: sorted(_imported_roots(path) & FORBIDDEN)
        for path in CORE.glob("*.py")
        # diagrams.py only draws the classes (pydot, graphviz); it is not imported by the core.
        if path.name != "diagrams.py"
    }
    offenders = {name: found for name, found in offenders.items() if found}
    assert not offenders, f"layout_sm must stay pure; impure imports: {offenders}"


def test_importing_the_core_loads_neither_sglang_nor_torch() -> None:
    code = (
        "import sys, layout_sm, layout_sm.daemon, layout_sm.engine, layout_sm.engine_machines, layout_sm.session,"
        " layout_sm.declared, layout_sm.messages, layout_sm.record;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('sglang', 'torch', 'numpy'));"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"layout_sm pulled in: {result.stdout} {result.stderr}"
