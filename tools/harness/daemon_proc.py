"""A real layout-aware sglang weight cache daemon in its own process, without a model.

The daemon is ``daemon_adapter.LayoutAwareDaemon`` (a subclass of sglang 0.5.23's
``WeightCacheDaemon``) without a model or a GPU (``tools.harness.loaded_daemon``).
Its state entries are CPU tensors exported by sglang's real ``TorchIpcTransportBackend``
with torch's ``file_system`` sharing strategy, so a client that sets the same strategy maps
the daemon's memory zero-copy (docs/protocol.md §9). It runs sglang's real ``serve()`` loop on a real
Unix socket.

API (this module imports neither sglang nor torch; only the daemon process does)::

    daemon = start_daemon(socket_path, physical_to_logical_map=rows, num_logical=8,
                          tensors={"w": torch.ones(4)}, config=default_cache_config())
    daemon.wait_ready()          # start_daemon(wait=True) already did; True when serving
    request(daemon.socket_path, {"type": "ping"})   # one request, one reply (plain dicts)
    conn, reply = attach(daemon.socket_path, "engine-A")  # stays open: close = detach
    daemon.kill()                # SIGKILL (no clean-up: the socket file stays, as in a crash)
    daemon.stop()                # SIGTERM: sglang's serve loop shuts down and removes its files
    daemon.restart()             # a fresh daemon (record back at version 0) on the same socket

``physical_to_logical_map=None`` starts a daemon with no record (no ``--enable-eplb``).
``plain_sglang=True`` runs sglang's own ``WeightCacheDaemon`` (no layout requests), as an
older daemon would. ``send_frame``/``recv_frame`` speak sglang's framing (4-byte big-endian
length, then a pickle) for clients that must stay cheap, or that send broken frames.

Daemon processes are forked from one "zygote" process per caller, which imported sglang
once (importing sglang costs seconds per process); the daemons die with it, and it dies when
the caller exits. ``DaemonProcess.pid`` is the daemon's own pid (SIGKILL it at will).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from daemon_adapter.client import FRAME_HEADER as _FRAME_HEADER
from daemon_adapter.client import attach, connect, recv_frame, request, send_frame
from layout_sm.trace_codec import TRACE_ENV
from tools import with_project_path

if TYPE_CHECKING:
    from tools.harness.toy_moe import ToyMoEConfig

# sglang's own transport (what a daemon picks for tensors it cannot serve through VMM fds).
SGLANG_TORCH_IPC = "sglang.srt.weight_cache.transport:TorchIpcTransportBackend"


def default_cache_config(**overrides: Any) -> dict[str, Any]:
    """A complete sglang ``CacheConfig`` as a dict (the fingerprint the daemon serves)."""
    config: dict[str, Any] = {
        "model_path": "layout-testkit/toy-moe",
        "model_arch": "LayoutTestkitForCausalLM",
        "tp_size": 1,
        "tp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "dp_size": 1,
        "ep_size": 1,
        "moe_dp_size": 1,
        "moe_dp_rank": 0,
        "moe_ep_rank": 0,
        "attn_dp_size": 1,
        "enable_dp_lm_head": False,
        "attn_cp_size": 1,
        "moe_dense_tp_size": None,
        "moe_a2a_backend": "none",
        "quant_method": "",
        "quant_config_hash": "",
        "dtype": "torch.float32",
        "revision": "",
        "device_capability": "",
        "torch_version": "",
    }
    unknown = set(overrides) - set(config)
    if unknown:
        raise ValueError(f"default_cache_config: unknown CacheConfig fields {sorted(unknown)}")
    config.update(overrides)
    return config


def rank_cache_config(model_dir: str, rank: int, world_size: int) -> dict[str, Any]:
    """Exactly what sglang's ``IpcModelLoader`` sends for one rank of an EP engine of the toy MoE in
    ``model_dir`` (``tools.harness.engine_ranks``): a daemon serving it serves those ranks."""
    import torch

    return default_cache_config(
        model_path=model_dir,
        model_arch="Qwen3MoeForCausalLM",
        tp_size=world_size,
        tp_rank=rank,
        ep_size=world_size,
        moe_ep_rank=rank,
        torch_version=str(torch.__version__),
    )


@dataclass(frozen=True)
class DaemonSpec:
    """Everything a daemon process needs; plain values, so it pickles into the child."""

    socket_path: str
    ready_path: str
    physical_to_logical_map: list[list[int]] | None
    num_logical: int | None
    config: dict[str, Any]
    tensors_path: str | None = None
    buffer_names: tuple[str, ...] = ()
    plain_sglang: bool = False
    log_path: str | None = None
    gpu_id: int = 0
    transport_backend: str = SGLANG_TORCH_IPC
    # The protocol trace's folder (daemon_adapter.trace), from the caller's environment when it started
    # the daemon: the zygote's own environment is the one of the first daemon's start.
    trace_dir: str | None = None
    # The toy model and the EP rank whose slots it serves: a torn move is then reloaded from the toy's
    # checkpoint (FakeCheckpointReload); auto_repair starts that reload on the mover's detach.
    checkpoint: tuple[ToyMoEConfig, int] | None = None
    auto_repair: bool = False
    die_in_reload: str | None = None  # a marker file: the daemon dies inside its first reload (a crash mid-repair)
    # Start from the durable copy (daemon_adapter.durable) beside the socket and keep it; the harness's
    # weights are not moved to the copy's map (the layout tests read the record alone).
    durable: bool = False


def _run_daemon(spec: DaemonSpec) -> None:
    """The daemon process: build the daemon without a model and run sglang's serve()."""
    import logging

    import torch

    from tools.harness.loaded_daemon import FakeCheckpointReload, FakeLoadedDaemon, FakeLoadedLayoutAwareDaemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", force=True)
    if spec.trace_dir:
        os.environ[TRACE_ENV] = spec.trace_dir
    else:
        os.environ.pop(TRACE_ENV, None)
    # sglang's torch_ipc transport shares CPU tensors between unrelated processes only with
    # the file_system strategy (docs/protocol.md §9); clients must set it too.
    torch.multiprocessing.set_sharing_strategy("file_system")
    tensors: dict[str, torch.Tensor] = {}
    if spec.tensors_path:
        tensors = torch.load(spec.tensors_path, weights_only=True)
    module_name, _, class_name = spec.transport_backend.partition(":")
    built = dict(
        socket_path=spec.socket_path,
        ready_path=spec.ready_path,
        config=spec.config,
        tensors=tensors,
        buffer_names=spec.buffer_names,
        transport_backend=getattr(importlib.import_module(module_name), class_name)(),
        gpu_id=spec.gpu_id,
    )
    if spec.plain_sglang:
        daemon = FakeLoadedDaemon(**built)
    else:
        reload = None
        if spec.checkpoint is not None:
            reload = FakeCheckpointReload(*spec.checkpoint, tensors, die_marker=spec.die_in_reload)
        daemon = FakeLoadedLayoutAwareDaemon(**built, auto_repair=spec.auto_repair, fake_reload=reload)
        daemon.set_initial_layout(spec.physical_to_logical_map, spec.num_logical, durable=spec.durable)
    daemon.serve()


# -- the zygote: one process per caller that imported sglang once and forks daemons -----
# (multiprocessing's forkserver would re-run the caller's __main__ in every child.)


def _zygote_main() -> None:
    """Read pickled specs on stdin; fork one daemon per spec; write its pid on stdout."""
    import ctypes

    import torch  # noqa: F401

    import tools.harness.loaded_daemon  # noqa: F401  (the expensive imports, once)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # daemons are reaped automatically
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(_FRAME_HEADER.size)
        if len(header) < _FRAME_HEADER.size:
            return  # the caller is gone; the daemons follow (PR_SET_PDEATHSIG below)
        spec = pickle.loads(stdin.read(_FRAME_HEADER.unpack(header)[0]))
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the zygote
                os.setpgid(0, 0)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                log_fd = os.open(spec.log_path or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                null_fd = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null_fd, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                _run_daemon(spec)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        stdout.write(_FRAME_HEADER.pack(pid))
        stdout.flush()


class _Zygote:
    def __init__(self) -> None:
        env = with_project_path(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tools.harness.daemon_proc", "zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._lock = threading.Lock()

    def fork(self, spec: DaemonSpec) -> int:
        data = pickle.dumps(spec)
        with self._lock:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(_FRAME_HEADER.pack(len(data)) + data)
            self._proc.stdin.flush()
            reply = self._proc.stdout.read(_FRAME_HEADER.size)
        if len(reply) < _FRAME_HEADER.size:
            raise RuntimeError(f"the daemon zygote exited with code {self._proc.wait()}")
        return _FRAME_HEADER.unpack(reply)[0]


_zygote: _Zygote | None = None
_zygote_lock = threading.Lock()


def _fork_daemon(spec: DaemonSpec) -> int:
    global _zygote
    with _zygote_lock:
        if _zygote is None or _zygote._proc.poll() is not None:
            _zygote = _Zygote()
        zygote = _zygote
    return zygote.fork(spec)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DaemonProcess:
    """A running (or stopped) daemon; see the module docstring."""

    def __init__(self, spec: DaemonSpec) -> None:
        self.spec = spec
        self.pid: int | None = None

    @property
    def socket_path(self) -> str:
        return self.spec.socket_path

    @property
    def alive(self) -> bool:
        return self.pid is not None and _pid_alive(self.pid)

    def start(self, wait: bool = True, timeout: float = 120.0) -> DaemonProcess:
        if self.alive:
            raise RuntimeError(f"daemon on {self.socket_path} already runs (pid {self.pid})")
        _remove_stale_files(self.spec)
        self.pid = _fork_daemon(self.spec)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Block until the daemon answers ``ping``; raise if it died or timed out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(
                    f"daemon on {self.socket_path} exited before serving"
                    + (f"; see {self.spec.log_path}" if self.spec.log_path else "")
                )
            if os.path.exists(self.spec.ready_path):
                with contextlib.suppress(OSError, ConnectionError):
                    if request(self.socket_path, {"type": "ping"}, timeout=5.0) == {"status": "ok"}:
                        return True
            time.sleep(0.02)
        raise TimeoutError(f"daemon on {self.socket_path} not serving after {timeout}s")

    def kill(self) -> None:
        """SIGKILL, as a crash: sglang gets no chance to clean up its socket and ready files."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: sglang's serve loop stops within a second and removes its files."""
        if not self._signal_and_wait(signal.SIGTERM, timeout):
            self.kill()

    def _signal_and_wait(self, signum: int, timeout: float) -> bool:
        if self.pid is None or not self.alive:
            return True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signum)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive:
                return True
            time.sleep(0.01)
        return False

    def restart(self, wait: bool = True, timeout: float = 120.0) -> DaemonProcess:
        """Kill (if running) and start a fresh daemon from the same spec: the record is back at
        version 0 and every attachment and flag is gone, as after an operator's restart."""
        self.kill()
        return self.start(wait, timeout)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_daemon(
    socket_path: str,
    *,
    physical_to_logical_map: Sequence[Sequence[int]] | None = None,
    num_logical: int | None = None,
    tensors: Mapping[str, Any] | None = None,
    buffer_names: Collection[str] = (),
    config: Mapping[str, Any] | None = None,
    plain_sglang: bool = False,
    transport_backend: str = SGLANG_TORCH_IPC,
    ready_path: str | None = None,
    log_path: str | None = None,
    checkpoint: tuple[ToyMoEConfig, int] | None = None,
    auto_repair: bool = False,
    die_in_reload: str | None = None,
    durable: bool = False,
    wait: bool = True,
    timeout: float = 120.0,
) -> DaemonProcess:
    """Start a daemon process on ``socket_path``; see the module docstring.

    ``tensors``: named CPU tensors the daemon serves as its state entries (parameters,
    except the names in ``buffer_names``). ``config``: the ``CacheConfig`` dict it serves
    (``default_cache_config()`` by default); an engine whose config differs gets sglang's
    ``mismatch`` reply. ``transport_backend``: ``"module:Class"`` of the transport backend that
    exports the tensors (sglang's ``TorchIpcTransportBackend`` by default; a CPU-sharing
    variant such as ``tools.harness.cpu_transport:CpuShmTransportBackend`` serves any
    number of importing engines). ``checkpoint`` (the toy model and this daemon's EP rank): a torn
    move can be repaired, from the toy's checkpoint; ``auto_repair`` starts that on the mover's detach;
    ``die_in_reload`` (a marker file) kills the daemon inside its first reload. ``durable``: the daemon
    starts from its durable copy and keeps it (``daemon_adapter.durable``).
    """
    tensors_path = None
    if tensors:
        import torch

        handle, tensors_path = tempfile.mkstemp(prefix="layout-testkit-", suffix=".pt")
        os.close(handle)
        torch.save({name: t.detach().cpu().contiguous() for name, t in tensors.items()}, tensors_path)
    spec = DaemonSpec(
        socket_path=socket_path,
        ready_path=ready_path or socket_path + ".ready",
        physical_to_logical_map=None
        if physical_to_logical_map is None
        else [[int(v) for v in row] for row in physical_to_logical_map],
        num_logical=num_logical,
        config=dict(config) if config is not None else default_cache_config(),
        tensors_path=tensors_path,
        buffer_names=tuple(buffer_names),
        plain_sglang=plain_sglang,
        log_path=log_path,
        transport_backend=transport_backend,
        trace_dir=os.environ.get(TRACE_ENV) or None,
        checkpoint=checkpoint,
        auto_repair=auto_repair,
        die_in_reload=die_in_reload,
        durable=durable,
    )
    return DaemonProcess(spec).start(wait, timeout)


def _remove_stale_files(spec: DaemonSpec) -> None:
    # The previous daemon on this path is dead (kill() joined it): its files are stale, as
    # sglang's cleanup_stale_daemon_files would decide.
    for path in (spec.socket_path, spec.ready_path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# -- a client that needs neither sglang nor torch: daemon_adapter.client, re-exported -----------

__all__ = [
    "DaemonProcess",
    "attach",
    "connect",
    "default_cache_config",
    "recv_frame",
    "request",
    "send_frame",
    "start_daemon",
]


if __name__ == "__main__" and sys.argv[1:] == ["zygote"]:
    _zygote_main()
