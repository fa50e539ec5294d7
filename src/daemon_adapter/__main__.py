"""``python -m daemon_adapter``: drop-in for ``python -m sglang.srt.weight_cache.daemon``.

Same arguments (sglang's ``WeightCacheDaemonArgs`` plus every ``ServerArgs`` flag), same
two modes: one daemon for ``--gpu-id``/``--tp-rank``, or all local ranks. The daemons run
sglang's own code with ``LayoutAwareDaemon`` in place of ``WeightCacheDaemon`` (see
``daemon_adapter.hooks``); with ``--enable-eplb`` they keep the expert-layout record.

Options of this package, taken out of the arguments before sglang's parsers see them; each
reaches every daemon, the spawned ones included, in the environment:

- ``--expert-layout-no-auto-repair`` (``SGLANG_EXPERT_LAYOUT_AUTO_REPAIR=0``): a daemon whose mover
  was killed mid-move stays dirty, for an operator who wants to look first, and repairs on
  ``expert-layout repair``.
- ``--expert-layout-start-alone`` (``SGLANG_EXPERT_LAYOUT_START_ALONE=1``): these daemons start
  again while the rest of their set runs (a rebooted node's, or one killed daemon): they load from
  disk without meeting the others (``daemon_adapter.alone``), and the next engine's startup has
  them rejoin at the others' record.
- ``--expert-layout-copy-dir DIR`` (``SGLANG_EXPERT_LAYOUT_COPY_DIR``): the folder of the daemons'
  durable copies of their records (``daemon_adapter.durable``; by default ``expert-layout`` beside
  each socket). A daemon started again loads at its copy's layout, so the layout EPLB learned
  outlives the loss of every daemon. Name a folder on a disk: a tmpfs is emptied by a reboot.
- ``--expert-layout-no-copy`` (``SGLANG_EXPERT_LAYOUT_COPY=0``): no durable copy is read or written;
  a daemon started again loads at the initial layout, version 0.

Options must be spelled out: argparse would read ``--tp 2`` as ``--tp-rank 2`` (the daemon's
own option, parsed first) where ``--tp-size 2`` was meant. sglang's own
``python -m sglang.srt.weight_cache.daemon`` still has that trap.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable

PROG = "python -m daemon_adapter"
NO_AUTO_REPAIR = "--expert-layout-no-auto-repair"
START_ALONE = "--expert-layout-start-alone"
NO_COPY = "--expert-layout-no-copy"
COPY_DIR = "--expert-layout-copy-dir"


def take_own_options(argv: list[str]) -> list[str]:
    """Apply this package's options (``NO_AUTO_REPAIR``, ``START_ALONE``, ``NO_COPY``, ``COPY_DIR``) and
    return the arguments for sglang's parsers."""
    from daemon_adapter.alone import START_ALONE_ENV
    from daemon_adapter.daemon import AUTO_REPAIR_ENV
    from daemon_adapter.durable import COPY_DIR_ENV, COPY_ENV

    end = argv.index("--") if "--" in argv else len(argv)
    own, rest = argv[:end], argv[end:]
    # The environment is inherited by the daemon children sglang spawns.
    flags = ((NO_AUTO_REPAIR, AUTO_REPAIR_ENV, "0"), (START_ALONE, START_ALONE_ENV, "1"), (NO_COPY, COPY_ENV, "0"))
    for option, env, value in flags:
        if option in own:
            os.environ[env] = value
            own = [arg for arg in own if arg != option]
    for i, arg in enumerate(own):
        if arg == COPY_DIR or arg.startswith(COPY_DIR + "="):
            folder = arg.partition("=")[2] if "=" in arg else (own[i + 1] if i + 1 < len(own) else "")
            if not folder or folder.startswith("--"):
                argparse.ArgumentParser(prog=PROG).error(
                    f"{COPY_DIR} needs a folder: {COPY_DIR} /var/lib/sglang/layout"
                )
            os.environ[COPY_DIR_ENV] = os.path.abspath(folder)
            own = own[:i] + own[i + (1 if "=" in arg else 2) :]
            break
    return own + rest


def refuse_abbreviations(argv: Iterable[str], parsers: Iterable[argparse.ArgumentParser]) -> None:
    """Exit with a usage error if any ``--option`` in ``argv`` is the abbreviation of one of the
    parsers' options rather than one of them."""
    known = {s for parser in parsers for action in parser._actions for s in action.option_strings}
    for arg in argv:
        if arg == "--":
            return
        name = arg.split("=", 1)[0]
        if not name.startswith("--") or name in known:
            continue
        candidates = sorted(option for option in known if option.startswith(name))
        if candidates:
            argparse.ArgumentParser(prog=PROG).error(
                f"option {name} is abbreviated (did you mean {' or '.join(candidates[:6])}?). Spell options "
                f"out in full: an abbreviation can be read as another option (--tp as --tp-rank)."
            )


def main(argv: list[str] | None = None) -> None:
    # Imports here: sglang takes seconds to import, and `--help` of this module should not
    # be slower than sglang's own.
    from sglang.srt.platforms import current_platform
    from sglang.srt.server_args import ServerArgs, prepare_server_args
    from sglang.srt.weight_cache import daemon as sglang_daemon
    from sglang.srt.weight_cache.protocol import cleanup_stale_daemon_files

    from daemon_adapter.hooks import apply_daemon_hooks

    apply_daemon_hooks()

    argv = take_own_options(sys.argv[1:] if argv is None else argv)
    worker_parser = argparse.ArgumentParser(prog=PROG, add_help=False, allow_abbrev=False)
    sglang_daemon.WeightCacheDaemonArgs.add_cli_args(worker_parser)
    server_parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False)
    ServerArgs.add_cli_args(server_parser)  # what prepare_server_args parses, to know its options
    refuse_abbreviations(argv, (worker_parser, server_parser))
    worker_ns, server_argv = worker_parser.parse_known_args(argv)
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
