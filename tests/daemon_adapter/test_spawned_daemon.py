"""With ``--weight-cache-mode daemon`` the engine spawns its daemons in fresh interpreters;
the project's hooks must make those children layout-aware.

The child runs sglang's ``run_weight_cache_daemon`` up to building the daemon object; on a
CPU-only machine sglang's daemon cannot load a model past that point (it needs CUDA), so
the proof is which class the child built: ``LayoutAwareDaemon`` logs itself from
``__init__`` before sglang's constructor runs.

Why the hooks also wrap sglang's spawn function: the child unpickles its target by name in
a fresh interpreter, so a class replacement in the parent alone never reaches it
(``python -m tests.daemon_adapter.spawn_parent MODEL_DIR class-only`` shows that child
building sglang's plain daemon).
"""

from __future__ import annotations

import os
import subprocess
import sys

from .test_engine_killed import REPO

LAYOUT_AWARE_LOG = "building an expert-layout aware weight cache daemon"


def spawn_one(model_dir: str, mode: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "src"), REPO]))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.daemon_adapter.spawn_parent", model_dir, mode],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=280,
    )
    output = proc.stdout + proc.stderr
    assert "child exit code" in output, output[-3000:]
    return output


def test_daemon_spawned_by_sglang_is_layout_aware(model_dir):
    output = spawn_one(model_dir, "plugin")
    assert "spawned layout-aware weight cache daemon" in output, output[-3000:]
    assert LAYOUT_AWARE_LOG in output, output[-3000:]  # logged by the child
    assert "child exit code 0" not in output  # it cannot load a model on CPU
