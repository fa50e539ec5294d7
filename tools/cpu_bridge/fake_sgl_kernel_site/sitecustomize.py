"""Loads the expert-layout CPU test bridge into every Python process started with this folder on
PYTHONPATH (sglang's servers, schedulers, detokenizers and daemons, spawned ones included).

Only this project's real-server launchers put the folder on PYTHONPATH, and only with
``EXPERT_LAYOUT_CPU_BRIDGE=1``; nothing happens otherwise. The folder also holds the fake
``sgl_kernel`` that sglang imports on CPU. See ``tools.cpu_bridge``; the functions named
in ``EXPERT_LAYOUT_CPU_BRIDGE_HOOKS`` (``module:function,...``; the real-server harness names its
probes there) register their hooks too.
"""

import os

if os.environ.get("EXPERT_LAYOUT_CPU_BRIDGE") == "1":
    try:
        from tools.cpu_bridge.site_hooks import install, named_functions

        install(*named_functions(os.environ.get("EXPERT_LAYOUT_CPU_BRIDGE_HOOKS", "")))
    except Exception as error:  # never stop the interpreter from starting; say why instead
        import sys

        print(f"[expert-layout cpu bridge] not installed: {error!r}", file=sys.stderr)
