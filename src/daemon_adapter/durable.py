"""The daemon's durable copy of its record on disk: where it lies, what a starting daemon reads, and the
writer that keeps it (spec: ``dcopy``, ``Persist``, ``StartFrom``).

``layout_sm.durable`` decides what is written and whether a file found at the start is used; this
module only reads, writes and renames files.

- One file per daemon, ``<socket file name>.layout.json``, in the folder ``COPY_DIR_ENV`` names, or
  by default a folder ``expert-layout`` beside the daemon's socket. ``COPY_ENV=0`` turns the copy off:
  nothing is read or written. (``python -m daemon_adapter --expert-layout-copy-dir DIR`` and
  ``--expert-layout-no-copy`` set them, for every daemon sglang spawns.) Sockets often live on a
  tmpfs (``/tmp``, ``/dev/shm``) that a reboot empties: name a folder on a disk to outlive one.
- The writer is a thread of its own, woken after every step that may change the record: a chunk's
  commit never waits for a disk. It writes the record ``copy_due`` names to a temporary file and
  flushes it (``fsync``) outside the daemon's lock, then, under the lock, renames it in place only if
  that record is still due (so the copy is always a record the daemon held when the copy took
  effect, as the spec's ``Persist`` says), and syncs the folder after. A daemon killed before the
  rename leaves the previous copy in force.
- A file the starting daemon cannot use is renamed aside (``<name>.set-aside-<kind>-<unix time>``),
  never overwritten, and the daemon says why in its log and in ``expert-layout status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from daemon_adapter.layout_file import put_in_place, sync_folder, write_temporary
from layout_sm.daemon_view import DaemonView
from layout_sm.durable import CopyOwner, CopyRead, copy_bytes, copy_due, read_copy
from layout_sm.record import LayoutRecord

logger = logging.getLogger(__name__)

COPY_ENV = "SGLANG_EXPERT_LAYOUT_COPY"  # "0": no durable copy
COPY_DIR_ENV = "SGLANG_EXPERT_LAYOUT_COPY_DIR"  # the copies' folder (default: DEFAULT_FOLDER beside the socket)
DEFAULT_FOLDER = "expert-layout"
COPY_SUFFIX = ".layout.json"
# A copy larger than this is not a record of this project's (a map of 4096 layers x 65536 slots in
# JSON is far below it): it is set aside unread.
MAX_COPY_BYTES = 1 << 30


def copy_enabled() -> bool:
    return os.environ.get(COPY_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def copy_path(socket_path: str) -> Path | None:
    """The file of the daemon listening on ``socket_path``; None when the copy is off (or no socket)."""
    if not copy_enabled() or not socket_path:
        return None
    socket = Path(socket_path)
    folder = Path(os.environ.get(COPY_DIR_ENV) or socket.parent / DEFAULT_FOLDER)
    return folder / f"{socket.name}{COPY_SUFFIX}"


def read_at_start(path: Path, owner: CopyOwner, initial: LayoutRecord) -> CopyRead:
    """Read the copy at ``path`` as ``layout_sm.durable.read_copy`` judges it; set a file it does not
    use aside, and remove the temporaries of a writer killed before its rename. An unreadable file
    (permissions, an I/O error) is judged as torn and left where it is."""
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):  # a writer killed before its rename
        with contextlib.suppress(OSError):
            leftover.unlink()
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return read_copy(None, owner, initial)
    except OSError as error:
        return CopyRead(None, "torn", f"cannot read {path}: {error}")
    if size > MAX_COPY_BYTES:
        read = CopyRead(None, "torn", f"{size} bytes, more than any record ({MAX_COPY_BYTES})")
    else:
        try:
            read = read_copy(path.read_bytes(), owner, initial)
        except OSError as error:
            return CopyRead(None, "torn", f"cannot read {path}: {error}")
    if read.set_aside:
        aside = path.with_name(f"{path.name}.set-aside-{read.kind}-{int(time.time())}")
        try:
            os.replace(path, aside)
        except OSError as error:
            return CopyRead(None, read.kind, f"{read.why}; it could not be set aside ({error}): move it away")
        return CopyRead(None, read.kind, f"{read.why}; kept as {aside}")
    return read


class CopyWriter:
    """The thread that keeps the copy (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        owner: CopyOwner,
        view: Callable[[], DaemonView],
        lock: threading.Lock,
        on_disk: LayoutRecord | None,
        persisted: Callable[[LayoutRecord], None] = lambda record: None,
    ) -> None:
        """``view``: the daemon machine's view, read under ``lock``; ``on_disk``: the record the file holds
        now (None: none usable); ``persisted``: told under ``lock`` of each record put in place."""
        self.path, self.owner, self._view, self._lock = path, owner, view, lock
        self.on_disk = on_disk
        self._persisted = persisted
        self._wake = threading.Event()
        self.failure = ""  # why the last write failed, for the status ("" after a write that worked)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="expert-layout-copy", daemon=True)
        self._thread.start()
        self.wake()

    def wake(self) -> None:
        """A step may have changed the record: write it if it is due."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            try:
                self.write_due()
                self.failure = ""
            except OSError as error:
                # The daemon serves on; its copy lags until a later write works. Said once per failure.
                if str(error) != self.failure:
                    logger.error("[LayoutAwareDaemon] the durable copy %s was not written: %s", self.path, error)
                self.failure = str(error)
                time.sleep(1.0)
                self._wake.set()

    def write_due(self) -> LayoutRecord | None:
        """Write the record due now, if any: the record put in place, or None (none due)."""
        while True:
            with self._lock:
                record = copy_due(self._view(), self.on_disk)
            if record is None:
                return None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = write_temporary(self.path, copy_bytes(record, self.owner))
            with self._lock:
                still = copy_due(self._view(), self.on_disk) == record
                if still:
                    put_in_place(temporary, self.path)
                    self.on_disk = record
                    self._persisted(record)
            if still:
                sync_folder(self.path)
                return record
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()  # the record moved on meanwhile: write the one due now
