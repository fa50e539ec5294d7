"""sglang's ``torch_ipc`` transport, made to serve CPU tensors to any number of engines.

Measured here (``python -m tools.harness.shm_proof``): sglang's ``TorchIpcTransportBackend``
shares CPU tensors zero-copy between unrelated processes when both use torch's ``file_system``
sharing strategy. It breaks at the third engine, though: with ``file_system``, every pickled
handle carries one reference to the shared-memory file (``reduce_storage`` increfs) and every
import drops one (``rebuild_storage_filename`` decrefs). sglang pickles the handles once, in
``prepare_export``, and sends the same bytes to every ``fetch_state``; so the second importer
drops the daemon's own reference, and when it lets go the file is unlinked: the next engine gets
"unable to open shared memory object". (CUDA IPC handles have no such count, which is why the
daemon can reuse them on a GPU.)

``CpuShmTransportBackend`` is the same transport with one change: a fresh set of handles per
``fetch_state`` (one reference per importer, as torch expects). Its name stays ``torch_ipc``,
so engines import with sglang's own, unchanged ``TorchIpcTransportBackend``.

The demo's daemons serve through it (``tools.harness.daemon_proc.start_daemon(transport_backend=
"tools.harness.cpu_transport:CpuShmTransportBackend")``); ``shm_proof`` shows both behaviours.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang.srt.weight_cache.transport import TorchIpcTransportBackend


class CpuShmTransportBackend(TorchIpcTransportBackend):
    """``torch_ipc`` with one fresh handle set per fetch (CPU ``file_system`` sharing)."""

    _state_tensors: dict[str, tuple[Any, bool]] | None = None

    def prepare_export(self, state_tensors: Mapping[str, tuple[Any, bool]]) -> dict[str, dict[str, Any]]:
        self._state_tensors = dict(state_tensors)
        return super().prepare_export(state_tensors)

    def send_fetch_state_response(
        self,
        conn: Any,
        *,
        config: dict[str, Any],
        entries: dict[str, dict[str, Any]],
        pid: int,
        preloaded_weights_bytes: int = 0,
    ) -> None:
        if self._state_tensors is not None:
            # Each importer's rebuild drops the reference its handle carried: give it its own.
            entries = super().prepare_export(self._state_tensors)
        super().send_fetch_state_response(
            conn, config=config, entries=entries, pid=pid, preloaded_weights_bytes=preloaded_weights_bytes
        )
