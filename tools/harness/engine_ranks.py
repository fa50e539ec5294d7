"""Real engine rank processes on CPU: N processes over gloo running sglang's own expert-location code.

Each rank is a fresh interpreter (``spawn``) that imports sglang 0.5.23, joins a gloo world of
``world_size`` ranks through sglang's own ``init_distributed_environment`` (so
``get_parallel().world_group.cpu_group`` is real), and then runs, for every engine it plays:

- sglang's published server args (``reset_context()`` then ``publish``; EP size = world size);
- the real ``ModelRunner.maybe_init_expert_location_metadata`` (called on a ``FakeModelRunner``),
  with the project's plugin hooks installed through sglang's ``load_plugins()`` when asked;
- the real ``IpcModelLoader._fetch_from_cache`` and sglang's ``torch_ipc`` transport to map the
  daemon's expert tensors (zero-copy), or tensors built locally (a disk load);
- the real ``EPLBManager`` and ``ExpertLocationUpdater`` moving CPU expert tensors over gloo.

The model is ``tools.harness.toy_moe``: a tiny ``Qwen3MoeForCausalLM`` config for sglang's model
registry, with expert slots whose memory says which logical expert they hold.

API (small on purpose; the demo reuses it)::

    with EngineRanks(world_size=2) as ranks:            # processes start once, reused across engines
        results = ranks.run(script, arg, timeout=60)    # script(rank: EngineRank, arg) on every rank
        results = ranks.run_each([(s0, args0), (s1, args1)])  # a different script per rank
    results[r].ok / .value / .error / .trace / .kind    # RankResult per rank; kind "hung" on timeout, "died"
    ranks.pids                                          # the rank processes (SIGKILL them at will)

Scripts are module-level functions (they pickle by name into the ranks); their module must be
importable there (the ranks inherit the caller's ``sys.path``).

Inside a script, ``rank`` is an ``EngineRank``:

- ``rank.start(spec)``: begin an engine incarnation (``EngineSpec``: daemon socket per rank,
  shape, EPLB flags, dispatch, chunk size, plugin on/off, wait timeout); runs the startup hook and
  returns ``rank.map()``; raises what the engine would raise at startup.
- ``rank.load(tensors=None)``: weights from the daemon (``spec.sockets[rank]`` set) through the real
  loader, or from ``tensors`` / a local build; returns ``"daemon"`` or ``"disk"``.
- ``rank.rebalance(logical_count)``: one real ``EPLBManager.rebalance()`` driven to its end, with
  ``FakeExpertDistributionRecorder`` supplying ``logical_count``; returns the chunks it ran.
- ``rank.map()``, ``rank.metadata()``, ``rank.slots()`` (what each local slot's memory holds),
  ``rank.state`` (the expert tensors), ``rank.stop()`` (detach: the engine incarnation ends).
- ``rank.cache_config()``: the ``CacheConfig`` dict the real loader sends for this engine, to start
  daemons that serve it (``tools.harness.daemon_proc.start_daemon(config=...)``).

Daemons serve ``toy_moe.rank_state(cfg, rank, map)`` as their tensors; ``load()`` then maps them
zero-copy (sglang's ``torch_ipc`` with the ``file_system`` strategy), so every move by the
updater lands in the daemon's memory.

A script that raises is reported as ``RankResult(ok=False, error=...)``; a rank that does not
answer within ``timeout`` is ``kind="hung"``, one whose process died ``kind="died"`` (the others then
``"killed"``: an engine whose rank died is dead), and the pool is killed (the next ``run`` restarts it).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.harness.toy_moe import ToyMoEConfig

# When set, each rank process writes its stdout and stderr (sglang's and the plugin's logs) to
# ``<dir>/engine-rank<r>.log`` instead of the caller's terminal (the demo sets it).
RANK_LOG_DIR_ENV = "EXPERT_LAYOUT_RANK_LOG_DIR"


def select_plugins() -> None:
    """Only this project's plugin, where the caller did not pick the plugins itself."""
    os.environ.setdefault("SGLANG_PLUGINS", "expert_layout")


_recorder_stand_in = False


def install_recorder_stand_in() -> None:
    """sglang's recorder gatherers need a GPU: its constructor hands out the stand-in instead. Once a
    process (a caller that installs it before forking ranks spares each rank sglang's apply_hooks)."""
    global _recorder_stand_in
    if _recorder_stand_in:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.eplb.expert_distribution.ExpertDistributionRecorder.init_new",
        lambda *args, **kwargs: FakeExpertDistributionRecorder(None),
        HookType.REPLACE,
    )
    HookRegistry.apply_hooks()
    _recorder_stand_in = True


def _output_to_file(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for std in (1, 2):
        os.dup2(fd, std)
    os.close(fd)


__all__ = ["EngineRank", "EngineRanks", "EngineSpec", "FakeExpertDistributionRecorder", "RankResult"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine incarnation, the same on every rank (``sockets`` is indexed by rank)."""

    sockets: tuple[str | None, ...] = ()  # the daemon of each rank; None: weight cache off
    cfg: ToyMoEConfig = field(default_factory=ToyMoEConfig)
    enable_eplb: bool = True
    init_expert_location: str = "trivial"  # sglang's --init-expert-location (JSON text or path)
    dispatch: str = "dynamic"  # --ep-dispatch-algorithm: "dynamic" or "static"
    a2a_backend: str = "none"  # --moe-a2a-backend; sglang allows "static" only with one (e.g. "deepep")
    layers_per_chunk: int | None = 1  # --eplb-rebalance-layers-per-chunk
    weight_cache_mode: str = "client"
    plugin: bool = True  # install the project's hooks through sglang's load_plugins()
    wait_timeout: float | None = None  # SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT for this engine
    enable_metrics: bool = False  # sglang's --enable-metrics (the plugin's series, in this process)
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""  # "ExceptionType: message" when the script raised
    kind: str = "ok"  # "ok", "error", "hung", "died" or "killed"
    seconds: float = 0.0
    trace: str = ""  # the traceback when the script raised


class FakeExpertDistributionRecorder:
    """Stands in for sglang's ExpertDistributionRecorder (its gatherers need GPU forward passes)."""

    def __init__(self, logical_count: Any) -> None:
        self.logical_count = logical_count
        self.recording = True

    def start_record(self) -> None:
        self.recording = True

    def dump_record(self, output_mode: str = "object") -> dict[str, Any]:
        return {"logical_count": self.logical_count, "average_utilization_rate_over_window": None}


class FakeModelRunner:
    """Stands in for ModelRunner's ``self`` (a real one needs a GPU); sglang's own methods run on it."""

    def __init__(self, model_config: Any, gpu_id: int) -> None:
        self.model_config = model_config
        self.gpu_id = gpu_id
        self.is_draft_worker = False


class FakeWeightUpdater:
    """Stands in for ModelRunner's weight updater; sglang calls it only when experts are missing."""

    def update_weights_from_disk(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("update_weights_from_disk called: an expert was missing after a move")


class _ToyModel:
    """What EPLBManager reads from the model: ``routed_experts_weights_of_layer``."""

    def __init__(self, routed: dict[int, list[Any]]) -> None:
        self.routed_experts_weights_of_layer = routed


def _toy_hf_config(cfg: ToyMoEConfig) -> dict[str, Any]:
    # The smallest Qwen3-MoE config sglang's registry resolves; only the expert fields matter.
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_hidden_layers": cfg.num_layers,
        "num_experts": cfg.num_logical,
        "num_experts_per_tok": 1,
        "hidden_size": cfg.hidden,
        "intermediate_size": 2 * cfg.hidden,
        "moe_intermediate_size": cfg.hidden,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        "vocab_size": cfg.vocab,
        "max_position_embeddings": 128,
        "torch_dtype": "float32",
    }


def write_model_dir(cfg: ToyMoEConfig, root: str) -> str:
    """A model directory (config.json only) for ``cfg`` under ``root``; the path is stable per shape."""
    path = os.path.join(root, f"toy-moe-L{cfg.num_layers}-N{cfg.num_logical}-H{cfg.hidden}")
    os.makedirs(path, exist_ok=True)
    # Every rank process writes it: each writes its own file and renames it into place, so that no rank
    # reads the file half written by another ("config.json is not a valid JSON file", seen in CI).
    tmp = os.path.join(path, f".config.json.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(_toy_hf_config(cfg), f)
    os.replace(tmp, os.path.join(path, "config.json"))
    return path


class EngineRank:
    """One rank process's view; created by the pool, handed to every script."""

    def __init__(self, rank: int, world_size: int, workdir: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.workdir = workdir
        self.spec: EngineSpec | None = None
        self.state: dict[str, Any] = {}
        self.source: str | None = None
        self.manager: Any = None
        self.recorder: FakeExpertDistributionRecorder | None = None
        self._world: Any = None
        self._model_config: Any = None
        self._saved_env: dict[str, str | None] = {}

    # -- process setup ------------------------------------------------------------------

    def _join_world(self, init_method: str) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init_method, world_size=self.world_size, rank=self.rank)
        self._publish(EngineSpec(sockets=(None,) * self.world_size))
        from sglang.srt.distributed import parallel_state

        parallel_state.init_distributed_environment(
            world_size=self.world_size, rank=self.rank, local_rank=self.rank, backend="gloo"
        )
        self._world = parallel_state.get_world_group()
        install_recorder_stand_in()

    def _publish(self, spec: EngineSpec) -> Any:
        from sglang.srt import runtime_context as rc
        from sglang.srt.server_args import ServerArgs

        cfg = spec.cfg
        sock = spec.sockets[self.rank] if spec.sockets else None
        args = ServerArgs(
            model_path=write_model_dir(cfg, self.workdir),
            device="cpu",
            tp_size=self.world_size,
            ep_size=self.world_size,
            enable_eplb=spec.enable_eplb,
            ep_num_redundant_experts=cfg.num_redundant,
            ep_dispatch_algorithm=spec.dispatch,
            moe_a2a_backend=spec.a2a_backend,
            init_expert_location=spec.init_expert_location,
            eplb_rebalance_layers_per_chunk=spec.layers_per_chunk,
            weight_cache_mode=spec.weight_cache_mode if sock else "off",
            weight_cache_socket=sock,
            skip_tokenizer_init=True,
            enable_metrics=spec.enable_metrics,
        )
        rc.reset_context()
        rc.publish(args, role="scheduler", ranks=rc.SpawnRanks(world_rank=self.rank, gpu_id=self.rank))
        if self._world is not None:
            # reset_context() drops the parallel stamp; the gloo world outlives engine incarnations.
            rc.get_parallel().override_permanently(world_group=self._world)
        return args

    # -- engine incarnation ---------------------------------------------------------------

    def start(self, spec: EngineSpec) -> list[list[int]]:
        """Publish, install the plugin, run sglang's startup of expert-location metadata."""
        from sglang.srt.configs.model_config import ModelConfig
        from sglang.srt.model_executor.model_runner import ModelRunner

        self.stop()
        self.spec = spec
        for key, value in spec.env + self._timeout_env(spec):
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        args = self._publish(spec)
        self._set_plugin_enabled(spec.plugin)  # before sglang loads the plugins, which reads it too
        if spec.plugin:
            from sglang.srt import plugins

            plugins.load_plugins()  # idempotent: the hooks stay installed for the process
        self._model_config = ModelConfig(model_path=args.model_path, dtype="float32")
        ModelRunner.maybe_init_expert_location_metadata(FakeModelRunner(self._model_config, self.rank))
        return self.map()

    @staticmethod
    def _timeout_env(spec: EngineSpec) -> tuple[tuple[str, str], ...]:
        if spec.wait_timeout is None:
            return ()
        return (("SGLANG_EXPERT_LAYOUT_WAIT_TIMEOUT", str(spec.wait_timeout)),)

    @staticmethod
    def _set_plugin_enabled(enabled: bool) -> None:
        # The hooks cannot be removed from a process once applied; an "older engine" is one whose
        # SGLANG_PLUGINS does not select the plugin, which the hooks read each time.
        os.environ["SGLANG_PLUGINS"] = "" if enabled else "no_expert_layout"

    def metadata(self) -> Any:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        return get_global_expert_location_metadata()

    def map(self) -> list[list[int]]:
        meta = self.metadata()
        return [] if meta is None else meta.physical_to_logical_map_cpu.tolist()

    def load(self, tensors: dict[str, Any] | None = None) -> str:
        """Load the expert weights as the real loader would; returns "daemon" or "disk"."""
        from tools.harness import toy_moe

        assert self.spec is not None, "start() first"
        cfg = self.spec.cfg
        sock = self.spec.sockets[self.rank] if self.spec.sockets else None
        entries = None
        if sock is not None and tensors is None:
            entries = self._fetch(sock)
        if entries is not None:
            from sglang.srt.weight_cache.transport import TORCH_IPC_BACKEND, get_client_transport_backend

            backend = get_client_transport_backend(entries.get("transport_backend", TORCH_IPC_BACKEND))
            self.state = {name: backend.import_tensor(e) for name, e in entries["entries"].items()}
            self.source = "daemon"
        else:
            self.state = dict(tensors) if tensors is not None else toy_moe.rank_state(cfg, self.rank, self.map())
            self.source = "disk"
        return self.source

    def _fetch(self, sock: str) -> dict[str, Any] | None:
        # The real loader's fetch (with the plugin's hooks when installed); its model load
        # (_initialize_model on meta) is skipped: the toy model has no sglang module.
        import torch
        from sglang.srt.configs.device_config import DeviceConfig
        from sglang.srt.configs.load_config import LoadConfig
        from sglang.srt.weight_cache.ipc_loader import IpcModelLoader

        loader = IpcModelLoader(
            LoadConfig(load_format="auto"), socket_path=sock, weight_cache_mode=self.spec.weight_cache_mode
        )
        torch.multiprocessing.set_sharing_strategy("file_system")
        return loader._fetch_from_cache(self._model_config, DeviceConfig("cpu", self.rank))

    def cache_config(self) -> dict[str, Any]:
        """The CacheConfig dict the real loader sends for the current engine (to start matching daemons).

        sglang's own ``_fetch_from_cache`` builds it; a one-shot listener records the request and
        answers sglang's ``mismatch``, which the loader raises as usual.
        """
        import threading

        from sglang.srt.weight_cache import protocol

        assert self.spec is not None, "start() first"
        path = os.path.join(self.workdir, f"probe-{self.rank}-{os.getpid()}.sock")
        if os.path.exists(path):
            os.unlink(path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        seen: dict[str, Any] = {}

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                seen.update(protocol.recv_msg(conn))
                protocol.send_msg(conn, {"status": "mismatch", "daemon_config": {}})

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        try:
            self._fetch(path)
        except RuntimeError:
            pass  # the mismatch answered above
        finally:
            thread.join(timeout=10)
            listener.close()
            os.unlink(path)
        return dict(seen["config"])

    def rebalance(self, logical_count: Any) -> int:
        """Run one real EPLBManager.rebalance() to its end; returns how many chunks it yielded."""
        from sglang.srt.eplb.eplb_manager import EPLBManager
        from sglang.srt.eplb.expert_distribution import get_global_expert_distribution_recorder
        from sglang.srt.eplb.expert_location_updater import ExpertLocationUpdater

        from tools.harness import toy_moe

        assert self.state, "load() first"
        if self.manager is None:
            self.recorder = get_global_expert_distribution_recorder()
            assert isinstance(self.recorder, FakeExpertDistributionRecorder)
            updater = ExpertLocationUpdater()
            updater._first_execution = False  # its first call empties the CUDA cache
            model = _ToyModel(toy_moe.routed_experts_weights_of_layer(self.spec.cfg, self.state))
            weight_updater = FakeWeightUpdater()
            self.manager = EPLBManager(
                model_config=self._model_config,
                get_model=lambda: model,
                get_expert_location_updater=lambda: updater,
                get_expert_backup_client=lambda: None,
                get_weight_updater=lambda: weight_updater,
            )
        assert self.recorder is not None
        self.recorder.logical_count = logical_count
        steps = 0
        for _ in self.manager.rebalance():
            steps += 1
        return steps

    def slots(self) -> list[list[int]]:
        """[L][num_local]: the logical expert each of this rank's slots holds, read from memory."""
        from tools.harness import toy_moe

        return toy_moe.ExpertIdentifier(self.spec.cfg).rank_slots(self.state)

    def stop(self) -> None:
        """End this engine incarnation: detach from the daemons, drop sglang's globals."""
        try:
            from engine_adapter import state as adapter_state

            adapter_state.reset()
        except ImportError:
            pass
        self.manager = None
        self.recorder = None
        self.state = {}
        self.source = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env = {}


def _rank_main(rank: int, world_size: int, init_method: str, workdir: str, conn: Any) -> None:
    if os.environ.get(RANK_LOG_DIR_ENV):
        _output_to_file(os.path.join(os.environ[RANK_LOG_DIR_ENV], f"engine-rank{rank}.log"))
    select_plugins()
    er = EngineRank(rank, world_size, workdir)
    try:
        er._join_world(init_method)
        conn.send(("ready", None))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            er.stop()
            return
        script, args = msg
        t0 = time.perf_counter()
        try:
            value = script(er, *args)
            reply = RankResult(rank, True, value, seconds=time.perf_counter() - t0)
        except BaseException as exc:  # a script's failure is data for the test
            reply = RankResult(
                rank,
                False,
                error=f"{type(exc).__name__}: {exc}",
                kind="error",
                seconds=time.perf_counter() - t0,
                trace=traceback.format_exc(),
            )
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable value
            conn.send(RankResult(rank, False, error=f"result not picklable: {exc}", kind="error"))


class EngineRanks:
    """A pool of ``world_size`` engine rank processes, started on first use and reused."""

    def __init__(
        self,
        world_size: int = 2,
        start_timeout: float = 120.0,
        workdir: str | None = None,
        start_method: str = "spawn",
    ) -> None:
        """``workdir`` holds the toy model's config: pools that share it send the same
        ``CacheConfig`` (its ``model_path``), so one daemon serves engines of every pool.
        ``start_method="fork"``: the ranks are forked from the caller, which has imported sglang
        and run no torch op (its thread pools would not survive the fork), so a rank starts in
        a fraction of a second instead of the seconds of sglang's imports."""
        self.world_size = world_size
        self.start_method = start_method
        self.start_timeout = start_timeout
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._workdir = workdir if workdir is not None else tempfile.mkdtemp(prefix="engine-ranks-")

    def __enter__(self) -> EngineRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> EngineRanks:
        """Start the rank processes now (the first script would): their pids are known from here."""
        if not self._procs:
            self._start()
        return self

    def _start(self) -> None:
        ctx = mp.get_context(self.start_method)
        # A file rendezvous, fresh for each start: a TCP port picked free and then released can be
        # taken by another pool starting at the same moment (suspected in one hung demo start).
        init_method = f"file://{tempfile.mkdtemp(prefix='engine-ranks-rdzv-')}/store"
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_rank_main, args=(rank, self.world_size, init_method, self._workdir, child), daemon=True
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
        for rank, conn in enumerate(self._conns):
            if not conn.poll(self.start_timeout):
                self.close()
                raise TimeoutError(f"engine rank {rank} did not start within {self.start_timeout}s")
            status, detail = conn.recv()
            if status != "ready":
                self.close()
                raise RuntimeError(f"engine rank {rank} failed to start:\n{detail}")

    def run(self, script: Callable[..., Any], *args: Any, timeout: float = 60.0) -> list[RankResult]:
        """Run ``script(rank, *args)`` on every rank at once; one RankResult per rank."""
        if not self._procs:
            self._start()
        for conn in self._conns:
            conn.send((script, args))
        return self._collect(timeout)

    def run_each(
        self, scripts: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], timeout: float = 60.0
    ) -> list[RankResult]:
        """Like ``run`` but rank r runs ``scripts[r]`` (a script and its args)."""
        if not self._procs:
            self._start()
        for conn, (script, args) in zip(self._conns, scripts, strict=True):
            conn.send((script, args))
        return self._collect(timeout)

    def _collect(self, timeout: float) -> list[RankResult]:
        deadline = time.monotonic() + timeout
        results: dict[int, RankResult] = {}
        while len(results) < self.world_size:
            waiting = [rank for rank in range(self.world_size) if rank not in results]
            mp.connection.wait([self._conns[r] for r in waiting], max(0.0, min(0.05, deadline - time.monotonic())))
            for rank in waiting:
                alive = self._procs[rank].is_alive()  # before the poll: a rank that answered and exited is read
                if self._conns[rank].poll(0):
                    try:
                        results[rank] = self._conns[rank].recv()
                        continue
                    except EOFError:
                        alive = False
                if not alive:
                    results[rank] = RankResult(rank, False, error="the rank process died", kind="died")
            died = [r for r in results.values() if r.kind == "died"]
            if died or time.monotonic() >= deadline:
                # An engine whose rank died is dead (sglang's launcher takes every rank down with it), and the
                # others would wait in a collective for a rank that never comes.
                for rank in range(self.world_size):
                    if rank not in results:
                        kind = "killed" if died else "hung"
                        why = f"rank {died[0].rank} died" if died else f"no answer within {timeout}s"
                        results[rank] = RankResult(rank, False, error=why, kind=kind)
                self.kill()
                break
        return [results[rank] for rank in range(self.world_size)]

    def kill(self) -> None:
        """SIGKILL every rank process (an engine that dies); the next ``run`` starts new ones."""
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def close(self) -> None:
        """Ask every rank to stop (detach) and exit; one still running after 5 s is SIGKILLed."""
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=5)
        self.kill()
