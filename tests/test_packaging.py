"""What ``pip install .`` puts into sglang's environment: the wheel, built offline from this tree.

The deployment gets the protocol core and the two adapters (``layout_sm``, ``daemon_adapter``,
``engine_adapter``), the sglang plugin entry point and the ``expert-layout`` command, and nothing of
the tests, the demo or the bench. Their code must not need anything else either.
"""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOYED = {"layout_sm", "daemon_adapter", "engine_adapter"}
# What the deployed code may import besides itself and the standard library: the declared
# dependency (python-statemachine) and what the environment that runs it has (sglang, torch, and
# two that sglang itself requires: prometheus_client, for its /metrics, which the plugin's series and
# `expert-layout status --prometheus` use; safetensors, which sglang's loader reads checkpoints with,
# and so does a daemon's repair; zmq, sglang's scheduler sockets, which a parked standby sleeps on;
# requests, which sglang's HTTP server warms up with, and so does a standby whose warmup sglang skipped).
ENVIRONMENT = {"statemachine", "sglang", "torch", "prometheus_client", "safetensors", "zmq", "requests"}
ENTRY_POINTS = {
    "console_scripts": {"expert-layout": "daemon_adapter.status_cli:main"},
    "sglang.srt.plugins": {"expert_layout": "engine_adapter.plugin:register"},
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    # A copy of what the build reads, so the build writes nothing into the working tree.
    tree = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", tree)
    shutil.copy(ROOT / "README.md", tree)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("wheel")
    argv = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    done = subprocess.run([*argv, "-w", str(out), str(tree)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("*.whl")
    return zipfile.ZipFile(built)


def _modules(wheel: zipfile.ZipFile) -> list[str]:
    return [name for name in wheel.namelist() if name.endswith(".py")]


def test_the_wheel_holds_exactly_the_deployment_packages(wheel: zipfile.ZipFile) -> None:
    top = {name.split("/")[0] for name in wheel.namelist() if ".dist-info/" not in name}
    assert top == DEPLOYED, f"the wheel ships {sorted(top)}; an sglang deployment gets only {sorted(DEPLOYED)}"
    # and every module of those packages (a new subpackage must not be left out)
    in_tree = {str(p.relative_to(ROOT / "src")) for pkg in DEPLOYED for p in (ROOT / "src" / pkg).rglob("*.py")}
    assert set(_modules(wheel)) == in_tree


def test_the_wheel_registers_the_plugin_and_the_command(wheel: zipfile.ZipFile) -> None:
    (path,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keep names as written
    parser.read_string(wheel.read(path).decode())
    assert {section: dict(parser[section]) for section in parser.sections()} == ENTRY_POINTS


def test_deployed_code_imports_nothing_of_the_tests_demo_or_bench(wheel: zipfile.ZipFile) -> None:
    allowed = DEPLOYED | ENVIRONMENT | set(sys.stdlib_module_names)
    outside: list[str] = []
    for name in _modules(wheel):
        for node in ast.walk(ast.parse(wheel.read(name), name)):
            if isinstance(node, ast.Import):
                tops = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            outside += [f"{name}:{node.lineno} imports {top}" for top in tops if top not in allowed]
    assert not outside, "deployed code needs what the deployment does not install:\n" + "\n".join(outside)
