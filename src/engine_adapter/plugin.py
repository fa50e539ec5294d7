"""The sglang plugin entry point (``sglang.srt.plugins`` group, ``expert_layout``).

sglang's ``load_plugins()`` calls ``register()`` in every engine process, then applies the hooks.
``SGLANG_PLUGINS`` (sglang's own whitelist) can leave the plugin out.
"""

from __future__ import annotations

import logging
import threading

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

logger = logging.getLogger("engine_adapter")

STARTUP_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_init_expert_location_metadata"
FETCH_TARGET = "sglang.srt.weight_cache.ipc_loader.IpcModelLoader._fetch_from_cache"
# HookRegistry rebinds every module that imported these two by name (daemon, transport, ipc_loader);
# the hooks act only inside a fetch_state of this engine and pass through everywhere else.
SEND_TARGET = "sglang.srt.weight_cache.protocol.send_msg"
RECV_TARGET = "sglang.srt.weight_cache.protocol.recv_msg"
REBALANCE_TARGET = "sglang.srt.eplb.eplb_manager.EPLBManager.rebalance"
CHUNK_TARGET = "sglang.srt.eplb.eplb_manager.update_expert_location_with_recovery"

_registered = False
_lock = threading.Lock()


def register() -> None:
    """Register the engine-side hooks and the layout-aware daemon hooks (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from daemon_adapter import install_daemon_hooks
        from engine_adapter import loader, rebalance, startup

        HookRegistry.register(STARTUP_TARGET, startup.around_maybe_init_expert_location_metadata, HookType.AROUND)
        HookRegistry.register(FETCH_TARGET, loader.around_fetch_from_cache, HookType.AROUND)
        HookRegistry.register(SEND_TARGET, loader.around_send_msg, HookType.AROUND)
        HookRegistry.register(RECV_TARGET, loader.around_recv_msg, HookType.AROUND)
        HookRegistry.register(REBALANCE_TARGET, rebalance.around_rebalance, HookType.AROUND)
        HookRegistry.register(CHUNK_TARGET, rebalance.around_update_expert_location_with_recovery, HookType.AROUND)
        # --weight-cache-mode daemon: the daemons this engine spawns are layout-aware too.
        install_daemon_hooks()
        _registered = True
        logger.info("[expert-layout] engine hooks registered")
