"""``python -m daemon_adapter``: drop-in for ``python -m sglang.srt.weight_cache.daemon``.

Same arguments (sglang's ``WeightCacheDaemonArgs`` plus every ``ServerArgs`` flag), same
two modes: one daemon for ``--gpu-id``/``--tp-rank``, or all local ranks. The daemons run
sglang's own code with ``LayoutAwareDaemon`` in place of ``WeightCacheDaemon`` (see
``daemon_adapter.hooks``); with ``--enable-eplb`` they keep the expert-layout record.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> None:
    # Imports here: sglang takes seconds to import, and `--help` of this module should not
    # be slower than sglang's own.
    from sglang.srt.platforms import current_platform
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.weight_cache import daemon as sglang_daemon
    from sglang.srt.weight_cache.protocol import cleanup_stale_daemon_files

    from daemon_adapter.hooks import apply_daemon_hooks

    apply_daemon_hooks()

    worker_parser = argparse.ArgumentParser(add_help=False)
    sglang_daemon.WeightCacheDaemonArgs.add_cli_args(worker_parser)
    worker_ns, server_argv = worker_parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    server_args = prepare_server_args(server_argv)
    daemon_args = sglang_daemon.WeightCacheDaemonArgs.from_cli_args(worker_ns)

    if daemon_args.gpu_id is None and daemon_args.tp_rank is None:
        sglang_daemon.launch_weight_cache_daemons(
            server_args,
            dist_init_method=daemon_args.dist_init_method,
            timeout=daemon_args.timeout,
            force=daemon_args.force,
        )
        return
    # One daemon: each of --gpu-id / --tp-rank defaults to the other, as in sglang's
    # `__main__` block (which cannot be imported, so these lines follow it).
    gpu_id = daemon_args.gpu_id if daemon_args.gpu_id is not None else daemon_args.tp_rank
    tp_rank = daemon_args.tp_rank if daemon_args.tp_rank is not None else daemon_args.gpu_id
    assert gpu_id is not None and tp_rank is not None
    cleanup_stale_daemon_files(current_platform.get_device_uuid(gpu_id), force=daemon_args.force)
    sglang_daemon.run_weight_cache_daemon(
        server_args,
        gpu_id=gpu_id,
        tp_rank=tp_rank,
        pp_rank=daemon_args.pp_rank,
        dist_init_method=daemon_args.dist_init_method,
    )


if __name__ == "__main__":
    main()
