"""``engine_adapter.collective.all_gather_small`` on 2 real rank processes over gloo: a chunk's
replies in one collective, and an object too large for its slot gathered whole all the same."""

from __future__ import annotations

import ea_scripts
from tools.harness.engine_ranks import EngineRanks

from engine_adapter.collective import INLINE_BYTES


def test_small_objects_take_one_collective_and_a_large_one_is_gathered_whole(ranks: EngineRanks) -> None:
    results = ranks.run(ea_scripts.gather_small_and_large, timeout=60)
    assert all(r.ok for r in results), [r.trace for r in results]
    small = [{"rank": 0, "reply": ""}, {"rank": 1, "reply": "ok"}]
    large = [{"rank": 0, "payload": "y"}, {"rank": 1, "payload": "x" * (INLINE_BYTES + 1)}]
    for result in results:
        assert result.value["small"] == small
        assert result.value["small_calls"] == ["all_gather"]
        assert result.value["large"] == large
        # Every rank saw rank 1's size, so both gathered again: the same collectives on every rank.
        assert result.value["large_calls"] == ["all_gather", "all_gather_object"]
