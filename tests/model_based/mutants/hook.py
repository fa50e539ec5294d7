"""Apply the mutant named by $LAYOUT_MUTANT when its target module is imported.

Patching right after the target executes, before any other module runs `from target import name`,
makes every such name the mutated one, in the test process and in every process it spawns. The
import hook is the CPU bridge's (`tools.cpu_bridge.site_hooks.AfterImport`, stdlib only).
"""

from __future__ import annotations

import sys

from tools.cpu_bridge.site_hooks import AfterImport


def install() -> str | None:
    from tests.model_based.mutants.catalog import active, apply

    m = active()
    if m is None:
        return None
    if m.target in sys.modules:
        apply(sys.modules[m.target], m.name)
    else:
        sys.meta_path.insert(0, AfterImport({m.target: lambda mod: apply(mod, m.name)}))
    return m.name
