"""Loads the expert-layout CPU test bridge into every Python process started with this folder on
PYTHONPATH (sglang's servers, schedulers, detokenizers and daemons, spawned ones included).

Only this project's real-server launchers put the folder on PYTHONPATH, and only with
``EXPERT_LAYOUT_CPU_BRIDGE=1``; nothing happens otherwise. The folder also holds the fake
``sgl_kernel`` that sglang imports on CPU. See ``tools.cpu_bridge``; the functions named
in ``EXPERT_LAYOUT_CPU_BRIDGE_HOOKS`` (``module:function,...``; the real-server harness names its
probes there) register their hooks too.

Python loads one ``sitecustomize``, the first on the path; this one then runs the next one on the
path, if any (``make mutants`` puts its own there, to break a rule in every process it starts).
"""

import os


def _run_the_next_sitecustomize() -> None:
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(entry or ".") for entry in sys.path]
    later = entries[entries.index(here) + 1 :] if here in entries else []
    for entry in later:
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if os.environ.get("EXPERT_LAYOUT_CPU_BRIDGE") == "1":
    try:
        from tools.cpu_bridge.site_hooks import install, named_functions

        install(*named_functions(os.environ.get("EXPERT_LAYOUT_CPU_BRIDGE_HOOKS", "")))
    except Exception as error:  # never stop the interpreter from starting; say why instead
        import sys

        print(f"[expert-layout cpu bridge] not installed: {error!r}", file=sys.stderr)

try:
    _run_the_next_sitecustomize()
except Exception as error:  # as above: say why, never stop the interpreter
    import sys

    print(f"[expert-layout cpu bridge] the next sitecustomize failed: {error!r}", file=sys.stderr)
