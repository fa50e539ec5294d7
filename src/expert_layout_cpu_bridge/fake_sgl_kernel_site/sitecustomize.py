"""Loads the expert-layout CPU test bridge into every Python process started with this folder on
PYTHONPATH (sglang's servers, schedulers, detokenizers and daemons, spawned ones included).

Only this project's real-server launchers put the folder on PYTHONPATH, and only with
``EXPERT_LAYOUT_CPU_BRIDGE=1``; nothing happens otherwise. The folder also holds the fake
``sgl_kernel`` that sglang imports on CPU. See ``expert_layout_cpu_bridge``; the test probes
(``expert_layout_real.engine_probes``) are registered here too, each off unless its variable is set.
"""

import os

if os.environ.get("EXPERT_LAYOUT_CPU_BRIDGE") == "1":
    try:
        from expert_layout_cpu_bridge.site_hooks import install
        from expert_layout_real.engine_probes import register_if_asked

        install(register_if_asked)
    except Exception as error:  # never stop the interpreter from starting; say why instead
        import sys

        print(f"[expert-layout cpu bridge] not installed: {error!r}", file=sys.stderr)
