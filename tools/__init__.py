"""The project's tooling: never shipped, never imported by the product (``src/``).

- ``mirror``: the protocol core composed into a system model, explored like TLC and compared with TLC's graph;
- ``oracle``: the spec and its trace check transcribed with no ``layout_sm``: graphs equal to TLC's, traces judged;
- ``cpu_bridge``: what sglang 0.5.23 lacks to run ``launch_server`` on a CPU-only machine (tests only);
- ``harness``: in-process protocol parts for tests, the demo and the bench (daemon and engine-rank processes
  over gloo, a toy MoE, a CPU transport);
- ``realserver``: real ``python -m sglang.launch_server`` servers and standalone daemons, and the probes in them;
- ``demo``: ``make demo`` (real servers) and ``make demo-harness``;
- ``bench``: ``make bench``.

Each package imports the product and the packages listed above it only (``tests/test_import_graph.py``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO_DIR = Path(__file__).resolve().parent.parent
SRC_DIR = REPO_DIR / "src"


def with_project_path(env: Mapping[str, str], *first: str | Path) -> dict[str, str]:
    """``env`` with ``first``, then the product (``src/``) and the tooling (the repository) at the
    front of ``PYTHONPATH``: what a child interpreter needs to import both, installed or not."""
    out = dict(env)
    parts = [str(p) for p in (*first, SRC_DIR, REPO_DIR)]
    if out.get("PYTHONPATH"):
        parts.append(out["PYTHONPATH"])
    out["PYTHONPATH"] = os.pathsep.join(parts)
    return out
