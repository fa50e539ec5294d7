"""Fixtures: one pool of 2 real engine rank processes (gloo) for the whole session, and real
layout-aware daemon processes, one per rank, started per test."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # the rank scripts must import by name in the ranks

from ea_helpers import Daemons
from tools.harness.engine_ranks import EngineRanks


@pytest.fixture(scope="session")
def ranks() -> Iterator[EngineRanks]:
    pool = EngineRanks(world_size=2)
    yield pool
    pool.close()


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
