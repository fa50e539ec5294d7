"""The CPU gaps of sglang 0.5.23 that the real-server tests and demo need bridged.

Each bridge is one ``HookRegistry`` hook on the sglang (or torch) name it bridges, with the
sglang file:line that needs it. None copies sglang code: each wraps the original and calls it.
Delete a bridge when sglang fixes its line. ``register()`` registers them all (idempotent).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, NamedTuple

logger = logging.getLogger("tools.cpu_bridge")


class Bridge(NamedTuple):
    target: str  # the dotted name HookRegistry wraps
    sglang_line: str  # the sglang 0.5.23 line(s) that need it
    hook: Callable[..., Any]  # an AROUND hook: hook(original, *args, **kwargs)


# --- layers/moe/fused_moe_native.py:77: moe_forward_native indexes with EP's -1 expert ids ---
def skip_other_rank_experts(original: Any, layer: Any, x: Any, topk_output: Any, *args: Any, **kwargs: Any) -> Any:
    """Ids of experts on another EP rank are -1. sglang's function counts tokens per expert with
    ``scatter_`` (one count per token and expert), so the -1 ids cannot all become one id in a
    row: each top-k column is run alone, its -1 ids sent to expert 0 with weight 0 (they add
    nothing), and the columns' outputs summed."""
    other_rank = topk_output.topk_ids < 0
    if not bool(other_rank.any()):
        return original(layer, x, topk_output, *args, **kwargs)
    ids = topk_output.topk_ids.masked_fill(other_rank, 0)
    weights = topk_output.topk_weights.masked_fill(other_rank, 0)
    total = None
    for k in range(ids.shape[1]):
        column = topk_output._replace(topk_ids=ids[:, k : k + 1], topk_weights=weights[:, k : k + 1])
        out = original(layer, x, column, *args, **kwargs)
        total = out if total is None else total + out
    return total


# --- eplb_manager.py:120,182, expert_location_updater.py:59 (synchronize) and
#     expert_distribution.py:992 (empty_cache) on torch.get_device_module() ---
class CpuDeviceModule:
    """``torch.cpu`` plus the ``empty_cache`` it lacks (sglang's CPU platform: a GC pass)."""

    def empty_cache(self) -> None:
        from sglang.srt.platforms import current_platform

        current_platform.empty_cache()

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)


CPU_DEVICE_MODULE = CpuDeviceModule()


def default_device_module_is_cpu(original: Any, device: Any = None) -> Any:
    """``torch.get_device_module()`` without a device is ``torch.cuda`` here (no driver): use CPU's."""
    return CPU_DEVICE_MODULE if device is None else original(device)


# --- platforms/cpu.py:79: CpuDeviceMixin.get_device_uuid is platform.machine() for every rank ---
def cpu_device_uuid(machine: str, device_id: int) -> str:
    """The device uuid a bridged CPU rank reports: the machine name plus the rank's device id."""
    return f"{machine}-{int(device_id)}"


def device_uuid_per_rank(original: Any, platform: Any, device_id: int = 0) -> str:
    """One daemon socket per rank."""
    return cpu_device_uuid(original(platform, device_id), device_id)


# --- weight_cache/daemon.py:257-258 (platform refusal), :358, :392 (torch.cuda.memory_reserved),
#     and the MoE padding model_runner.py:1301 applies in the engine but the daemon does not
#     (shape mismatch at ipc_loader.py:388) ---
_IN_DAEMON_LOAD: contextvars.ContextVar[Any] = contextvars.ContextVar("expert_layout_daemon_load", default=None)
_one_shot_lock = threading.Lock()


@contextlib.contextmanager
def _first_cuda_alike_check_passes(platform: Any) -> Iterator[None]:
    # daemon.py:257 is load()'s first statement; only that one check is answered "yes", so the
    # model loader's own platform checks inside load() still see a CPU.
    def once() -> bool:
        with contextlib.suppress(AttributeError):
            del platform.is_cuda_alike
        return True

    with _one_shot_lock:
        platform.is_cuda_alike = once
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError):
            del platform.is_cuda_alike


def daemon_load_on_cpu(original: Any, daemon: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.platforms import current_platform

    if not current_platform.is_cpu():
        return original(daemon, *args, **kwargs)
    token = _IN_DAEMON_LOAD.set(daemon)
    try:
        with _first_cuda_alike_check_passes(current_platform):
            return original(daemon, *args, **kwargs)
    finally:
        _IN_DAEMON_LOAD.reset(token)


def no_cuda_memory_reserved(original: Any, *args: Any, **kwargs: Any) -> int:
    import torch

    return original(*args, **kwargs) if torch.cuda.is_available() else 0


def daemon_pads_moe_like_engine(original: Any, *args: Any, **kwargs: Any) -> Any:
    """Inside a daemon's load(): the same CPU-TP config adjustment the engine applies."""
    daemon = _IN_DAEMON_LOAD.get()
    if daemon is not None:
        from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp

        load_config = kwargs.get("load_config", args[0] if args else None)
        model_config = kwargs.get("model_config", args[1] if len(args) > 1 else None)
        adjusted = adjust_config_with_unaligned_cpu_tp(model_config, load_config, daemon.tp_size)
        assert adjusted is model_config, "adjust_config_with_unaligned_cpu_tp no longer adjusts in place"
    return original(*args, **kwargs)


# --- models/qwen2_moe.py:821-825 picks the fused shared-expert gate on a CPU without AMX, and
#     fused_gate_sigmoid_mul_add (kernels/ops/elementwise/elementwise.py:272) is a Triton kernel:
#     "0 active drivers" on CPU. The unfused path's formula instead (qwen2_moe.py: the shared
#     expert's output times sigmoid of its gate), added in place. ---
def shared_expert_gate_on_cpu(
    original: Any, hidden_states: Any, gate_weight: Any, shared_output: Any, final_hidden_states: Any
) -> None:
    if hidden_states.device.type != "cpu":
        return original(hidden_states, gate_weight, shared_output, final_hidden_states)
    import torch

    gate = torch.sigmoid(hidden_states @ gate_weight.reshape(-1, 1).to(hidden_states.dtype))
    final_hidden_states.add_((gate * shared_output).to(final_hidden_states.dtype))
    return None


# --- entrypoints/engine.py:1995 sets "spawn": each scheduler and detokenizer process imports
#     sglang again (seconds of CPU each). Not a CPU gap: a speed measure for small test machines,
#     on only with EXPERT_LAYOUT_CPU_FORKSERVER=1. The children still run sglang's own entry
#     functions; they are forked from one server process that imported sglang once. ---
# What the children import anyway (launch_server's own module is re-run as __mp_main__, so it is
# not preloaded: runpy warns when it finds it imported already).
FORKSERVER_PRELOAD = (
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
)


def subprocesses_from_a_forkserver(original: Any, *args: Any, **kwargs: Any) -> Any:
    """After sglang's own settings (it sets "spawn" last): forkserver, with sglang preloaded."""
    import multiprocessing

    result = original(*args, **kwargs)
    multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    multiprocessing.set_start_method("forkserver", force=True)
    return result


# --- weight_cache/daemon.py:690 spawns every daemon (``spawn_weight_cache_daemon``): each imports
#     sglang and torch again. The same speed measure: for the call, the module's ``multiprocessing``
#     answers a "spawn" context with the forkserver's, so the daemons are forked from one process
#     that imported the daemon once. They still run sglang's own target (or this project's, by
#     qualified name: daemon_adapter.hooks). ---
DAEMON_PRELOAD = ("sglang.srt.weight_cache.daemon", "daemon_adapter.hooks")


class ForkserverForSpawn:
    """``multiprocessing`` as ``spawn_weight_cache_daemon`` sees it: "spawn" means the forkserver."""

    def __init__(self, multiprocessing: ModuleType) -> None:
        self._multiprocessing = multiprocessing

    def get_context(self, method: str | None = None) -> Any:
        return self._multiprocessing.get_context("forkserver" if method == "spawn" else method)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._multiprocessing, name)


def daemons_from_a_forkserver(original: Any, *args: Any, **kwargs: Any) -> Any:
    import multiprocessing

    if multiprocessing.get_start_method(allow_none=True) != "forkserver":  # a standalone launcher
        multiprocessing.set_forkserver_preload(list(DAEMON_PRELOAD))
    module_globals = original.__globals__
    saved = module_globals["multiprocessing"]
    module_globals["multiprocessing"] = ForkserverForSpawn(multiprocessing)
    try:
        return original(*args, **kwargs)
    finally:
        module_globals["multiprocessing"] = saved


def wrap_after_import(module: ModuleType, name: str, hook: Callable[..., Any]) -> None:
    """Replace ``module.name`` by ``hook(original, ...)``, called by ``site_hooks`` once the
    module has finished importing. For the bridges that are not HookRegistry hooks: one whose
    module launch_server's ``load_plugins()`` can meet half-imported (a circular import, and the
    hook is lost), and one whose module (a model) every process would otherwise import at
    ``load_plugins()`` (HookRegistry imports each target's module)."""
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    setattr(module, name, wrapped)


# module -> (attribute, hook): applied by site_hooks after the module's import
AFTER_IMPORT: dict[str, tuple[str, Callable[..., Any]]] = {
    "sglang.srt.models.qwen2_moe": ("fused_gate_sigmoid_mul_add", shared_expert_gate_on_cpu),
}
# the same, only with EXPERT_LAYOUT_CPU_FORKSERVER=1
FORKSERVER_AFTER_IMPORT: dict[str, tuple[str, Callable[..., Any]]] = {
    "sglang.srt.entrypoints.engine": ("_set_envs_and_config", subprocesses_from_a_forkserver),
    "sglang.srt.weight_cache.daemon": ("spawn_weight_cache_daemon", daemons_from_a_forkserver),
}


BRIDGES: tuple[Bridge, ...] = (
    Bridge(
        "sglang.srt.layers.moe.fused_moe_native.moe_forward_native",
        "layers/moe/fused_moe_native.py:77",
        skip_other_rank_experts,
    ),
    Bridge(
        "torch.get_device_module",
        "eplb/eplb_manager.py:120,182; eplb/expert_location_updater.py:59; eplb/expert_distribution.py:992",
        default_device_module_is_cpu,
    ),
    Bridge(
        "sglang.srt.platforms.cpu.CpuDeviceMixin.get_device_uuid",
        "platforms/cpu.py:79",
        device_uuid_per_rank,
    ),
    Bridge(
        "sglang.srt.weight_cache.daemon.WeightCacheDaemon.load", "weight_cache/daemon.py:257-258", daemon_load_on_cpu
    ),
    Bridge("torch.cuda.memory_reserved", "weight_cache/daemon.py:358,392", no_cuda_memory_reserved),
    Bridge(
        "sglang.srt.model_loader.loader.get_model_loader",
        "model_executor/model_runner.py:1301 vs weight_cache/ipc_loader.py:388",
        daemon_pads_moe_like_engine,
    ),
)

_registered = False
_register_lock = threading.Lock()


def register() -> None:
    """Register every bridge with sglang's HookRegistry (applied by ``load_plugins()`` or
    ``HookRegistry.apply_hooks()``), and torch's ``file_system`` sharing for this process."""
    global _registered
    with _register_lock:
        if _registered:
            return
        import torch.multiprocessing
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        # multiprocessing/resource_sharer.py:86 (AuthenticationError): a standalone daemon and
        # its engines are unrelated processes; sglang's torch_ipc transport needs this on both.
        torch.multiprocessing.set_sharing_strategy("file_system")
        for bridge in BRIDGES:
            HookRegistry.register(bridge.target, bridge.hook, HookType.AROUND)
        _registered = True
        logger.info("[expert-layout cpu bridge] %d sglang 0.5.23 CPU bridges registered", len(BRIDGES))
