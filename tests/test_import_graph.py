"""The import graph between the project's packages: what ships imports no tooling, the tooling imports
only the product and the tooling listed before it, and no module imports itself back round a circle.

Read from the sources with ``ast`` (every ``import``, module-level or inside a function), so a lazy
import counts as much as one at the top of a file.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Lowest first: each package may import itself and the packages before it, nothing after.
LAYERS: tuple[str, ...] = (
    "layout_sm",  # the protocol core: pure
    "daemon_adapter",
    "engine_adapter",
    "tools",  # the tooling's own root (paths), nothing of the project
    "tools.mirror",
    "tools.oracle",  # the spec and its trace check transcribed, sharing no code with layout_sm
    "tools.cpu_bridge",
    "tools.harness",
    "tools.realserver",
    "tools.demo",
    "tools.bench",
    "tools.chaos",  # the fault campaign: the harness, the demo's probes and real servers
)
PRODUCT = ("layout_sm", "daemon_adapter", "engine_adapter")


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO / "src") if path.is_relative_to(REPO / "src") else path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    paths = [*(REPO / "src").rglob("*.py"), *(REPO / "tools").rglob("*.py")]
    return {module_name(p): p for p in paths if "egg-info" not in str(p)}


def imports_of(path: Path, name: str, known: Iterable[str]) -> set[str]:
    """The project modules ``path`` imports (``from a.b import c`` is ``a.b.c`` when that is a module)."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, name, modules) for name, path in modules.items()}


def layer_of(module: str) -> str:
    return max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a package that comes later in ``LAYERS`` (the product importing tooling included)."""
    rank = {p: i for i, p in enumerate(LAYERS)}
    bad = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if rank[layer_of(target)] > rank[layer_of(module)]:
                bad.append(f"{module} imports {target} ({layer_of(target)} is above {layer_of(module)})")
    return bad


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_src_holds_exactly_the_shipped_packages() -> None:
    shipped = sorted(p.name for p in (REPO / "src").iterdir() if (p / "__init__.py").exists())
    assert shipped == sorted(PRODUCT)


def test_every_package_is_in_a_layer() -> None:
    graph = import_graph()
    assert all(layer_of(m) for m in graph)
    assert {layer_of(m) for m in graph} == set(LAYERS)


def test_nothing_imports_upward() -> None:
    assert upward_imports(import_graph()) == []


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def test_the_checks_fail_on_a_circle_and_an_upward_import() -> None:
    graph = import_graph()
    graph["tools.mirror.tlc_formats"] = {*graph["tools.mirror.tlc_formats"], "tools.mirror.dot"}
    graph["tools.mirror.dot"] = {*graph["tools.mirror.dot"], "tools.mirror.tlc_formats"}
    assert ["tools.mirror.dot", "tools.mirror.tlc_formats"] in circles(graph)
    graph["layout_sm.record"] = {*graph["layout_sm.record"], "tools.mirror.dot"}
    assert any(line.startswith("layout_sm.record imports tools.mirror.dot") for line in upward_imports(graph))
