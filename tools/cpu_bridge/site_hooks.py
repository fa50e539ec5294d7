"""Run code right after a named module is first imported (used by the bridge's sitecustomize).

sglang's engine processes call ``load_plugins()``, which applies every hook registered with
``HookRegistry``; a daemon process does not. So the bridge registers its hooks as soon as
``sglang.srt.plugins.hook_registry`` exists (before any ``load_plugins()``), and applies them
itself once ``sglang.srt.weight_cache.daemon`` is imported (the first sglang module a spawned or
standalone daemon imports that the bridge patches).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tools.cpu_bridge import FORKSERVER_ENV

HOOK_REGISTRY_MODULE = "sglang.srt.plugins.hook_registry"
DAEMON_MODULE = "sglang.srt.weight_cache.daemon"


class _ThenCall(importlib.abc.Loader):
    """The module's own loader, then ``after(module)``."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package...
        return getattr(self._loader, name)


class AfterImport(importlib.abc.MetaPathFinder):
    """A meta-path finder that finds nothing itself: it wraps the loader of a few named modules."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self._callbacks = dict(callbacks)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        after = self._callbacks.pop(fullname, None)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _ThenCall(spec.loader, after)
                return spec
        return None


def _on_daemon(_module: ModuleType) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()


def named_functions(spec: str) -> list[Callable[[], None]]:
    """The functions of ``"module:function,..."`` (``EXTRA_HOOKS_ENV``), imported when called."""
    out: list[Callable[[], None]] = []
    for name in filter(None, (part.strip() for part in spec.split(","))):
        module_name, _, attribute = name.partition(":")

        def call(module_name: str = module_name, attribute: str = attribute) -> None:
            getattr(importlib.import_module(module_name), attribute)()

        out.append(call)
    return out


def install(*also_register: Callable[[], None]) -> None:
    """Called by the bridge's sitecustomize, before ``__main__`` runs. ``also_register``: more
    functions that register HookRegistry hooks (the test probes), called after the bridges'."""

    def on_hook_registry(_module: ModuleType) -> None:
        from tools.cpu_bridge import bridges

        bridges.register()
        for register in also_register:
            register()

    from tools.cpu_bridge import bridges

    wraps = dict(bridges.AFTER_IMPORT)
    if os.environ.get(FORKSERVER_ENV) == "1":
        wraps.update(bridges.FORKSERVER_AFTER_IMPORT)
    callbacks: dict[str, Callable[[ModuleType], None]] = {
        HOOK_REGISTRY_MODULE: on_hook_registry,
        DAEMON_MODULE: _on_daemon,
    }
    for module_name, (attribute, hook) in wraps.items():
        wrap = functools.partial(bridges.wrap_after_import, name=attribute, hook=hook)
        callbacks[module_name] = _then(wrap, callbacks[module_name]) if module_name in callbacks else wrap
    sys.meta_path.insert(0, AfterImport(callbacks))


def _then(first: Callable[[ModuleType], None], second: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    """Both callbacks of one module, in this order (a wrap, then the hooks applied over it)."""

    def both(module: ModuleType) -> None:
        first(module)
        second(module)

    return both
