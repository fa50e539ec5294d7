"""Apply the mutant named by $LAYOUT_MUTANT when its target module is imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any


class _PatchAfterExec(importlib.abc.MetaPathFinder):
    """Finds the target module with the other finders, then patches it right after it executes.

    Patching before any other module runs `from target import name` makes every such name the
    mutated one, in the test process and in every process it spawns.
    """

    def __init__(self, target: str, patch: Any) -> None:
        self.target = target
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.target:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader = spec.loader
        orig_exec = loader.exec_module  # type: ignore[union-attr]
        patch = self.patch

        def exec_module(module: ModuleType) -> None:
            orig_exec(module)
            patch(module)

        loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]
        return spec


def install() -> str | None:
    from tests.model_based.mutants.catalog import active, apply

    m = active()
    if m is None:
        return None
    if m.target in sys.modules:
        apply(sys.modules[m.target], m.name)
    else:
        sys.meta_path.insert(0, _PatchAfterExec(m.target, lambda mod: apply(mod, m.name)))
    return m.name
