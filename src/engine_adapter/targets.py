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

# A warm standby (docs/protocol.md §10, engine_adapter.standby). In the scheduler processes: sglang's in-place pause
# and its continue (every TP rank runs them on the same iteration: they ride the scheduler's broadcast
# of its inputs), the entry rank's per-iteration local inputs (the takeover request joins that
# broadcast), and the paused loop (where a parked entry rank sleeps until a request or a notice).
PAUSE_TARGET = "sglang.srt.managers.scheduler.Scheduler.pause_generation"
CONTINUE_TARGET = "sglang.srt.managers.scheduler.Scheduler.continue_generation"
LOCAL_INPUTS_TARGET = "sglang.srt.managers.scheduler.Scheduler._poll_timeout_aborts"
PAUSED_LOOP_TARGET = "sglang.srt.managers.scheduler.Scheduler._record_scheduler_state_for_paused_engine"
# In the HTTP server's process (engine_adapter.standby_server): the server status (held at Starting while
# the standby is parked: /health and /health_generate answer 503) and the dispatcher of what the scheduler
# sends back (the promotion).
SERVER_STATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._set_engine_state_field"
RESULT_DISPATCHER_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.init_request_dispatcher"

# Which of sglang's processes is loading the plugin. sglang calls ``load_plugins()`` first thing in each
# process, before anything says which process it is: the module of that call is the one fact there is.
# HookRegistry imports every registered target's module when it applies the hooks, so each process
# registers only the hooks it can run. The HTTP server's process (launch_server, ``sglang serve``, an
# ``Engine``) runs no model runner, scheduler, EPLB or weight loader (sglang starts those in its scheduler
# processes), and importing them for nothing would slow its start by thousands of modules; it builds no
# daemon either, it only spawns them. A scheduler builds and spawns no daemon (the daemon hooks would
# import the protocol's daemon side into each). The detokenizer runs none of the targets. Any other
# caller (a DP controller, a test, a launcher) gets every hook.
HTTP_SERVER_CALLERS = frozenset({"sglang.launch_server", "sglang.cli.serve", "sglang.srt.entrypoints.engine"})
SCHEDULER_CALLERS = frozenset({"sglang.srt.managers.scheduler"})
DETOKENIZER_CALLERS = frozenset({"sglang.srt.managers.detokenizer_manager"})
HTTP_SERVER_TARGETS = frozenset({SERVER_STATE_TARGET, RESULT_DISPATCHER_TARGET})
