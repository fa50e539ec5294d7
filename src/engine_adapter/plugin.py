"""The sglang plugin entry point (``sglang.srt.plugins`` group, ``expert_layout``).

sglang's ``load_plugins()`` calls ``register()`` in every engine process, then applies the hooks;
each process registers the hooks it can run (``hooks``). ``SGLANG_PLUGINS`` (sglang's own
whitelist) can leave the plugin out.
"""

from __future__ import annotations

import enum
import importlib
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from engine_adapter import roles
from engine_adapter.targets import (
    CALL_SITES,
    CHUNK_TARGET,
    CONTINUE_TARGET,
    DETOKENIZER_CALLERS,
    FETCH_TARGET,
    HTTP_SERVER_CALLERS,
    HTTP_SERVER_TARGETS,
    LOCAL_INPUTS_TARGET,
    PAUSE_TARGET,
    PAUSED_LOOP_TARGET,
    REBALANCE_TARGET,
    RECV_TARGET,
    RESULT_DISPATCHER_TARGET,
    SCHEDULER_CALLERS,
    SEND_TARGET,
    SERVER_STATE_TARGET,
    STARTUP_TARGET,
)

__all__ = [
    "CALL_SITES",
    "CHUNK_TARGET",
    "FETCH_TARGET",
    "REBALANCE_TARGET",
    "RECV_TARGET",
    "SEND_TARGET",
    "STARTUP_TARGET",
    "SglangProcess",
    "hooks",
    "register",
    "sglang_process",
]

logger = logging.getLogger("engine_adapter")

_registered = False
_lock = threading.Lock()


class SglangProcess(enum.Enum):
    """Which of sglang's processes loads the plugin (``engine_adapter.targets``: why it matters)."""

    HTTP_SERVER = "http server"  # the tokenizer manager; it spawns the daemons in --weight-cache-mode daemon
    SCHEDULER = "scheduler"  # a TP rank: model runner, EPLB, the weight loader
    DETOKENIZER = "detokenizer"
    ENGINE = "engine"  # any process not known to run none of the targets: every hook


def _module_name(namespace: Mapping[str, Any]) -> str:
    name = str(namespace.get("__name__", ""))
    spec = namespace.get("__spec__")  # python -m sglang.launch_server runs as __main__
    return str(spec.name) if name == "__main__" and spec is not None else name


def sglang_process() -> SglangProcess:
    """The process of the ``load_plugins()`` call this runs in, by the module that made the call."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "load_plugins" and frame.f_globals.get("__name__") == "sglang.srt.plugins":
            caller = _module_name(frame.f_back.f_globals) if frame.f_back is not None else ""
            if caller in HTTP_SERVER_CALLERS:
                return SglangProcess.HTTP_SERVER
            if caller in SCHEDULER_CALLERS:
                return SglangProcess.SCHEDULER
            if caller in DETOKENIZER_CALLERS:
                return SglangProcess.DETOKENIZER
            break
        frame = frame.f_back
    return SglangProcess.ENGINE


# (target, the engine_adapter module of its AROUND hook, the hook's name)
_PROTOCOL_HOOKS = (
    (STARTUP_TARGET, "startup", "around_maybe_init_expert_location_metadata"),
    (FETCH_TARGET, "loader", "around_fetch_from_cache"),
    (SEND_TARGET, "loader", "around_send_msg"),
    (RECV_TARGET, "loader", "around_recv_msg"),
    (REBALANCE_TARGET, "rebalance", "around_rebalance"),
    (CHUNK_TARGET, "rebalance", "around_update_expert_location_with_recovery"),
)
_STANDBY_HOOKS = (  # a primary carries none of them
    (PAUSE_TARGET, "standby", "around_pause_generation"),
    (CONTINUE_TARGET, "standby", "around_continue_generation"),
    (LOCAL_INPUTS_TARGET, "standby", "around_poll_timeout_aborts"),
    (PAUSED_LOOP_TARGET, "standby", "around_paused_loop"),
    (SERVER_STATE_TARGET, "standby_server", "around_set_engine_state_field"),
    (RESULT_DISPATCHER_TARGET, "standby_server", "around_init_request_dispatcher"),
)


def hooks(
    standby: bool = False, process: SglangProcess = SglangProcess.ENGINE
) -> tuple[tuple[str, Callable[..., Any]], ...]:
    """Every (target, AROUND hook) ``process`` can run, in registration order (a warm standby's too if
    ``standby``): a standby's server status and result dispatcher in the HTTP server's process, all the
    others in a scheduler, none in the detokenizer, every one elsewhere. Only the modules of those hooks
    are imported."""
    rows = _PROTOCOL_HOOKS + (_STANDBY_HOOKS if standby else ())
    if process is SglangProcess.HTTP_SERVER:
        rows = tuple(row for row in rows if row[0] in HTTP_SERVER_TARGETS)
    elif process is SglangProcess.SCHEDULER:
        rows = tuple(row for row in rows if row[0] not in HTTP_SERVER_TARGETS)
    elif process is SglangProcess.DETOKENIZER:
        rows = ()
    return tuple((target, getattr(importlib.import_module(f"engine_adapter.{m}"), name)) for target, m, name in rows)


def _standby_role() -> bool:
    """Whether this engine starts as a warm standby. A role that is not one registers a primary's hooks;
    the startup hook then fails the engine with the variable and the valid roles."""
    try:
        return roles.is_standby()
    except roles.RoleError:
        return False


def register() -> None:
    """Register the engine-side hooks and the layout-aware daemon hooks (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        process = sglang_process()
        # sglang applies them after register() returns and only logs a target it fails to apply;
        # a scheduler's startup hook checks that each is in place (engine_adapter.install_check).
        registered = hooks(_standby_role(), process)
        for target, hook in registered:
            HookRegistry.register(target, hook, HookType.AROUND)
        if process in (SglangProcess.SCHEDULER, SglangProcess.ENGINE):
            from engine_adapter import install_check

            install_check.expect(registered)
        # --weight-cache-mode daemon: the daemons spawned here are layout-aware (they install the rest);
        # a process not known to build none gets the daemon's class too.
        if process is SglangProcess.HTTP_SERVER:
            from daemon_adapter.hooks import install_spawn_hook

            install_spawn_hook()
        elif process is SglangProcess.ENGINE:
            from daemon_adapter import install_daemon_hooks

            install_daemon_hooks()
        _registered = True
        logger.info("[expert-layout] hooks registered for sglang's %s process", process.value)
