"""The CPU bridge's hooks, each against the sglang function it wraps (no server)."""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest
import torch
from tools.cpu_bridge import bridges


def _moe_inputs(tokens: int = 6, experts: int = 5, hidden: int = 8, inter: int = 4):
    from sglang.srt.layers.moe.moe_runner import MoeRunnerConfig

    g = torch.Generator().manual_seed(0)
    layer = SimpleNamespace(
        num_experts=experts,
        w13_weight=torch.randn(experts, 2 * inter, hidden, generator=g),
        w2_weight=torch.randn(experts, hidden, inter, generator=g),
    )
    x = torch.randn(tokens, hidden, generator=g)
    return layer, x, MoeRunnerConfig(activation="silu")


def test_other_rank_expert_ids_add_nothing() -> None:
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    layer, x, config = _moe_inputs()
    ids = torch.tensor([[0, -1], [-1, 3], [2, 4], [-1, -1], [1, 0], [4, -1]])
    weights = torch.tensor([[0.6, 0.4], [0.3, 0.7], [0.5, 0.5], [0.2, 0.8], [0.9, 0.1], [0.25, 0.75]])
    with pytest.raises(
        RuntimeError, match="out of bounds"
    ):  # sglang's own function, unbridged (fused_moe_native.py:77)
        moe_forward_native(layer, x, StandardTopKOutput(weights, ids, None), config)
    out = bridges.skip_other_rank_experts(moe_forward_native, layer, x, StandardTopKOutput(weights, ids, None), config)

    # Expected: each local expert's output, weighted, for the ids on this rank only.
    def expert(e: int, v: torch.Tensor) -> torch.Tensor:
        gate, up = (layer.w13_weight[e] @ v).chunk(2)
        return layer.w2_weight[e] @ (torch.nn.functional.silu(gate) * up)

    expected = torch.stack(
        [
            sum((w * expert(int(e), x[t]) for e, w in zip(ids[t], weights[t], strict=True) if e >= 0), torch.zeros(8))
            for t in range(len(ids))
        ]
    )
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_without_other_rank_ids_the_original_runs_unchanged() -> None:
    from sglang.srt.layers.moe.fused_moe_native import moe_forward_native
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    layer, x, config = _moe_inputs()
    topk = StandardTopKOutput(
        torch.full((6, 2), 0.5), torch.tensor([[0, 1], [2, 3], [4, 0], [1, 2], [3, 4], [0, 2]]), None
    )
    torch.testing.assert_close(
        bridges.skip_other_rank_experts(moe_forward_native, layer, x, topk, config),
        moe_forward_native(layer, x, topk, config),
        rtol=0,
        atol=0,
    )


def test_every_rank_gets_its_own_device_uuid() -> None:
    from sglang.srt.platforms.cpu import CpuSRTPlatform

    cpu = CpuSRTPlatform()
    assert cpu.get_device_uuid(0) == cpu.get_device_uuid(1) == platform.machine()  # platforms/cpu.py:79
    original = type(cpu).get_device_uuid
    uuids = {bridges.device_uuid_per_rank(original, cpu, rank) for rank in range(4)}
    assert len(uuids) == 4


def test_default_device_module_is_cpu_and_explicit_devices_pass_through() -> None:
    module = bridges.default_device_module_is_cpu(torch.get_device_module)
    module.synchronize()  # eplb_manager.py:120,182, expert_location_updater.py:59
    module.empty_cache()  # expert_distribution.py:992
    assert module.synchronize is torch.cpu.synchronize
    assert bridges.default_device_module_is_cpu(torch.get_device_module, "cpu") is torch.cpu


def test_bridge_env_turns_the_bridge_on_and_refuses_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import tools.cpu_bridge as bridge

    env = bridge.bridge_env({"PYTHONPATH": "/elsewhere"}, tp_size=2)
    assert env[bridge.ENABLE_ENV] == "1" and env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["PYTHONPATH"].split(":")[0] == str(bridge.SITE_DIR)
    assert env["PYTHONPATH"].endswith("/elsewhere")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(bridge.BridgeRefused, match="CPU-only"):
        bridge.bridge_env({}, tp_size=2)


def test_forkserver_comes_after_sglangs_spawn_and_preloads_modules_that_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import multiprocessing
    import types

    import tools.cpu_bridge as bridge

    before = multiprocessing.get_start_method(allow_none=True)
    monkeypatch.setattr(multiprocessing.context._default_context, "_actual_context", None)
    preloaded: list[list[str]] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", preloaded.append)

    def _set_envs_and_config(server_args: object) -> str:  # engine.py:1995 sets spawn last
        multiprocessing.set_start_method("spawn", force=True)
        return "done"

    engine = types.ModuleType("sglang.srt.entrypoints.engine")
    engine._set_envs_and_config = _set_envs_and_config  # type: ignore[attr-defined]
    attribute, hook = bridges.FORKSERVER_AFTER_IMPORT["sglang.srt.entrypoints.engine"]
    assert attribute == "_set_envs_and_config"
    bridges.wrap_after_import(engine, attribute, hook)
    try:
        assert engine._set_envs_and_config(object()) == "done"  # type: ignore[attr-defined]
        assert multiprocessing.get_start_method() == "forkserver"
    finally:
        multiprocessing.set_start_method(before, force=True)
    # the forkserver skips a preload it cannot import without a word: every name must exist
    assert preloaded == [list(bridges.FORKSERVER_PRELOAD)]
    assert all(importlib.util.find_spec(name) is not None for name in bridges.FORKSERVER_PRELOAD)
    assert bridge.bridge_env({}, tp_size=2)[bridge.FORKSERVER_ENV] == "1"
    assert bridge.FORKSERVER_ENV not in bridge.bridge_env({bridge.FORKSERVER_ENV: "1"}, tp_size=2, forkserver=False)


def test_shared_expert_gate_on_cpu_is_the_unfused_formula_added_in_place() -> None:
    from sglang.srt.models import qwen2_moe

    g = torch.Generator().manual_seed(1)
    hidden, gate_w, shared = torch.randn(5, 8, generator=g), torch.randn(8, generator=g), torch.randn(5, 8, generator=g)
    final = torch.randn(5, 8, generator=g)
    expected = final + torch.sigmoid(torch.nn.functional.linear(hidden, gate_w.unsqueeze(0))) * shared
    called: list[str] = []
    bridges.shared_expert_gate_on_cpu(lambda *a: called.append("kernel"), hidden, gate_w, shared, final)
    assert not called, "on CPU the Triton kernel must not run"
    torch.testing.assert_close(final, expected)
    # the bridge wraps the name the model module calls, right after that module's import
    assert bridges.AFTER_IMPORT["sglang.srt.models.qwen2_moe"][0] == "fused_gate_sigmoid_mul_add"
    assert callable(qwen2_moe.fused_gate_sigmoid_mul_add)


def test_daemons_are_forked_from_a_forkserver_for_the_call_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import multiprocessing
    import types

    # sglang's shape (weight_cache/daemon.py): a module-level ``multiprocessing`` asked for "spawn"
    daemon = types.ModuleType("fake_sglang_daemon")
    exec(
        "import multiprocessing\n"
        "def spawn_weight_cache_daemon():\n"
        "    return multiprocessing.get_context('spawn').get_start_method()\n",
        daemon.__dict__,
    )
    preloaded: list[list[str]] = []
    monkeypatch.setattr(multiprocessing, "set_forkserver_preload", preloaded.append)
    attribute, hook = bridges.FORKSERVER_AFTER_IMPORT["sglang.srt.weight_cache.daemon"]
    assert attribute == "spawn_weight_cache_daemon"
    bridges.wrap_after_import(daemon, attribute, hook)
    assert daemon.spawn_weight_cache_daemon() == "forkserver"
    assert daemon.multiprocessing is multiprocessing  # only for the call
    assert preloaded in ([], [list(bridges.DAEMON_PRELOAD)])
    assert all(importlib.util.find_spec(name) is not None for name in bridges.DAEMON_PRELOAD)
