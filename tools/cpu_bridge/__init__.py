"""The CPU bridge: what sglang 0.5.23 needs to run ``python -m sglang.launch_server`` with EPLB
and weight cache daemons on a CPU-only machine. **For tests, the demo and the bench only.**

It is off unless a launcher asks for it: ``bridge_env()`` returns the environment that turns it
on for a server or daemon command (and everything that command spawns). Nothing in this project
turns it on by itself, and ``bridge_env()`` refuses a machine where CUDA is available, so a GPU
deployment never runs with it.

- ``fake_sgl_kernel_site/``: put first on ``PYTHONPATH``. Holds ``sgl_kernel`` (FakeSglKernel, an
  import-only stand-in for sglang's kernel package, whose CPU build is not on PyPI: imported by
  ``kernels/ops/kvcache/cache_move.py:10``, ``mem_cache/allocation.py:46`` and speculative ops)
  and a ``sitecustomize`` that loads the bridge in every process that has
  ``EXPERT_LAYOUT_CPU_BRIDGE=1``.
- ``bridges``: one ``HookRegistry`` AROUND hook per sglang gap, each naming its sglang line (the
  Qwen2-MoE one is applied right after its model module's import instead, ``AFTER_IMPORT``); and
  two that are no gap but a speed measure (``FORKSERVER_AFTER_IMPORT``): a server's schedulers and
  detokenizer, and the weight cache daemons (``spawn_weight_cache_daemon``), are forked from a
  forkserver that imported sglang once, instead of each one importing it again.
- ``site_hooks``: registers the bridges when sglang's ``HookRegistry`` is imported; sglang's
  ``load_plugins()`` applies them in engine processes, and the import of
  ``sglang.srt.weight_cache.daemon`` applies them in daemon processes (which load no plugins).
- ``bridge_env()`` also sets sglang's own switches (``CPU_ENV``):
  ``SGLANG_USE_CPU_ENGINE=1`` (else ``layers/rotary_embedding/base.py:138`` imports vllm),
  ``SGLANG_CPU_OMP_THREADS_BIND`` (``utils/numa_utils.py:463`` asserts without it) and
  ``SGLANG_NCCL_SO_PATH`` at a missing file (pynccl is switched on for CPU at
  ``distributed/parallel_state.py:2183`` and fails without a CUDA device).

Server flags the CPU needs are in ``CPU_SERVER_ARGS`` (``--device cpu``, ``--max-total-tokens``:
the defaults reserve ~15 GB of KV cache). sglang's ``SGLANG_PLUGINS`` does not switch the bridge
off: ``SGLANG_PLUGINS=none`` leaves a server on CPU with this project's protocol off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from tools import with_project_path

ENABLE_ENV = "EXPERT_LAYOUT_CPU_BRIDGE"
FORKSERVER_ENV = "EXPERT_LAYOUT_CPU_FORKSERVER"  # on by default in bridge_env(); see site_hooks
# "module:function,..." that register more HookRegistry hooks in every bridged process (the real-server
# harness's probes); named by the launcher, so the bridge imports nothing above it.
EXTRA_HOOKS_ENV = "EXPERT_LAYOUT_CPU_BRIDGE_HOOKS"
SITE_DIR = Path(__file__).resolve().parent / "fake_sgl_kernel_site"
MISSING_NCCL = "/nonexistent/expert-layout-cpu-bridge/libnccl.so"

CPU_ENV: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "SGLANG_NCCL_SO_PATH": MISSING_NCCL,
}
CPU_SERVER_ARGS: tuple[str, ...] = ("--device", "cpu", "--max-total-tokens", "8192")


class BridgeRefused(RuntimeError):
    """The CPU bridge was asked for on a machine where it must not run."""


def omp_threads_bind(tp_size: int) -> str:
    """``SGLANG_CPU_OMP_THREADS_BIND`` for ``tp_size`` ranks sharing this machine's cores."""
    cores = os.cpu_count() or 1
    return "|".join(str(rank % cores) for rank in range(tp_size))


def bridge_env(base: Mapping[str, str] | None = None, tp_size: int = 2, forkserver: bool = True) -> dict[str, str]:
    """The environment for a command whose sglang processes run on this CPU with the bridge.

    ``forkserver``: a server's schedulers and detokenizer are forked from one process that
    imported sglang once, instead of sglang's "spawn" (each child imports sglang again, and a
    server's start costs more than twice the CPU time forked). Not a CPU gap, a
    speed measure for small test machines (``bridges.FORKSERVER_AFTER_IMPORT``)."""
    import torch

    if torch.cuda.is_available():
        raise BridgeRefused(
            "the expert-layout CPU bridge is for CPU-only test machines; CUDA is available here, "
            "so start sglang without it (do not call bridge_env())"
        )
    env = with_project_path(os.environ if base is None else base, SITE_DIR)
    env.update(CPU_ENV)
    env["SGLANG_CPU_OMP_THREADS_BIND"] = omp_threads_bind(tp_size)
    env[ENABLE_ENV] = "1"
    if forkserver:
        env[FORKSERVER_ENV] = "1"
    else:
        env.pop(FORKSERVER_ENV, None)
    return env
