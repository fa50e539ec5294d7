"""Where the real daemons of a replay run: their own processes, or serve loops in this process.

Both run `daemon_adapter.LayoutAwareDaemon` (sglang 0.5.23's `WeightCacheDaemon` with the layout
record) built without a model, and sglang's own `serve()` loop on a real Unix socket:

- `ProcessHost`: one process per daemon (`tools.harness.daemon_proc`); a restart is a SIGKILL
  and a fresh process. About 50 ms a daemon: for samples and `make replay-full`.
- `InProcessHost`: `serve()` in a thread of the test process; about 2 ms a daemon, so the
  whole MCSmall suite (thousands of fresh systems) and Hypothesis fit in CI. sglang's `serve()`
  installs SIGTERM/SIGINT handlers, which only the main thread may do: for these daemons the
  sglang daemon module's `signal` is a stand-in that records the handlers (they are never
  needed: a daemon here stops by `_running = False`, as its SIGTERM handler would do).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import types
from pathlib import Path
from typing import Any, Protocol

from tools.harness import daemon_proc


class DaemonHandle(Protocol):
    socket_path: str

    def restart(self) -> DaemonHandle: ...

    def stop(self) -> None: ...


class DaemonHost(Protocol):
    def start(self, name: str, rows: list[list[int]] | None, num_logical: int | None) -> DaemonHandle: ...


class _Proc:
    def __init__(self, proc: daemon_proc.DaemonProcess) -> None:
        self.proc = proc
        self.socket_path = proc.socket_path

    def restart(self) -> _Proc:
        self.proc.restart()
        return self

    def stop(self) -> None:
        self.proc.kill()


class ProcessHost:
    """One real daemon process per rank (forked from daemon_proc's zygote)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def start(self, name: str, rows: list[list[int]] | None, num_logical: int | None) -> _Proc:
        proc = daemon_proc.start_daemon(
            str(self.workdir / f"{name}.sock"),
            physical_to_logical_map=rows,
            num_logical=num_logical if rows is not None else None,
            log_path=str(self.workdir / f"{name}.log"),
        )
        return _Proc(proc)


class _NoSignals(types.SimpleNamespace):
    """The `signal` module as sglang's daemon module sees it, for daemons served off the main thread."""


_patched = False
_patch_lock = threading.Lock()


def _allow_serve_off_main_thread() -> None:
    global _patched
    with _patch_lock:
        if _patched:
            return
        import signal

        from sglang.srt.weight_cache import daemon as sglang_daemon

        main = threading.main_thread()

        def install(signum: int, handler: Any) -> Any:
            if threading.current_thread() is main:
                return signal.signal(signum, handler)
            return None  # a thread may not install handlers; these daemons stop by _running = False

        sglang_daemon.signal = _NoSignals(signal=install, SIGTERM=signal.SIGTERM, SIGINT=signal.SIGINT)  # type: ignore[attr-defined]
        _patched = True


class _Thread:
    _ids = itertools.count()

    def __init__(self, host: InProcessHost, name: str, rows: list[list[int]] | None, num_logical: int | None) -> None:
        self.host, self.name, self.rows, self.num_logical = host, name, rows, num_logical
        self.reload: Any = None  # the daemon's FakeReload: the test ends each repair (end_repair)
        self.daemon: Any = None
        self.socket_path = ""
        self._start()

    def _start(self) -> None:
        import torch
        from tools.harness.loaded_daemon import FakeLoadedLayoutAwareDaemon, FakeReload

        torch.multiprocessing.set_sharing_strategy("file_system")
        # a fresh path per start: a stopped serve loop unlinks its own socket up to 1 s later
        self.socket_path = str(self.host.workdir / f"{self.name}.{next(self._ids)}.sock")
        self.reload = FakeReload()
        d = FakeLoadedLayoutAwareDaemon(
            socket_path=self.socket_path,
            config=daemon_proc.default_cache_config(),
            auto_repair=self.host.repairs,
            fake_reload=self.reload,
            copy_file=self.host.workdir / "copies" / f"{self.name}.layout.json",
        )
        # The copy is written at the behaviour's Persist steps (persist), not by the writer's thread.
        d.copy_writes_by_itself = False
        d.set_initial_layout(self.rows, self.num_logical if self.rows is not None else None, durable=self.host.durable)
        self.daemon = d
        threading.Thread(target=d.serve, name=f"daemon-{self.name}", daemon=True).start()
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if daemon_proc.request(self.socket_path, {"type": "ping"}, timeout=2.0) == {"status": "ok"}:
                    return
            time.sleep(0.001)
        raise TimeoutError(f"in-process daemon {self.name} not serving on {self.socket_path}")

    def end_repair(self, ok: bool) -> None:
        """Let the daemon's running repair end: its reload done (``ok``) or failed."""
        self.reload.end(ok)

    def persist(self) -> None:
        """The daemon's writer writes its durable copy now (the spec's ``Persist``)."""
        assert self.daemon.persist() is not None, f"daemon {self.name}: no record due to its copy"

    def spoil_copy(self) -> None:
        """Make the daemon's copy unusable, as a write torn by a disk fault leaves it (before a start)."""
        file = self.host.workdir / "copies" / f"{self.name}.layout.json"
        file.write_bytes(file.read_bytes()[:40])

    def restart(self) -> _Thread:
        self.stop()
        self._start()
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon._running = False  # what its SIGTERM handler does; the loop ends within 1 s
            self.daemon = None


class InProcessHost:
    """sglang's serve loop of each daemon in a thread of this process, on a real Unix socket."""

    def __init__(self, workdir: Path, repairs: bool = False, durable: bool = False) -> None:
        """``repairs``: the daemons start with auto repair (the spec's ``Repairs``); their reload is a
        ``FakeReload`` that the test ends (a daemon without a model has nothing to reload from).
        ``durable``: they keep a durable copy (the spec's ``Durable``), one file per daemon name, written
        when the test says (``persist``)."""
        _allow_serve_off_main_thread()
        self.workdir = workdir
        self.repairs = repairs
        self.durable = durable

    def start(self, name: str, rows: list[list[int]] | None, num_logical: int | None) -> _Thread:
        return _Thread(self, name, rows, num_logical)
