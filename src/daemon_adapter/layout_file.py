"""sglang's ``--init-expert-location`` file of an expert layout, and the durable write of every layout file.

sglang 0.5.23 reads the file in ``compute_initial_expert_location_metadata``
(``sglang/srt/eplb/expert_location.py``): a path ending in ``.json`` is parsed as JSON (any other
value is read as inline JSON, or with ``torch.load`` when it ends in ``.pt``), and a dict with
``physical_to_logical_map`` is passed whole as keyword arguments to
``ExpertLocationMetadata.init_by_mapping(model_config, **data_dict, moe_ep_rank=...)``, which
computes every other table (``logical_to_all_physical_map`` and the dispatch maps) from it. So the
file holds that one key and nothing else: any other key (a version, a digest) fails the server's
start with a ``TypeError``. The map is the record's rows as they are (``LayoutRecord.rows``), the very
``physical_to_logical_map`` the engine plugin installs (``engine_adapter.runner.install``).

sglang checks neither the map's number of layers nor its width against the model and
``--ep-num-redundant-experts``: a server must be started with the daemons' model and redundant
experts (physical slots minus logical experts).

The write is the one durable write of etcd's WAL and bbolt: a temporary file in the same folder,
``fsync``, ``os.replace`` over the target, ``fsync`` of the folder. A reader sees the old file or the
new one, never a part; a write that fails leaves the old file as it was and no temporary behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

INIT_EXPERT_LOCATION_KEY = "physical_to_logical_map"
# The suffix that makes sglang read the value as a JSON file (compute_initial_expert_location_metadata).
INIT_EXPERT_LOCATION_SUFFIX = ".json"


def init_expert_location_json(rows: Sequence[Sequence[int]]) -> str:
    """The file's text: ``{"physical_to_logical_map": [[...], ...]}``, one layer a line (for a diff)."""
    layers = ",\n".join(json.dumps([int(v) for v in row], separators=(",", ":")) for row in rows)
    return f'{{"{INIT_EXPERT_LOCATION_KEY}": [\n{layers}\n]}}\n'


def write_temporary(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a new temporary file beside ``path``, flushed to disk (``fsync``): the first half
    of ``write_atomically``. The caller puts it in place (``replace_durably``) or removes it."""
    target = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            # mkstemp makes the file owner-only; the layout is no secret: the mode a plain open gives.
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(out.fileno(), 0o666 & ~umask)
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return Path(temporary)


def put_in_place(temporary: Path, path: str | os.PathLike[str]) -> None:
    """Rename ``temporary`` over ``path``: a reader sees the old file or the new one. Durable across a
    power loss once the folder is synced (``sync_folder``); across a process's death at once."""
    try:
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def sync_folder(path: str | os.PathLike[str]) -> None:
    """``fsync`` the folder that holds ``path``: the rename into it is then durable."""
    folder_fd = os.open(Path(path).parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(folder_fd)
    finally:
        os.close(folder_fd)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` (see the module docstring); raises OSError, the old file untouched."""
    put_in_place(write_temporary(path, text.encode("utf-8")), path)
    sync_folder(path)


__all__ = [
    "INIT_EXPERT_LOCATION_KEY",
    "INIT_EXPERT_LOCATION_SUFFIX",
    "init_expert_location_json",
    "put_in_place",
    "sync_folder",
    "write_atomically",
    "write_temporary",
]
