"""``python -m tools.realserver.plain_daemons <ServerArgs flags>``: sglang's own weight cache
daemons for every local rank (sglang's ``launch_weight_cache_daemons``), without this project's
layout-aware hooks: the "plain sglang daemons" of the compatibility cases.

sglang's ``python -m sglang.srt.weight_cache.daemon`` would do the same, but it runs the daemon
module as ``__main__``, where the CPU bridge (which hooks ``sglang.srt.weight_cache.daemon`` by
name) cannot reach it. This module imports it by name and calls sglang's function.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.weight_cache import daemon as sglang_daemon

    server_args = prepare_server_args(sys.argv[1:] if argv is None else argv)
    sglang_daemon.launch_weight_cache_daemons(server_args)


if __name__ == "__main__":
    main()
