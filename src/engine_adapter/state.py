"""What one rank process of the engine holds: its protocol session, its sockets, what it counted.

One object per process (sglang runs one model runner per rank process). Every protocol decision
and all protocol state are the ``session``'s (``layout_sm.session.EngineSession``); the rest is
what only this process has: its rank, its daemon's socket and attach connection, where its
weights came from, the EPLB manager whose rebalance runs now, and which warnings it logged.
What tests, the demo and the bench read (``Counters``) is kept apart from it. ``enabled`` is
sglang's own switch, read each time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from daemon_adapter.client import Attachment
from engine_adapter.trace import EngineTrace
from layout_sm.messages import request_wire
from layout_sm.session import EngineSession

if TYPE_CHECKING:
    from sglang.srt.eplb.eplb_manager import EPLBManager

    from engine_adapter.compat import InstallCheck

logger = logging.getLogger("engine_adapter")


@dataclass
class Counters:
    """What the hooks measured: seconds per step and chunks committed (no protocol state)."""

    timings: dict[str, list[float]] = field(default_factory=dict)
    chunks_committed: int = 0

    def record_time(self, what: str, seconds: float) -> None:
        self.timings.setdefault(what, []).append(seconds)

    def watch(self, session: EngineSession, rank: int) -> None:
        """Count the chunks this rank's daemon recorded, as the session takes their commit answers."""

        def count(event: str, arguments: Any, result: Any, view: Any) -> None:
            if event == "commit" and arguments["rank"] == rank and arguments["answer"].ok:
                self.chunks_committed += 1

        session.observers.append(count)


@dataclass
class EngineLayoutState:
    session: EngineSession | None = None  # made at startup (or at the first rebalance, unattached)
    rank: int | None = None
    socket_path: str | None = None
    attachment: Attachment | None = None
    weights_source: str | None = None  # "daemon" or "disk", set by the loader hook; None: unknown
    active_manager: EPLBManager | None = None  # the EPLBManager whose rebalance runs the chunk protocol now
    # A request sent and not read yet (a chunk's commit): its reader, and the session's event for its
    # reply, which is handed over before the rank's next step (engine_adapter.runner.flush).
    pending_reply: tuple[Callable[[], Any], Callable[[Any, float], Any]] | None = None
    move_result: Any = None  # what sglang's move of the current chunk returned
    moved_at: tuple[float, float] | None = None  # when that move began, and when the device synchronized
    logged: set[str] = field(default_factory=set)
    counters: Counters = field(default_factory=Counters)
    # engine_adapter.install_check: set by the startup hook (its having run is what the loader tells
    # the daemons), the check's result, and why this engine must not move shared experts (None: may).
    startup_hook_ran: bool = False
    install: InstallCheck | None = None
    shared_moves_blocked: str | None = None
    model_config: Any = None  # sglang's ModelConfig, for a map adopted after startup (a standby's promotion)
    # A warm standby's engine_adapter.standby.StandbyLink, once it parked (docs/protocol.md §10). Not named by its type:
    # standby imports the startup and rebalance hooks, which import this module.
    standby: Any = None
    trace: EngineTrace | None = None  # this rank's protocol trace (engine_adapter.trace), when asked for

    def log_once(self, level: int, key: str, message: str) -> None:
        """Disable reasons are logged once each, however many rebalances hit them."""
        if key in self.logged:
            return
        self.logged.add(key)
        logger.log(level, message)

    def fetch_field(self) -> dict[str, Any] | None:
        """The ``expert_layout`` field of ``fetch_state``, when this rank's session claims a layout."""
        if self.session is None or self.rank is None or self.attachment is None:
            return None
        claim = self.session.fetch_claim(self.rank)
        return None if claim is None else request_wire(claim)


_STATE = EngineLayoutState()
PLUGIN_NAME = "expert_layout"  # the entry point's name (pyproject.toml), as SGLANG_PLUGINS lists it


def get() -> EngineLayoutState:
    return _STATE


def reset() -> None:
    """End this engine's layout state: detach (the daemon sees EOF) and forget everything."""
    global _STATE
    if _STATE.attachment is not None:
        _STATE.attachment.close()
    _STATE = EngineLayoutState()


def enabled() -> bool:
    """Whether sglang's plugin switch (``SGLANG_PLUGINS``: empty, every plugin) selects this
    plugin now. False: the hooks pass everything through, as an engine without the plugin; they
    cannot be removed from a process once sglang applied them, so the switch is read each time."""
    from sglang.srt.environ import envs

    selected = envs.SGLANG_PLUGINS.get()
    return not selected or PLUGIN_NAME in {name.strip() for name in selected.split(",")}
