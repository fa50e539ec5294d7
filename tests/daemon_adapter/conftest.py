"""Fixtures: real layout-aware sglang daemons (``tools.harness.daemon_proc``) on real sockets."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tools.harness.daemon_proc import DaemonProcess, start_daemon

# 3 layers, 6 physical slots (4 logical experts + 2 redundant), as sglang builds it.
INITIAL_MAP = [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 2, 3], [3, 2, 1, 0, 1, 0]]
NUM_LOGICAL = 4


@pytest.fixture
def short_tmp() -> Iterator[str]:
    # AF_UNIX paths are limited to 107 bytes; pytest's tmp_path can be longer.
    path = tempfile.mkdtemp(prefix="dA-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def model_dir(short_tmp: str) -> str:
    """A model folder holding only the config.json of a tiny Qwen3-MoE (no weights are loaded)."""
    from .test_sglang_client import TINY_MOE_CONFIG

    path = f"{short_tmp}/tiny-moe"
    os.makedirs(path)
    with open(f"{path}/config.json", "w") as f:
        json.dump(TINY_MOE_CONFIG, f)
    return path


@pytest.fixture
def make_daemon(short_tmp: str) -> Iterator[Callable[..., DaemonProcess]]:
    """``make_daemon(name="d0", **start_daemon_kwargs)``; every daemon is stopped afterwards."""
    started: list[DaemonProcess] = []

    def make(name: str = "d0", **kwargs: Any) -> DaemonProcess:
        kwargs.setdefault("physical_to_logical_map", INITIAL_MAP)
        kwargs.setdefault("num_logical", NUM_LOGICAL)
        kwargs.setdefault("log_path", f"{short_tmp}/{name}.log")
        daemon = start_daemon(f"{short_tmp}/{name}.sock", **kwargs)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.kill()


@pytest.fixture
def daemon(make_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """A daemon with the record ``INITIAL_MAP`` at version 0."""
    return make_daemon()
