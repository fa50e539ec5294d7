"""sglang's own client against the layout-aware daemon: ``IpcModelLoader._fetch_from_cache``
gets the weights through sglang's real torch_ipc transport, and sglang's mismatch path
still raises."""

from __future__ import annotations

import json
import types

import pytest

from layout_sm.record import layout_digest

from .conftest import INITIAL_MAP
from .helpers import Engine, status_reason

TINY_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 3,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
    "torch_dtype": "float32",
}


@pytest.fixture
def sglang_engine_side(short_tmp, monkeypatch):
    """sglang's runtime context of a 1-rank CPU engine, and a spy on what its loader sends."""
    import torch
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.weight_cache import ipc_loader

    model_dir = f"{short_tmp}/tiny-moe"
    import os

    os.makedirs(model_dir)
    with open(f"{model_dir}/config.json", "w") as f:
        json.dump(TINY_MOE_CONFIG, f)
    server_args = prepare_server_args(["--model-path", model_dir, "--device", "cpu", "--skip-tokenizer-init"])
    reset_context()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
    torch.multiprocessing.set_sharing_strategy("file_system")  # docs/protocol.md §9: CPU tensors over torch_ipc
    sent: list[dict] = []
    real_send_msg = ipc_loader.send_msg

    def spy_send_msg(sock, obj):
        sent.append(obj)
        return real_send_msg(sock, obj)

    monkeypatch.setattr(ipc_loader, "send_msg", spy_send_msg)
    model_config = types.SimpleNamespace(
        model_path=model_dir,
        hf_config=types.SimpleNamespace(architectures=TINY_MOE_CONFIG["architectures"]),
        quantization=None,
        revision=None,
        dtype=torch.float32,
    )
    yield types.SimpleNamespace(model_config=model_config, sent=sent)
    reset_context()


def fetch_with_sglang(socket_path: str, model_config) -> dict:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.weight_cache.ipc_loader import IpcModelLoader

    loader = IpcModelLoader(LoadConfig(), socket_path=socket_path, weight_cache_mode="client")
    return loader._fetch_from_cache(model_config, types.SimpleNamespace(gpu_id=0))


def test_sglang_loader_fetches_weights_and_its_mismatch_path_raises(make_daemon, sglang_engine_side):
    import torch
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    tensors = {"model.layers.0.mlp.experts.w13_weight": torch.arange(24, dtype=torch.float32).reshape(4, 6)}
    # 1. a daemon with another model's fingerprint: sglang's mismatch path raises
    daemon = make_daemon("wc", tensors=tensors)
    with pytest.raises(RuntimeError, match="Daemon config mismatch"):
        fetch_with_sglang(daemon.socket_path, sglang_engine_side.model_config)
    engine_config = sglang_engine_side.sent[-1]["config"]
    assert "expert_layout" not in sglang_engine_side.sent[-1]  # sglang's own loader: an older engine

    # 2. a daemon with the engine's fingerprint serves the weights through sglang's transport
    daemon = make_daemon("wc2", tensors=tensors, config=engine_config)
    result = fetch_with_sglang(daemon.socket_path, sglang_engine_side.model_config)
    assert result["status"] == "ok" and result["pid"] == daemon.pid
    imported = TorchIpcTransportBackend().import_tensor(result["entries"]["model.layers.0.mlp.experts.w13_weight"])
    assert torch.equal(imported, tensors["model.layers.0.mlp.experts.w13_weight"])

    # 3. after a move, sglang's loader (no expert_layout field) is refused and raises:
    #    it never maps weights whose layout it does not know
    mover = Engine(daemon.socket_path, "mover")
    mover.attach()
    # the fetch above was an older engine's: the daemon no longer lets anyone move experts
    assert status_reason(mover.begin([0])) == ("refused", "non_following_seen")
    fresh = make_daemon("wc3", tensors=tensors, config=engine_config)
    mover = Engine(fresh.socket_path, "mover")
    mover.attach()
    assert status_reason(mover.begin([0])) == ("ok", "begun")
    assert status_reason(mover.commit([0], [[3, 2, 1, 0, 3, 2]])) == ("ok", "committed")
    with pytest.raises(RuntimeError, match="Daemon config mismatch") as refused:
        fetch_with_sglang(fresh.socket_path, sglang_engine_side.model_config)
    # sglang's client reports any non-ok status as a config mismatch and prints the reply's
    # daemon_config: the refusal's reason is there, on the older engine's screen
    assert "expert_layout_refused" in str(refused.value) and "experts have moved" in str(refused.value)
    assert status_reason(mover.fetch(0, layout_digest(INITIAL_MAP), config=engine_config)) == (
        "layout_refused",
        "digest_mismatch",
    )
