"""The sglang plugin entry point (``sglang.srt.plugins`` group, ``expert_layout``).

sglang's ``load_plugins()`` calls ``register()`` in every engine process, then applies the hooks.
``SGLANG_PLUGINS`` (sglang's own whitelist) can leave the plugin out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from engine_adapter import install_check, roles
from engine_adapter.targets import (
    CALL_SITES,
    CHUNK_TARGET,
    CONTINUE_TARGET,
    FETCH_TARGET,
    LOCAL_INPUTS_TARGET,
    PAUSE_TARGET,
    PAUSED_LOOP_TARGET,
    REBALANCE_TARGET,
    RECV_TARGET,
    RESULT_DISPATCHER_TARGET,
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
    "hooks",
    "register",
]

logger = logging.getLogger("engine_adapter")

_registered = False
_lock = threading.Lock()


def hooks(standby: bool = False) -> tuple[tuple[str, Callable[..., Any]], ...]:
    """Every (target, AROUND hook) the protocol needs, in registration order; ``standby``: with a warm
    standby's (a primary carries none of them)."""
    from engine_adapter import loader, rebalance, startup

    protocol = (
        (STARTUP_TARGET, startup.around_maybe_init_expert_location_metadata),
        (FETCH_TARGET, loader.around_fetch_from_cache),
        (SEND_TARGET, loader.around_send_msg),
        (RECV_TARGET, loader.around_recv_msg),
        (REBALANCE_TARGET, rebalance.around_rebalance),
        (CHUNK_TARGET, rebalance.around_update_expert_location_with_recovery),
    )
    if not standby:
        return protocol
    from engine_adapter import standby as parked

    return (
        *protocol,
        (PAUSE_TARGET, parked.around_pause_generation),
        (CONTINUE_TARGET, parked.around_continue_generation),
        (LOCAL_INPUTS_TARGET, parked.around_poll_timeout_aborts),
        (PAUSED_LOOP_TARGET, parked.around_paused_loop),
        (SERVER_STATE_TARGET, parked.around_set_engine_state_field),
        (RESULT_DISPATCHER_TARGET, parked.around_init_request_dispatcher),
    )


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
        from daemon_adapter import install_daemon_hooks

        # sglang applies them after register() returns and only logs a target it fails to apply;
        # the startup hook checks that each is in place (engine_adapter.install_check).
        registered = hooks(_standby_role())
        for target, hook in registered:
            HookRegistry.register(target, hook, HookType.AROUND)
        install_check.expect(registered)
        # --weight-cache-mode daemon: the daemons this engine spawns are layout-aware too.
        install_daemon_hooks()
        _registered = True
        logger.info("[expert-layout] engine hooks registered")
