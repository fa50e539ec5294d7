"""What the engine side knows in one rank process: its id, attachment, layout and weight source.

One object per process (sglang runs one model runner per rank process). The hooks read and
write it; nothing here decides anything about the protocol.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from daemon_adapter.client import Attachment

logger = logging.getLogger("engine_adapter")


@dataclass
class EngineLayoutState:
    enabled: bool = True  # False: behave as an engine without this plugin (tests of old engines)
    engine_id: str | None = None
    rank: int | None = None
    socket_path: str | None = None
    attachment: Attachment | None = None
    session: str | None = None
    version: int | None = None  # the layout version the engine routes with, when attached
    digest: str | None = None
    startup: Any = None  # layout_sm's StartupOutcome
    shared_rebalance: bool = False
    weights_source: str | None = None  # "daemon" or "disk", set by the loader hook
    rebalance_mode: Any = None  # layout_sm's RebalanceMode, fixed at the first rebalance
    machine: Any = None  # layout_sm's RebalanceMachine: the rebalance phase ("off" is for good)
    active_manager: Any = None  # the EPLBManager whose rebalance runs the chunk protocol now
    chunks_committed: int = 0
    logged: set[str] = field(default_factory=set)
    timings: dict[str, list[float]] = field(default_factory=dict)

    def log_once(self, level: int, key: str, message: str) -> None:
        """Disable reasons are logged once each, however many rebalances hit them."""
        if key in self.logged:
            return
        self.logged.add(key)
        logger.log(level, message)

    def record_time(self, what: str, seconds: float) -> None:
        self.timings.setdefault(what, []).append(seconds)

    def fetch_field(self) -> dict[str, Any] | None:
        """The ``expert_layout`` field of ``fetch_state``, when this rank is attached."""
        if self.attachment is None or self.session is None or self.version is None or self.digest is None:
            return None
        from layout_sm.messages import fetch_layout_field

        assert self.engine_id is not None
        return fetch_layout_field(self.engine_id, self.session, self.version, self.digest)


_STATE = EngineLayoutState()


def get() -> EngineLayoutState:
    return _STATE


def reset() -> None:
    """End this engine's layout state: detach (the daemon sees EOF) and forget everything."""
    global _STATE
    if _STATE.attachment is not None:
        _STATE.attachment.close()
    _STATE = EngineLayoutState(enabled=_STATE.enabled)


def set_enabled(enabled: bool) -> None:
    _STATE.enabled = enabled
