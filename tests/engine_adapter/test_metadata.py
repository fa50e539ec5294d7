"""Adopting the daemons' map builds exactly the metadata ``--init-expert-location`` with that map
builds: every tensor of sglang's ExpertLocationMetadata, on EP ranks 0 and 1."""

from __future__ import annotations

import json

import ea_scripts
import pytest
from ea_helpers import OtherEngine
from tools.harness import toy_moe
from tools.harness.toy_moe import ToyMoEConfig

FIELDS = ea_scripts.METADATA_FIELDS  # the fields the rank script compares, in its order


def _moved_map(cfg: ToyMoEConfig) -> list[list[int]]:
    # Replicas of hot experts in the redundant slots and a permuted base: a layout EPLB could pick.
    rows = []
    for layer in range(cfg.num_layers):
        base = [(3 * p + layer) % cfg.num_logical for p in range(cfg.num_logical)]
        rows.append(base + [(layer + k) % cfg.num_logical for k in range(cfg.num_redundant)])
    return rows


@pytest.mark.parametrize("redundant", [0, 2])
def test_adopted_metadata_equals_init_expert_location(ranks, daemons, redundant):
    cfg = ToyMoEConfig(num_redundant=redundant)
    d = daemons(cfg=cfg, tensors=False)
    moved = _moved_map(cfg)
    other = OtherEngine(d.paths)
    other.move(list(range(cfg.num_layers)), moved)
    other.detach()
    cases = [("dynamic", "none"), ("static", "deepep")]
    res = ranks.run(ea_scripts.compare_metadata, d.sockets, cfg, json.dumps({"physical_to_logical_map": moved}), cases)
    assert all(r.ok for r in res), [r.trace for r in res]
    for r in res:
        for case, report in r.value.items():
            assert report["adopted_kind"] == "adopt", (case, report)
            assert report["map"] == moved
            assert report["differ"] == [], (r.rank, case, report["differ"])
            assert report["compared"] == list(FIELDS) if case[0] == "static" else FIELDS[:-1], report
    if redundant:
        # Replicas make sglang's tables rank-specific: each EP rank got its own, as with the flag.
        static = ("static", "deepep")
        assert res[0].value[static]["fingerprint"] != res[1].value[static]["fingerprint"]
    assert toy_moe.trivial_map(cfg) != moved
