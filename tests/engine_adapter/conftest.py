"""Fixtures: one pool of 2 real engine rank processes (gloo) for the whole session, and real
layout-aware daemon processes, one per rank, started per test. Every rank and daemon writes its
protocol trace, and after each test the traces it wrote must be behaviours of the protocol."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the rank scripts must import by name in the ranks

from ea_helpers import Daemons
from tools.harness.engine_ranks import EngineRanks
from tools.trace_check import check_all, reports

from layout_sm.trace_codec import TRACE_ENV


@pytest.fixture(scope="session")
def traces() -> Path:
    """The folder every rank and daemon of these tests writes its trace to."""
    return Path(tempfile.mkdtemp(prefix="ea-traces-", dir="/tmp"))


@pytest.fixture(scope="session")
def ranks() -> Iterator[EngineRanks]:
    pool = EngineRanks(world_size=2)  # the ranks start at their first script, in a test: traced
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def traces_are_behaviours(traces: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tracing on for the processes a test starts (ranks and daemons), and the traces it wrote checked
    after it: a divergence fails it. Only during these tests: others start processes of their own."""
    monkeypatch.setenv(TRACE_ENV, str(traces))
    started = time.time()
    yield
    written = [path for path in traces.glob("*.ndjson") if path.stat().st_mtime >= started]
    verdicts = check_all(written)
    assert all(v.ok for v in verdicts), "a trace is not a behaviour of the protocol:\n" + reports(verdicts)


@pytest.fixture(scope="session")
def cache_configs(ranks: EngineRanks) -> list[dict[str, Any]]:
    """The CacheConfig each rank's real loader sends (daemons must serve the same)."""
    import ea_scripts

    results = ranks.run(ea_scripts.cache_config, ea_scripts.spec((None, None)), timeout=120)
    assert all(r.ok for r in results), [r.trace for r in results]
    return [r.value for r in results]


@pytest.fixture
def daemons(cache_configs: list[dict[str, Any]]) -> Iterator[Callable[..., Daemons]]:
    made: list[Daemons] = []
    root = tempfile.mkdtemp(prefix="ea-daemons-", dir="/tmp")

    def make(**kwargs: Any) -> Daemons:
        d = Daemons.start(os.path.join(root, f"set{len(made)}"), cache_configs, **kwargs)
        made.append(d)
        return d

    yield make
    for d in made:
        d.kill()
