"""The record comes from the initial expert-location metadata that sglang's daemon computes
with ``--enable-eplb`` (``_initialize_eplb_expert_location_metadata``); without the flag the
daemon keeps no record. Real sglang server args, ModelConfig and ExpertLocationMetadata, on CPU."""

from __future__ import annotations

import json

from layout_sm.record import layout_digest

# sglang's --init-expert-location: a non-trivial initial layout (2 redundant slots).
CUSTOM_MAP = [[3, 2, 1, 0, 3, 2], [0, 1, 2, 3, 1, 0], [2, 3, 0, 1, 2, 2]]


def build_record(model_dir: str, *flags: str):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import prepare_server_args
    from tools.harness.daemon_proc import default_cache_config
    from tools.harness.loaded_daemon import FakeLoadedLayoutAwareDaemon

    argv = ["--model-path", model_dir, "--device", "cpu", "--skip-tokenizer-init", "--tp-size", "2", "--ep-size", "2"]
    server_args = prepare_server_args([*argv, *flags])
    reset_context()
    try:
        publish(server_args, role="weight_cache_daemon", ranks=SpawnRanks(world_rank=1, gpu_id=1))
        daemon = FakeLoadedLayoutAwareDaemon(socket_path="", config=default_cache_config(), gpu_id=1)
        # what sglang's load() does next, here without loading the model
        daemon._initialize_eplb_expert_location_metadata(ModelConfig(model_path=model_dir))
        return daemon.layout_view()
    finally:
        reset_context()


def test_record_is_sglangs_initial_layout_with_enable_eplb(model_dir):
    view = build_record(model_dir, "--enable-eplb", "--ep-num-redundant-experts", "2")
    assert view.phase == "clean"
    assert view.record.shape == (3, 6) and view.record.num_logical == 4 and view.record.version == 0
    assert view.record.rows == ((0, 1, 2, 3, 0, 1),) * 3  # sglang's trivial layout with 2 redundant slots


def test_record_follows_init_expert_location(model_dir):
    data = json.dumps({"physical_to_logical_map": CUSTOM_MAP})
    view = build_record(model_dir, "--enable-eplb", "--ep-num-redundant-experts", "2", "--init-expert-location", data)
    assert [list(row) for row in view.record.rows] == CUSTOM_MAP
    assert view.record.digest == layout_digest(CUSTOM_MAP)


def test_no_record_without_enable_eplb(model_dir):
    view = build_record(model_dir)
    assert view.phase == "no_record" and view.record is None
