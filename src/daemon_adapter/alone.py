"""A daemon that starts again without its set: the daemons of a rebooted node, or one killed daemon.

sglang 0.5.23's ``WeightCacheDaemon._init_distributed`` meets every daemon of its set at one
rendezvous before it loads (``weight_cache/daemon.py``), and the daemons that stayed up have left
it long ago: a daemon started again alone waits there for ever. Yet loading needs no peer. It reads
this rank's shard of the checkpoint, and for that sglang's layers ask only the rank and the size of
their groups (tensor, expert, attention). No collective runs in a daemon; the tensor group's shared-memory
broadcaster, which serves the scheduler, is not built.

So a daemon started with ``START_ALONE_ENV`` builds every process group of ``_init_distributed``
with torch's ``fake`` backend: the same ranks and sizes as its set's, and no peer to wait for. It
loads from disk (version 0, the initial layout) and serves like any daemon. What it holds is then
the protocol's to settle: an engine's startup finds it fresh beside daemons at a moved record and
asks it to rejoin (docs/protocol.md §5).

Only where the daemons' groups are gloo. On CUDA, sglang builds NCCL communicators over these groups
(pynccl, custom all-reduce), and those exchange ids with their peers; a fake group would leave them
waiting. There the daemon refuses to start alone and says what to do instead.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

START_ALONE_ENV = "SGLANG_EXPERT_LAYOUT_START_ALONE"
FAKE_BACKEND = "fake"  # torch.distributed.Backend.FAKE


def start_alone_enabled() -> bool:
    """Whether daemons started now start without their set's peers (``START_ALONE_ENV``)."""
    return os.environ.get(START_ALONE_ENV, "0").strip().lower() in ("1", "true", "on", "yes")


class StartAloneUnsupported(RuntimeError):
    """This platform's daemons cannot start without their set."""


def _on_fake_backend(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (``init_process_group`` or ``new_group``) with its ``backend`` argument set to fake."""
    signature = inspect.signature(function)

    def on_fake(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["backend"] = FAKE_BACKEND
        return function(*bound.args, **bound.kwargs)

    return on_fake


@contextlib.contextmanager
def groups_without_peers(backend: str) -> Iterator[None]:
    """Within: every process group that torch.distributed creates is a fake one, of the ranks asked
    for, that talks to no peer. ``backend`` is the platform's (gloo alone is supported)."""
    if backend != "gloo":
        raise StartAloneUnsupported(
            f"{START_ALONE_ENV}: a daemon can start without its set's peers only where its process groups "
            f"are gloo (sglang's CPU platform); this platform's are {backend!r}, and sglang builds "
            f"communicators over them that wait for every peer. Start every daemon of the set again "
            f"instead (all nodes), without {START_ALONE_ENV}; docs/upstream-daemon-rendezvous.md has the "
            f"fix proposed to sglang."
        )
    import torch.distributed as dist
    from sglang.srt.environ import envs

    real = {name: getattr(dist, name) for name in ("init_process_group", "new_group")}
    for name, function in real.items():
        setattr(dist, name, _on_fake_backend(function))
    try:
        # The tensor group's shared-memory broadcaster (the scheduler's, not the loader's) would meet
        # its peers to agree on its buffer.
        with envs.SGLANG_USE_MESSAGE_QUEUE_BROADCASTER.override(False):
            yield
    finally:
        for name, function in real.items():
            setattr(dist, name, function)
