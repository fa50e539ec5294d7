"""What sglang functions the plugin hooks (``engine_adapter.plugin``), and where sglang calls them from.

A module of names only, so that the plugin, which imports every hook, and the install check, which the
startup hook runs, both read them without importing each other.
"""

from __future__ import annotations

STARTUP_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.maybe_init_expert_location_metadata"
FETCH_TARGET = "sglang.srt.weight_cache.ipc_loader.IpcModelLoader._fetch_from_cache"
# HookRegistry rebinds every module that imported these two by name (daemon, transport, ipc_loader);
# the hooks act only inside a fetch_state of this engine and pass through everywhere else.
SEND_TARGET = "sglang.srt.weight_cache.protocol.send_msg"
RECV_TARGET = "sglang.srt.weight_cache.protocol.recv_msg"
REBALANCE_TARGET = "sglang.srt.eplb.eplb_manager.EPLBManager.rebalance"
CHUNK_TARGET = "sglang.srt.eplb.eplb_manager.update_expert_location_with_recovery"
# Where sglang calls each target from, when that is another name than the target itself: its loader
# calls the send_msg/recv_msg it imported by name (``engine_adapter.install_check`` checks these).
CALL_SITES: dict[str, tuple[str, ...]] = {
    SEND_TARGET: ("sglang.srt.weight_cache.ipc_loader.send_msg",),
    RECV_TARGET: ("sglang.srt.weight_cache.ipc_loader.recv_msg",),
}
