"""Hooks that make sglang's weight cache daemons layout-aware, in this process and in the
daemons it spawns.

``install_daemon_hooks()`` registers three hooks with sglang's ``HookRegistry`` (sglang's
``load_plugins()`` applies them; a caller outside the plugin framework calls
``HookRegistry.apply_hooks()`` itself):

- REPLACE ``sglang.srt.weight_cache.daemon.WeightCacheDaemon`` by ``LayoutAwareDaemon``:
  every daemon built in this process (``run_weight_cache_daemon``) is layout-aware.
- AROUND ``sglang.srt.weight_cache.daemon.spawn_weight_cache_daemon`` (used by the engine
  with ``--weight-cache-mode daemon`` and by the all-local-ranks launcher). The daemon
  child is started with the ``spawn`` method: a fresh interpreter that unpickles its
  target *by qualified name*. sglang's target, ``run_weight_cache_daemon``, would resolve
  in the child to the unpatched function, so the class replacement above would not carry
  over. While sglang's spawn function runs, the hook points its target name at
  ``run_layout_aware_daemon``, a function of this package; the child imports this package,
  installs the hooks there, and then runs sglang's own ``run_weight_cache_daemon``.
- AROUND ``sglang.srt.weight_cache.daemon._await_cluster_ready_to_serve``, the barrier at which a
  daemon waits, before it serves, for every daemon of its set: a daemon started alone
  (``daemon_adapter.alone``) has no set there to wait for, and skips it.

``install_spawn_hook()`` registers the second alone, for a process that spawns daemons and builds none
(sglang's HTTP server process): it imports nothing of the protocol.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.weight_cache import daemon as sglang_daemon

logger = logging.getLogger(__name__)

DAEMON_CLASS_TARGET = "sglang.srt.weight_cache.daemon.WeightCacheDaemon"
SPAWN_TARGET = "sglang.srt.weight_cache.daemon.spawn_weight_cache_daemon"
READY_BARRIER_TARGET = "sglang.srt.weight_cache.daemon._await_cluster_ready_to_serve"
# The TCP port at which the daemons spawned on several nodes meet, the same on every node.
DAEMON_PORT_ENV = "SGLANG_EXPERT_LAYOUT_DAEMON_PORT"

_registered: set[str] = set()  # the targets registered in this process
_register_lock = threading.Lock()
# The spawn hook swaps a module global for the duration of one spawn call.
_spawn_lock = threading.Lock()


def install_daemon_hooks() -> None:
    """Register the layout-aware daemon hooks (idempotent). Called by the project's sglang
    plugin (``engine_adapter.plugin:register``), by ``python -m daemon_adapter`` and by every
    daemon child this package spawns."""
    from daemon_adapter.daemon import LayoutAwareDaemon

    _register(DAEMON_CLASS_TARGET, LayoutAwareDaemon, HookType.REPLACE)
    _register(READY_BARRIER_TARGET, _ready_barrier_unless_alone, HookType.AROUND)
    install_spawn_hook()


def install_spawn_hook() -> None:
    """Register only the spawn hook (idempotent): for a process that spawns daemons and builds none, as
    sglang's HTTP server process does with ``--weight-cache-mode daemon``. Its children still build
    layout-aware daemons (``run_layout_aware_daemon``); it imports nothing of the protocol."""
    _register(SPAWN_TARGET, _spawn_layout_aware_daemon, HookType.AROUND)


def _register(target: str, hook: Any, hook_type: HookType) -> None:
    with _register_lock:
        if target not in _registered:
            HookRegistry.register(target, hook, hook_type)
            _registered.add(target)


def apply_daemon_hooks() -> None:
    """``install_daemon_hooks()`` and apply them now (outside sglang's ``load_plugins``)."""
    install_daemon_hooks()
    HookRegistry.apply_hooks()


def run_layout_aware_daemon(
    server_args: Any, gpu_id: int, tp_rank: int, pp_rank: int, dist_init_method: str | None = None
) -> None:
    """The spawned daemon child's target: same arguments as sglang's ``run_weight_cache_daemon``."""
    apply_daemon_hooks()
    sglang_daemon.run_weight_cache_daemon(server_args, gpu_id, tp_rank, pp_rank, dist_init_method)


@contextlib.contextmanager
def _spawn_target_is_layout_aware() -> Iterator[None]:
    sglang_run = sglang_daemon.run_weight_cache_daemon
    sglang_daemon.run_weight_cache_daemon = run_layout_aware_daemon
    try:
        yield
    finally:
        sglang_daemon.run_weight_cache_daemon = sglang_run


def daemons_rendezvous(server_args: Any, dist_init_method: str | None) -> str | None:
    """The rendezvous of the daemons that sglang's engine spawns (``--weight-cache-mode daemon``).

    With ``--nnodes`` above 1, sglang 0.5.23 gives them the engines' own ``--dist-init-addr``: node 0's
    first daemon binds that port before node 0's scheduler does, which then fails with EADDRINUSE
    (docs/upstream-daemon-rendezvous.md). The daemons get a port of their own instead, the same on
    every node since every node has the same ``--dist-init-addr``: ``DAEMON_PORT_ENV`` when set, else
    the port just below it (sglang derives its own ports above it)."""
    if getattr(server_args, "nnodes", 1) <= 1 or not getattr(server_args, "dist_init_addr", None):
        return dist_init_method
    from sglang.srt.utils.network import NetworkAddress

    engines = NetworkAddress.parse(server_args.dist_init_addr)
    if dist_init_method != engines.to_tcp():  # not the engines' rendezvous: sglang's choice stands
        return dist_init_method
    chosen = os.environ.get(DAEMON_PORT_ENV)
    if chosen is not None and not chosen.isdigit():
        raise ValueError(f"{DAEMON_PORT_ENV}={chosen!r}: set it to a TCP port number, the same on every node")
    port = int(chosen) if chosen is not None else engines.port - 1
    if port == engines.port or not 0 < port < 65536:
        raise ValueError(
            f"the daemons' rendezvous port {port} is unusable beside --dist-init-addr {server_args.dist_init_addr}: "
            f"set {DAEMON_PORT_ENV} to a free TCP port, the same on every node"
        )
    return NetworkAddress(engines.host, port).to_tcp()


def _ready_barrier_unless_alone(barrier: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of sglang's readiness barrier: skipped by a daemon started alone."""
    from daemon_adapter.alone import START_ALONE_ENV, start_alone_enabled

    if start_alone_enabled():
        logger.info("started alone (%s): no readiness barrier with the set's other daemons", START_ALONE_ENV)
        return None
    return barrier(*args, **kwargs)


def _spawn_layout_aware_daemon(spawn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook of sglang's ``spawn_weight_cache_daemon``: its child runs
    ``run_layout_aware_daemon`` (resolvable by name in a fresh interpreter), and across nodes it
    meets the other nodes' daemons at a rendezvous of their own (``daemons_rendezvous``)."""
    if args and "dist_init_method" in kwargs:
        kwargs["dist_init_method"] = daemons_rendezvous(args[0], kwargs["dist_init_method"])
    with _spawn_lock, _spawn_target_is_layout_aware():
        process = spawn(*args, **kwargs)  # sglang's spawn pickles the target in start()
    logger.info("spawned layout-aware weight cache daemon pid=%s", getattr(process, "pid", None))
    return process
