"""Proof that sglang's own ``torch_ipc`` transport shares CPU tensors zero-copy between processes.

``python -m tools.harness.shm_proof`` exports a tensor with sglang's
``TorchIpcTransportBackend`` from this process and serves it over a Unix socket with sglang's
``send_msg``; a separate interpreter (not a multiprocessing child: nothing is inherited) imports
it with the same backend, writes into it in place, and both sides check they see the other's
write. It runs the importer twice: with ``file_system`` sharing (expected: shared both ways)
and with torch's default ``file_descriptor`` strategy (expected: the import fails), which is why
every demo daemon and engine process sets ``file_system``. Last, three engines import in turn from
one export, each exiting before the next, first with sglang's backend (the third import fails: the
handle sent to every engine loses a reference per import) and then with
``cpu_transport.CpuShmTransportBackend`` (fresh handles per fetch: every import works).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any


def _importer(sock_path: str, strategy: str) -> None:
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy(strategy)
    from sglang.srt.weight_cache.protocol import recv_msg, send_msg
    from sglang.srt.weight_cache.transport import get_client_transport_backend

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    send_msg(sock, {"type": "fetch_state"})
    reply = recv_msg(sock)
    backend = get_client_transport_backend(reply["transport_backend"])
    try:
        weight = backend.import_tensor(reply["entries"]["w"])
    except Exception as exc:  # the failure under file_descriptor is part of the proof
        send_msg(sock, {"imported": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
        return
    weight[1].fill_(3.5)  # in-place write the exporter must see
    send_msg(sock, {"imported": True})
    recv_msg(sock)  # the exporter has written row 2
    send_msg(sock, {"seen": float(weight[2, 0].item())})


def _fetcher(sock_path: str) -> None:
    """One engine's fetch and import, then exit (releasing what it mapped)."""
    import torch.multiprocessing as tmp

    tmp.set_sharing_strategy("file_system")
    from sglang.srt.weight_cache.protocol import recv_msg, send_msg
    from sglang.srt.weight_cache.transport import get_client_transport_backend

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(sock_path)
    send_msg(sock, {"type": "fetch_state"})
    reply = recv_msg(sock)
    try:
        weight = get_client_transport_backend(reply["transport_backend"]).import_tensor(reply["entries"]["w"])
        send_msg(sock, {"imported": True, "value": float(weight[0, 0].item())})
    except Exception as exc:
        send_msg(sock, {"imported": False, "error": f"{type(exc).__name__}: {exc}"[:200]})


def _engines_in_turn(listener: socket.socket, path: str, backend: Any, engines: int = 3) -> list[Any]:
    """Export once, serve ``engines`` fetches in turn; True per engine whose import worked."""
    import torch
    from sglang.srt.weight_cache.protocol import recv_msg

    tensor = torch.full((4, 8), 5.0)
    entries = backend.prepare_export({"w": (tensor, True)})
    outcomes: list[Any] = []
    for _ in range(engines):
        child = subprocess.Popen(
            [sys.executable, "-m", "tools.harness.shm_proof", "--fetcher", path], stdout=subprocess.DEVNULL
        )
        conn, _ = listener.accept()
        with conn:
            recv_msg(conn)
            backend.send_fetch_state_response(conn, config={}, entries=entries, pid=os.getpid())
            answer = recv_msg(conn)
        child.wait(timeout=120)
        outcomes.append(True if answer["imported"] else answer["error"])
    return outcomes


def _serve_once(listener: socket.socket, entries: dict[str, Any], tensor: Any) -> dict[str, Any]:
    from sglang.srt.weight_cache.protocol import recv_msg, send_msg
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    conn, _ = listener.accept()
    with conn:
        recv_msg(conn)
        TorchIpcTransportBackend().send_fetch_state_response(conn, config={}, entries=entries, pid=os.getpid())
        first = recv_msg(conn)
        if not first["imported"]:
            return {"imported": False, "error": first["error"]}
        exporter_saw = float(tensor[1, 0].item())
        tensor[2, 0] = 7.0
        send_msg(conn, {"written": True})
        importer_saw = recv_msg(conn)["seen"]
        tensor.zero_()
        return {
            "imported": True,
            "exporter_saw_import_write": exporter_saw == 3.5,
            "importer_saw_export_write": importer_saw == 7.0,
        }


def run() -> dict[str, Any]:
    """Export under each sharing strategy and import in another interpreter; return what each side saw."""
    import torch
    import torch.multiprocessing as tmp
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    result: dict[str, Any] = {"transport": TorchIpcTransportBackend.name}
    # multiprocessing's resource sharer prints the expected AuthenticationError of the
    # file_descriptor case through sys.excepthook; keep the proof's output readable.
    default_hook = sys.excepthook
    sys.excepthook = lambda kind, value, tb: (
        None if kind.__name__ == "AuthenticationError" else default_hook(kind, value, tb)
    )
    with tempfile.TemporaryDirectory(prefix="shm-proof-") as tmpdir:
        path = os.path.join(tmpdir, "s.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        for strategy in ("file_system", "file_descriptor"):
            # The exporter's strategy decides the handle kind: a shm file name, or an fd that only
            # multiprocessing's resource sharer (authenticated per process tree) can hand out.
            tmp.set_sharing_strategy(strategy)
            tensor = torch.zeros(4, 8)
            ptr_before = tensor.data_ptr()
            entries = TorchIpcTransportBackend().prepare_export({"w": (tensor, True)})
            start = time.perf_counter()
            child = subprocess.Popen(
                [sys.executable, "-m", "tools.harness.shm_proof", "--importer", path, strategy],
                stdout=subprocess.DEVNULL,
            )
            result[strategy] = _serve_once(listener, entries, tensor)
            result[strategy]["export_moved_storage_to_shm"] = tensor.data_ptr() != ptr_before
            child.wait(timeout=120)
            result[strategy]["seconds"] = round(time.perf_counter() - start, 2)
        tmp.set_sharing_strategy("file_system")
        from tools.harness.cpu_transport import CpuShmTransportBackend

        result["three_engines_in_turn"] = {
            "sglang_torch_ipc": _engines_in_turn(listener, path, TorchIpcTransportBackend()),
            "cpu_shm": _engines_in_turn(listener, path, CpuShmTransportBackend()),
        }
        listener.close()
    fs = result["file_system"]
    result["zero_copy_shared"] = bool(
        fs.get("imported") and fs.get("exporter_saw_import_write") and fs.get("importer_saw_export_write")
    )
    result["cpu_shm_serves_every_engine"] = all(v is True for v in result["three_engines_in_turn"]["cpu_shm"])
    return result


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--fetcher":
        _fetcher(sys.argv[2])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "--importer":
        _importer(sys.argv[2], sys.argv[3])
        return 0
    result = run()
    print(json.dumps(result, indent=2))
    return 0 if result["zero_copy_shared"] and result["cpu_shm_serves_every_engine"] else 1


if __name__ == "__main__":
    sys.exit(main())
