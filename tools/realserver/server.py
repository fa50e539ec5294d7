"""Real ``python -m sglang.launch_server`` servers and standalone weight cache daemons on CPU.

Every command runs with the CPU bridge (``tools.cpu_bridge.bridge_env``), its own
socket/ready-file templates under the run folder (so two runs never share a daemon), and its
output in ``<run>/logs/<name>.log``.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon_adapter.alone import START_ALONE_ENV
from daemon_adapter.daemon import AUTO_REPAIR_ENV
from daemon_adapter.layout_file import init_expert_location_json, write_atomically
from layout_sm.trace_codec import TRACE_ENV
from tools import with_project_path
from tools.cpu_bridge import CPU_SERVER_ARGS, EXTRA_HOOKS_ENV, bridge_env
from tools.cpu_bridge.bridges import cpu_device_uuid
from tools.realserver import engine_probes
from tools.realserver.model import FAMILIES, PROMPTS
from tools.realserver.processes import ProcessTree

SOCKET_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"
READY_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_READY_TEMPLATE"
PLUGINS_ENV = "SGLANG_PLUGINS"
PROTOCOL_OFF = "none"  # SGLANG_PLUGINS value that leaves this project's plugin out (the bridge stays)


@functools.cache
def other_model_modules(keep: tuple[str, ...] = FAMILIES) -> str:
    """SGLANG_DISABLED_MODEL_ARCHS: every module of sglang.srt.models but the tiny models' own
    (``model.FAMILIES`` are their module names). sglang's registry imports every module there (255
    in 0.5.23, seconds of CPU per process); its own switch skips the others, as a deployment that
    serves one model may. Listed once per process, not per command."""
    import importlib.util
    import pkgutil

    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    models = [os.path.join(path, "srt", "models") for path in spec.submodule_search_locations]
    names = sorted({m.name for m in pkgutil.iter_modules(models) if not m.ispkg} - set(keep))
    return ",".join(names)


class ServerFailed(RuntimeError):
    """A server or daemon did not come up; the message ends with its log tail."""


def free_port(low: int = 30000, attempts: int = 64) -> int:
    """A free port for a server's HTTP socket, which sglang binds only 30-100 s later. Taken below
    the kernel's ephemeral range (bind(0) and connect() hand out ports from there: another
    server's gloo connections took one in that window, "address already in use") and above
    22000-29999, where sglang takes its own (``get_free_port_below_ephemeral``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0]) - 1
    except (OSError, ValueError, IndexError):
        high = 32767
    for port in random.sample(range(low, high + 1), min(attempts, max(high - low + 1, 0))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the ephemeral range: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Topology:
    """What servers and daemons must agree on (sglang's CacheConfig compares these)."""

    model_path: Path
    tp_size: int = 2
    ep_size: int = 2
    redundant_experts: int = 2
    enable_eplb: bool = True

    def args(self) -> list[str]:
        out = ["--model-path", str(self.model_path), "--tp-size", str(self.tp_size), "--ep-size", str(self.ep_size)]
        out += [*CPU_SERVER_ARGS, "--ep-num-redundant-experts", str(self.redundant_experts)]
        if self.enable_eplb:
            out.append("--enable-eplb")
        return out


@dataclass
class RunDir:
    """One folder per run: logs, daemon sockets, probe files."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()
        for sub in ("logs", "sockets", "probes", "traces"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    @property
    def socket_template(self) -> str:
        return str(self.root / "sockets" / "wc_{device_uuid}.sock")

    @property
    def ready_template(self) -> str:
        return str(self.root / "sockets" / "wc_{device_uuid}.ready")

    def socket_path(self, rank: int) -> str:
        return self.socket_template.format(device_uuid=cpu_device_uuid(platform.machine(), rank))

    def ready_path(self, rank: int) -> str:
        return self.ready_template.format(device_uuid=cpu_device_uuid(platform.machine(), rank))

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def probes(self, name: str) -> Path:
        path = self.root / "probes" / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def env(self, tp_size: int, plugins: str | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a bridged command of this run (``plugins``: SGLANG_PLUGINS)."""
        env = bridge_env(tp_size=tp_size)
        env[SOCKET_TEMPLATE_ENV] = self.socket_template
        env[READY_TEMPLATE_ENV] = self.ready_template
        env["PYTHONUNBUFFERED"] = "1"
        env[TRACE_ENV] = str(self.root / "traces")  # every daemon's protocol trace, checked by the tests
        env["SGLANG_DISABLED_MODEL_ARCHS"] = other_model_modules()
        env[EXTRA_HOOKS_ENV] = f"{engine_probes.__name__}:{engine_probes.register_if_asked.__name__}"
        # The run's own settings only: a variable left in the caller's environment (a test's, say) must
        # not turn auto repair off, or have daemons start alone, in this run.
        for name in (PLUGINS_ENV, engine_probes.DIR_ENV, engine_probes.STOP_ENV, engine_probes.EPLB_TIME_ENV,
                     AUTO_REPAIR_ENV, START_ALONE_ENV):  # fmt: skip
            env.pop(name, None)
        if plugins is not None:
            env[PLUGINS_ENV] = plugins
        env.update(extra or {})
        return env


class StandaloneDaemons:
    """``python -m daemon_adapter`` for every local rank (sglang's all-ranks launcher mode), in its
    own process group: a server's SIGKILL does not reach it. ``layout_aware=False``: sglang's own
    daemons instead (``tools.realserver.plain_daemons``)."""

    def __init__(
        self,
        run: RunDir,
        topology: Topology,
        name: str = "daemons",
        extra_args: Sequence[str] = (),
        layout_aware: bool = True,
        local_ranks: int | None = None,
    ) -> None:
        self.run = run
        self.topology = topology
        self.name = name
        # The daemons of this node (``--nnodes``: a share of the ranks, local GPU ids from 0).
        self.local_ranks = topology.tp_size if local_ranks is None else local_ranks
        module = "daemon_adapter" if layout_aware else "tools.realserver.plain_daemons"
        argv = [sys.executable, "-m", module, *topology.args(), *extra_args]
        self.tree = ProcessTree(name, argv, run.env(topology.tp_size), run.log(name))

    def start(self) -> StandaloneDaemons:
        for rank in range(self.local_ranks):  # a dead run's files would block the start
            for path in (self.run.socket_path(rank), self.run.ready_path(rank)):
                if os.path.exists(path):
                    os.unlink(path)
        self.tree.start()
        return self

    def wait_ready(self, timeout_s: float = 240.0) -> float:
        """Seconds until every rank's ready file and socket exist; ServerFailed otherwise."""
        assert self.tree.started_at is not None
        deadline = time.monotonic() + timeout_s
        paths = [p for r in range(self.local_ranks) for p in (self.run.ready_path(r), self.run.socket_path(r))]
        while not all(os.path.exists(p) for p in paths):
            if not self.tree.alive():
                raise ServerFailed(
                    f"{self.name} exited with code {self.tree.exit_code()} before they were ready; "
                    f"{self.tree.failure_report()}"
                )
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"{self.name} not ready after {timeout_s:.0f}s (waiting for {paths}); "
                    f"log {self.tree.log_path}:\n{self.tree.log_tail()}"
                )
            time.sleep(0.5)
        return time.monotonic() - self.tree.started_at

    def kill(self) -> None:
        self.tree.kill()

    def stop(self) -> None:
        self.tree.terminate()


@dataclass
class ServerSpec:
    """One ``python -m sglang.launch_server`` command line, beyond the topology."""

    name: str
    weight_cache_mode: str = "client"  # "daemon": spawns its own daemons; "client": standalone ones
    rebalance_iterations: int = 20
    layers_per_chunk: int | None = None
    init_expert_location: str | None = None  # a JSON file of a physical_to_logical_map, or "trivial"
    plugins: str | None = None  # SGLANG_PLUGINS; PROTOCOL_OFF leaves this project's plugin out
    stop_at: engine_probes.StopPoint | None = None
    extra_args: tuple[str, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamedReply:
    """A streamed request's times (``time.monotonic()``) and its output ids."""

    sent: float
    first_token: float | None
    done: float
    output_ids: list[int]


class RealServer:
    """A real sglang server: start, wait ready, greedy generation over HTTP, SIGKILL, beliefs."""

    def __init__(self, run: RunDir, topology: Topology, spec: ServerSpec, port: int | None = None) -> None:
        self.run = run
        self.topology = topology
        self.spec = spec
        self.port = port or free_port()
        self.probe_dir = run.probes(spec.name)
        for old in self.probe_dir.iterdir():
            old.unlink()
        argv = [sys.executable, "-m", "sglang.launch_server", *topology.args()]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--skip-server-warmup", "--random-seed", "0"]
        # An idle scheduler otherwise polls and takes a core each: on 2 cores that slows everything.
        argv.append("--sleep-on-idle")
        argv += ["--weight-cache-mode", spec.weight_cache_mode]
        argv += ["--eplb-rebalance-num-iterations", str(spec.rebalance_iterations)]
        argv += ["--expert-distribution-recorder-buffer-size", str(spec.rebalance_iterations)]
        if spec.layers_per_chunk is not None:
            argv += ["--eplb-rebalance-layers-per-chunk", str(spec.layers_per_chunk)]
        if spec.init_expert_location is not None:
            argv += ["--init-expert-location", spec.init_expert_location]
        argv += list(spec.extra_args)
        extra = {engine_probes.DIR_ENV: str(self.probe_dir), **spec.extra_env}
        if spec.stop_at is not None:
            extra[engine_probes.STOP_ENV] = spec.stop_at.env_value()
        env = run.env(topology.tp_size, plugins=spec.plugins, extra=extra)
        self.tree = ProcessTree(spec.name, argv, env, run.log(spec.name))
        self.ready_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RealServer:
        self.tree.start()
        return self

    def _get(self, path: str, timeout: float = 5.0) -> int:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as response:
                return int(response.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    def freeze_gc(self) -> None:
        """sglang's own ``/freeze_gc``, as an operator runs it once a server is warm: the objects alive now
        leave the garbage collector's view, so no later collection walks the whole heap (hundreds of
        milliseconds on these CPUs) in the middle of a forward pass or a rebalance."""
        request = urllib.request.Request(self.url + "/freeze_gc", method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise RuntimeError(f"{self.spec.name}: /freeze_gc answered {response.status}")

    def metrics(self, prefix: str = "sglang:expert_layout_") -> list[tuple[str, dict[str, str], float]]:
        """The samples of sglang's ``/metrics`` (``--enable-metrics``) whose name starts with ``prefix``."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as response:
            text = response.read().decode()
        return [
            (sample.name, dict(sample.labels), sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name.startswith(prefix)
        ]

    def wait_ready(self, timeout_s: float = 300.0, poll_s: float = 0.05) -> float:
        """Seconds from start until ``/health`` answers 200 (a refused connection returns at once). sglang
        answers it only on a whole second after it was asked (``health_generate`` sleeps 1 s between its
        looks): ``wait_first_token`` times a start finely. ServerFailed, with the log tail, if the server
        exits first (a startup refusal: the reason is in the tail) or the timeout passes."""
        return self._wait_until(lambda _left: self._get("/health", timeout=2.0) == 200, timeout_s, poll_s)

    def wait_first_token(self, timeout_s: float = 300.0, poll_s: float = 0.05) -> float:
        """Seconds from start until the server generated its first token, to within ``poll_s``: a one-token
        ``/generate``, sent again ``poll_s`` after each refused connection, is answered as soon as the token
        is made. ServerFailed as ``wait_ready``."""

        def first_token(left: float) -> bool:
            try:
                return bool(self.generate(["ready"], max_new_tokens=1, timeout_s=max(left, 0.1))[0])
            except urllib.error.HTTPError:  # up, not serving yet
                return False

        return self._wait_until(first_token, timeout_s, poll_s)

    def _wait_until(self, ready: Callable[[float], bool], timeout_s: float, poll_s: float) -> float:
        """Asks ``ready(seconds left)`` every ``poll_s`` (an unreachable port counts as not ready) until it
        says yes; the seconds since start."""
        assert self.tree.started_at is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.tree.alive():
                raise ServerFailed(
                    f"server {self.spec.name} exited with code {self.tree.exit_code()} before it was ready; "
                    f"{self.tree.failure_report()}"
                )
            try:
                if ready(deadline - time.monotonic()):
                    self.ready_s = time.monotonic() - self.tree.started_at
                    return self.ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"server {self.spec.name} not ready after {timeout_s:.0f}s; {self.tree.failure_report()}"
                )
            time.sleep(poll_s)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code once the server process has exited, or None after ``timeout_s``."""
        assert self.tree.proc is not None
        try:
            return self.tree.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def generate(self, prompts: Sequence[str], max_new_tokens: int = 16, timeout_s: float = 300.0) -> list[list[int]]:
        """Greedy token ids for each prompt (one batch request to sglang's ``/generate``)."""
        body = {
            "text": list(prompts),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        request = urllib.request.Request(
            self.url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            replies = json.loads(response.read())
        return [list(reply["output_ids"]) for reply in replies]

    def generate_streamed(self, prompt: str, max_new_tokens: int = 16, timeout_s: float = 300.0) -> StreamedReply:
        """One greedy streamed request: when its first token and its end arrived (monotonic), and its ids."""
        body = {
            "text": prompt,
            "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        request = urllib.request.Request(
            self.url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        sent = time.monotonic()
        first: float | None = None
        chunks: list[list[int]] = []
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            for raw in response:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                ids = list(json.loads(line[len("data:") :]).get("output_ids") or [])
                if ids and first is None:
                    first = time.monotonic()
                chunks.append(ids)
        done = time.monotonic()
        # sglang streams each chunk's new ids or the whole output so far, by a server flag: either way
        # the whole output is the last chunk when that one holds every token, else the chunks joined.
        last = chunks[-1] if chunks else []
        ids = last if len(last) == max_new_tokens else [i for c in chunks for i in c]
        return StreamedReply(sent, first, done, ids)

    def health(self, timeout_s: float = 5.0) -> int:
        """``/health``'s status code (a parked standby answers 503)."""
        return self._get("/health", timeout=timeout_s)

    def beliefs(self) -> dict[int, dict[str, Any]]:
        """What each rank routes with, as its probe last wrote it: map, version, startup, pid."""
        out: dict[int, dict[str, Any]] = {}
        for path in sorted(self.probe_dir.glob("rank*.belief.json")):
            data = json.loads(path.read_text())
            out[int(data["rank"])] = data
        return out

    def stopped_ranks(self) -> list[int]:
        return sorted(int(p.name[4:].split(".")[0]) for p in self.probe_dir.glob("rank*.stopped"))

    def wait_stopped(self, timeout_s: float, ranks: int | None = None) -> None:
        """Until every rank (or ``ranks`` of them: a node's share, or the ranks that meet the point) has
        reached the spec's stop point; ServerFailed otherwise."""
        deadline = time.monotonic() + timeout_s
        while len(self.stopped_ranks()) < (self.topology.tp_size if ranks is None else ranks):
            if not self.tree.alive() or time.monotonic() > deadline:
                raise ServerFailed(
                    f"server {self.spec.name}: ranks {self.stopped_ranks()} of {self.topology.tp_size} reached "
                    f"{self.spec.stop_at} (alive={self.tree.alive()}); "
                    f"log {self.tree.log_path}:\n{self.tree.log_tail()}"
                )
            time.sleep(0.2)

    def log_text(self) -> str:
        return self.tree.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the server's whole process tree (its spawned daemons too, in daemon mode)."""
        self.tree.kill()

    def stop(self) -> None:
        self.tree.terminate()


def daemon_status(run: RunDir, include_map: bool = False, timeout_s: float = 30.0) -> dict[str, Any]:
    """``expert-layout status --json`` for this run's daemons (the CLI as an operator runs it)."""
    argv = [sys.executable, "-m", "daemon_adapter.status_cli", "status", "--json"]
    if include_map:
        argv.append("--include-map")
    env = dict(os.environ)
    env[SOCKET_TEMPLATE_ENV] = run.socket_template
    env = with_project_path(env)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"exit_code": done.returncode, "daemons": [], "stderr": done.stderr[-2000:]}


def disk_reference(
    root: Path, topology: Topology, physical_to_logical_map: list[list[int]], init_file: Path | None = None
) -> RealServer:
    """The reference a test judges a server's outputs against: a server (not started) that loads from disk
    with ``--init-expert-location`` set to the map, no weight cache, no plugin, no rebalance, run in ``root``.
    ``init_file``: that file as written already (by ``expert-layout export``), else one is written."""
    run = RunDir(root)
    if init_file is None:
        init = write_expert_location(run.root / "init-expert-location.json", physical_to_logical_map)
    else:
        init = str(init_file)
    spec = ServerSpec(
        "ref", weight_cache_mode="off", rebalance_iterations=100_000, init_expert_location=init, plugins=PROTOCOL_OFF
    )
    return RealServer(run, topology, spec)


class DiskReferences:
    """The greedy outputs of ``disk_reference`` servers, one server per topology and map: a map asked
    for again (another case, or another schedule, that ended at the same layout) is answered from the
    outputs already read, not by another server. ``started`` and ``reused`` count each way."""

    def __init__(self, root: Path, start_timeout_s: float = 600.0, prompt_timeout_s: float = 300.0) -> None:
        self.root = Path(root)
        self.start_timeout_s = start_timeout_s
        self.prompt_timeout_s = prompt_timeout_s
        self._outputs: dict[tuple[Topology, str], list[list[int]]] = {}
        self.started = 0
        self.reused = 0

    def outputs(self, topology: Topology, physical_to_logical_map: list[list[int]]) -> list[list[int]]:
        """The greedy outputs of ``PROMPTS`` (16 new tokens) of a disk server with that map; AssertionError
        when the reference's own ranks route with another map."""
        key = (topology, json.dumps(physical_to_logical_map))
        if key in self._outputs:
            self.reused += 1
            return self._outputs[key]
        reference = disk_reference(self.root / f"reference-{len(self._outputs)}", topology, physical_to_logical_map)
        reference.start()
        try:
            reference.wait_ready(self.start_timeout_s)
            outputs = reference.generate(list(PROMPTS), max_new_tokens=16, timeout_s=self.prompt_timeout_s)
            routes = {rank: belief["map"] for rank, belief in reference.beliefs().items()}
        finally:
            reference.kill()
        # The reference itself must route with the map asked for (sglang read --init-expert-location).
        if routes != dict.fromkeys(range(topology.tp_size), physical_to_logical_map):
            raise AssertionError(f"the disk reference does not route with the map it was started with: {routes}")
        self.started += 1
        self._outputs[key] = outputs
        return outputs


def parked_engines(run: RunDir) -> list[list[str]]:
    """Each daemon's parked warm standbys (``expert-layout status``), in rank order."""
    return [list((d.get("state") or {}).get("parked") or []) for d in daemon_status(run)["daemons"]]


def wait_parked(run: RunDir, standby: RealServer, ranks: int, timeout_s: float = 600.0) -> float:
    """Seconds from the standby's start until it is parked on every daemon of ``run`` (a parked standby's
    ``/health`` answers 503: this is its ready); ServerFailed if it exits first or the timeout passes."""
    assert standby.tree.started_at is not None
    deadline = time.monotonic() + timeout_s
    while True:
        if not standby.tree.alive():
            raise ServerFailed(
                f"standby {standby.spec.name} exited with code {standby.tree.exit_code()} before it parked; "
                f"{standby.tree.failure_report()}"
            )
        lists = parked_engines(run)
        if len(lists) == ranks and all(lists):
            standby.ready_s = time.monotonic() - standby.tree.started_at
            return standby.ready_s
        if time.monotonic() > deadline:
            raise ServerFailed(f"standby {standby.spec.name} not parked after {timeout_s:.0f}s: {lists}")
        time.sleep(0.2)


def start_standby_beside(run: RunDir, primary: RealServer, spec: ServerSpec, timeout_s: float = 600.0) -> RealServer:
    """Start the warm standby ``spec`` once ``primary`` is attached to every daemon of ``run`` (it would
    otherwise find no primary there, and take over at once); ServerFailed if the primary exits first."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not primary.tree.alive():
            raise ServerFailed(f"the primary exited before the standby started: {primary.tree.failure_report()}")
        daemons = daemon_status(run)["daemons"]
        if len(daemons) == primary.topology.tp_size and all((d.get("state") or {}).get("attached") for d in daemons):
            return RealServer(run, primary.topology, spec).start()
        if time.monotonic() > deadline:
            raise ServerFailed(f"the primary did not attach to every daemon within {timeout_s:.0f}s")
        time.sleep(0.5)


def daemon_status_table(run: RunDir, timeout_s: float = 30.0) -> str:
    """``expert-layout status`` as the table an operator reads."""
    env = dict(os.environ)
    env[SOCKET_TEMPLATE_ENV] = run.socket_template
    env = with_project_path(env)
    argv = [sys.executable, "-m", "daemon_adapter.status_cli", "status"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    return (done.stdout + done.stderr).rstrip()


def write_expert_location(path: Path, physical_to_logical_map: list[list[int]]) -> str:
    """A file for ``--init-expert-location``, in the format ``expert-layout export`` writes."""
    write_atomically(path, init_expert_location_json(physical_to_logical_map))
    return str(path)


def export_layout(run: RunDir, path: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """``expert-layout export --out PATH`` on this run's daemons (the CLI as an operator runs it)."""
    argv = [sys.executable, "-m", "daemon_adapter.status_cli", "export", "--out", str(path)]
    env = dict(os.environ)
    env[SOCKET_TEMPLATE_ENV] = run.socket_template
    return subprocess.run(argv, env=with_project_path(env), capture_output=True, text=True, timeout=timeout_s)


def park(servers: Sequence[RealServer], timeout_s: float) -> None:
    """Requests to the first of ``servers`` until every rank waits at its stop point
    (``engine_probes.StopAt``): ``servers`` is one server, or each node's part of a server across
    nodes (``tools.realserver.nodes``). A parked rank blocks its forward pass, so the requests go
    from a thread that the coming SIGKILL ends."""

    def stopped() -> int:
        return sum(len(server.stopped_ranks()) for server in servers)

    def requests() -> None:
        while servers[0].tree.alive() and stopped() < servers[0].topology.tp_size:
            try:
                servers[0].generate(list(PROMPTS), max_new_tokens=16)
            except Exception:
                return

    threading.Thread(target=requests, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while stopped() < servers[0].topology.tp_size:
        if not all(server.tree.alive() for server in servers) or time.monotonic() > deadline:
            raise ServerFailed(f"{stopped()} ranks reached the stop point; log tail:\n{servers[0].tree.log_tail()}")
        time.sleep(0.2)
