"""A daemon's durable copy of its record (spec: ``dcopy``, ``Persist``, ``StartFrom``).

What the copy holds, when the daemon's writer writes it, and what a daemon that starts makes of the
file it finds. Pure: the adapter reads and writes the bytes (``daemon_adapter.durable``) and does what
these functions say.

The copy is written after the commit is recorded in memory, by a writer of its own: a chunk never
waits for a disk, so a copy may be behind its record, never ahead of it. At its start a daemon loads
its experts at a whole copy's map, so its memory holds what its record says; a file it cannot use
is set aside, never overwritten, and the daemon starts at the initial layout and says why.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from layout_sm.daemon_view import DaemonView
from layout_sm.record import LayoutError, LayoutRecord

COPY_FORMAT = "sglang-expert-layout-copy"
COPY_FORMAT_VERSION = 1
# The phases in which the record is a committed layout: clean, and pending (the move's base, which
# the daemon's memory held before the move and reloads from the checkpoint at its start).
_WRITABLE_PHASES = ("clean", "pending")


@dataclass(frozen=True)
class CopyOwner:
    """What a copy belongs to: a copy of another checkpoint, or of another cache configuration (a
    rank, a parallelism, a quantization), names experts of other weights."""

    checkpoint: str  # the model's path (and revision), as the daemon was started with it
    config: str  # a digest of the daemon's cache configuration and initial layout (``owner_digest``)

    def to_wire(self) -> dict[str, str]:
        return {"checkpoint": self.checkpoint, "config": self.config}


def owner_digest(fields: Mapping[str, Any]) -> str:
    """A digest of a cache configuration's fields (their JSON, keys sorted): equal exactly when every
    field is."""
    text = json.dumps(dict(fields), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def copy_bytes(record: LayoutRecord, owner: CopyOwner) -> bytes:
    """The file's content: the record with its map and digest (``LayoutRecord.to_wire``'s fields), and its
    owner, as JSON. Each layer's row is encoded once per distinct row (``_row_json``): a commit changes a
    few layers, and the writer shares the daemon's interpreter with the chunk's requests."""
    head = {"format": COPY_FORMAT, "format_version": COPY_FORMAT_VERSION, "owner": owner.to_wire()}
    fields = record.to_wire(include_map=False)
    rows = ",".join(_row_json(layer) for layer in record.layer_bytes)
    text = json.dumps(head, separators=(",", ":"))[:-1] + ',"record":' + json.dumps(fields, separators=(",", ":"))
    return (text[:-1] + f',"map":[{rows}]}}}}\n').encode()


@lru_cache(maxsize=8192)
def _row_json(layer: bytes) -> str:
    """One layer's row (its int64 little-endian bytes, as ``LayoutRecord`` keeps it) as a JSON array."""
    values = array("q")
    values.frombytes(layer)
    if sys.byteorder != "little":
        values.byteswap()
    return json.dumps(values.tolist(), separators=(",", ":"))


def copy_due(view: DaemonView, on_disk: LayoutRecord | None) -> LayoutRecord | None:
    """The record the daemon's writer writes now, or None: the committed record, where the copy on
    disk is another (spec: ``Persist``). The writer asks again, under the daemon's lock, before it
    renames its file in place: only a record still due is made the copy."""
    if view.phase not in _WRITABLE_PHASES or view.record is None:
        return None
    record = view.record
    if on_disk is not None and on_disk.version == record.version and on_disk.digest == record.digest:
        return None
    return record


@dataclass(frozen=True)
class CopyRead:
    """What a starting daemon makes of its copy: the record to start from (None: the initial layout),
    and where it is not used, what kind of file it was and why."""

    record: LayoutRecord | None
    kind: str  # "whole", "missing", "torn", "corrupt", "other_format", "other_checkpoint", "other_config"
    why: str = ""

    @property
    def set_aside(self) -> bool:
        """A file is there and is not used: it is kept aside, not overwritten by the next copy."""
        return self.kind not in ("whole", "missing")


def read_copy(data: bytes | None, owner: CopyOwner, initial: LayoutRecord) -> CopyRead:
    """The record a daemon starts from, given its copy's bytes (None: no file) and the record of its
    initial layout (the shape and the logical experts a copy must have)."""
    if data is None:
        return CopyRead(None, "missing", "no durable copy yet")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return CopyRead(None, "torn", f"not whole JSON ({len(data)} bytes: {error}); a write cut short?")
    if not isinstance(body, dict):
        return CopyRead(None, "torn", f"not a JSON object but {type(body).__name__}")
    if body.get("format") != COPY_FORMAT or body.get("format_version") != COPY_FORMAT_VERSION:
        return CopyRead(
            None,
            "other_format",
            f"format {body.get('format')!r} version {body.get('format_version')!r}, this daemon reads "
            f"{COPY_FORMAT!r} version {COPY_FORMAT_VERSION}",
        )
    theirs = body.get("owner")
    if not isinstance(theirs, dict) or theirs.get("checkpoint") != owner.checkpoint:
        found = theirs.get("checkpoint") if isinstance(theirs, dict) else theirs
        return CopyRead(
            None, "other_checkpoint", f"a copy of checkpoint {found!r}, this daemon serves {owner.checkpoint!r}"
        )
    if theirs.get("config") != owner.config:
        return CopyRead(
            None,
            "other_config",
            f"a copy of cache configuration {theirs.get('config')!r}, this daemon's is {owner.config!r} "
            "(another rank, parallelism, quantization or initial layout: --init-expert-location)",
        )
    try:
        record = LayoutRecord.from_wire(body.get("record"))
    except LayoutError as error:
        return CopyRead(None, "corrupt", f"its record does not hold together: {error}")
    if record.shape != initial.shape or record.num_logical != initial.num_logical:
        return CopyRead(
            None,
            "other_config",
            f"a map of shape {list(record.shape)} over {record.num_logical} experts, this daemon's is "
            f"{list(initial.shape)} over {initial.num_logical}",
        )
    return CopyRead(record, "whole")
