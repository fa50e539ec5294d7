"""The expert-layout record inside sglang 0.5.23's real weight cache daemon (docs/protocol.md §4).

Public API:

- ``LayoutAwareDaemon`` (``daemon_adapter.daemon``): ``WeightCacheDaemon`` subclass that keeps
  the record, answers the ``expert_layout_*`` requests and gates ``fetch_state``;
  ``set_initial_layout(map, num_logical)``.
- ``install_daemon_hooks()`` (``daemon_adapter.hooks``): registers the sglang hooks that make
  daemons built or spawned by sglang layout-aware (the project's sglang plugin calls it);
  ``apply_daemon_hooks()`` also applies them; ``run_layout_aware_daemon`` is the spawn target.
- ``python -m daemon_adapter``: drop-in for ``python -m sglang.srt.weight_cache.daemon``.
- ``expert-layout status`` (``daemon_adapter.status_cli:main``).

Names are imported lazily: importing sglang costs seconds, and the CLI needs only part of it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LayoutAwareDaemon", "apply_daemon_hooks", "install_daemon_hooks", "run_layout_aware_daemon"]


def __getattr__(name: str) -> Any:
    if name == "LayoutAwareDaemon":
        from daemon_adapter.daemon import LayoutAwareDaemon

        return LayoutAwareDaemon
    if name in ("apply_daemon_hooks", "install_daemon_hooks", "run_layout_aware_daemon"):
        from daemon_adapter import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module 'daemon_adapter' has no attribute {name!r}")
