"""An engine-like parent for the spawn test: it spawns one weight cache daemon with sglang's
own ``spawn_weight_cache_daemon`` (the ``spawn`` start method, as the engine does with
``--weight-cache-mode daemon``) after installing hooks, and reports the child's exit code.

Usage: python -m tests.daemon_adapter.spawn_parent MODEL_DIR {plugin|class-only|none}
  plugin      sglang's load_plugins(), as every engine process runs it: the project's entry point
              (engine_adapter.plugin:register) calls daemon_adapter.install_daemon_hooks()
  class-only  only a REPLACE of the WeightCacheDaemon class (the trap: it does not reach the child)
  none        sglang as it is
"""

from __future__ import annotations

import socket
import sys


def main() -> None:
    model_dir, mode = sys.argv[1:]
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if mode == "plugin":
        from sglang.srt.plugins import load_plugins

        load_plugins()
    elif mode == "class-only":
        from daemon_adapter.daemon import LayoutAwareDaemon

        HookRegistry.register("sglang.srt.weight_cache.daemon.WeightCacheDaemon", LayoutAwareDaemon, HookType.REPLACE)
    HookRegistry.apply_hooks()

    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.weight_cache import daemon as sglang_daemon

    server_args = prepare_server_args(["--model-path", model_dir, "--enable-eplb", "--skip-tokenizer-init"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = sglang_daemon.spawn_weight_cache_daemon(
        server_args, gpu_id=0, tp_rank=0, pp_rank=0, dist_init_method=f"tcp://127.0.0.1:{port}"
    )
    process.join(300)
    print(f"child exit code {process.exitcode}", flush=True)


if __name__ == "__main__":
    main()
