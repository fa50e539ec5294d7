"""Every rank's small object, in one collective.

``torch.distributed.all_gather_object`` takes two collectives: every rank's size first, then the
pickled objects padded to the largest. The chunk protocol all-gathers once a chunk (each rank's
begin reply with its answer to the last commit), a few hundred bytes, and on a loaded host each collective costs a
scheduling round across the ranks. ``all_gather_small`` sends every rank's size and object in one
fixed-size slot; when an object does not fit (a startup finding that carries a whole map), every
rank sees it in the sizes and all of them gather the objects again with ``all_gather_object``.
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist
from sglang.srt.runtime_context import get_parallel

# The room for one object in the single collective: a begin reply and a commit answer are well under 1 KiB.
INLINE_BYTES = 4096
_SIZE_BYTES = 8


def all_gather_small(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj``, in rank order (the ranks of ``group``; None: the default group)."""
    world = dist.get_world_size(group)
    data = pickle.dumps(obj)
    slot = torch.zeros(_SIZE_BYTES + INLINE_BYTES, dtype=torch.uint8)
    slot[:_SIZE_BYTES] = torch.frombuffer(bytearray(len(data).to_bytes(_SIZE_BYTES, "little")), dtype=torch.uint8)
    if len(data) <= INLINE_BYTES:
        slot[_SIZE_BYTES : _SIZE_BYTES + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    slots = [torch.empty_like(slot) for _ in range(world)]
    dist.all_gather(slots, slot, group=group)
    gathered = [s.numpy().tobytes() for s in slots]
    sizes = [int.from_bytes(g[:_SIZE_BYTES], "little") for g in gathered]
    if max(sizes) > INLINE_BYTES:  # every rank sees the same sizes, so every rank takes this branch
        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj, group=group)
        return out
    return [pickle.loads(g[_SIZE_BYTES : _SIZE_BYTES + n]) for g, n in zip(gathered, sizes, strict=True)]


def world_cpu_group() -> Any:
    return get_parallel().world_group.cpu_group


def all_gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, over the world's CPU group, in one collective where it fits
    (``all_gather_small``). An engine of one rank has nothing to exchange: no collective."""
    group = world_cpu_group()
    world = dist.get_world_size(group)
    if world == 1:
        return [obj]
    return all_gather_small(obj, group)


__all__ = ["INLINE_BYTES", "all_gather", "all_gather_small", "world_cpu_group"]
