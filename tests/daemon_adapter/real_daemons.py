"""A real standalone daemon set of the tiny Qwen3-MoE, for the tests that act as its engine by hand."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tools.realserver.model import build_tiny_qwen3_moe
from tools.realserver.server import RunDir, StandaloneDaemons, Topology

from tests.realserver.conftest import LOCK_PATH, hold_lock

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0


@contextlib.contextmanager
def tiny_daemon_set(tp: int, prefix: str, extra_args: Sequence[str] = ()) -> Iterator[tuple[StandaloneDaemons, float]]:
    """``python -m daemon_adapter`` at TP``tp``/EP``tp``, started and ready, with its start time; it holds the
    real-server lock (``tests/realserver/conftest.py``) for the daemons' lifetime."""
    model = build_tiny_qwen3_moe(REPO / "build" / "models")
    root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # AF_UNIX paths: at most 107 bytes
    try:
        with hold_lock(LOCK_PATH):
            topology = Topology(model, tp_size=tp, ep_size=tp)
            daemons = StandaloneDaemons(RunDir(Path(root) / "run"), topology, extra_args=list(extra_args)).start()
            try:
                yield daemons, daemons.wait_ready(START_TIMEOUT_S)
            finally:
                daemons.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
