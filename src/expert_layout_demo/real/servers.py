"""What the demo needs from real servers and daemons, in one place over the real-server library.

Servers are ``python -m sglang.launch_server`` processes with the test-only CPU bridge
(``expert_layout_cpu_bridge.bridge_env``), TP2/EP2 with 2 redundant experts and EPLB, each in its
own process group so that a SIGKILL takes the whole tree (scheduler ranks, detokenizer and the
daemons it spawned) as an OOM kill or ``kill -9`` of the group would.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WORLD = 2
NUM_LOGICAL = 8
SOCKET_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"
READY_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_READY_TEMPLATE"
REBALANCE_END = r"\[EPLBManager\] rebalance end"
# EPLB's interval: above the forward passes of one round of the demo's prompts (4 x 8 tokens),
# so a server's outputs are generated on one layout; the demo drives further requests to rebalance.
REBALANCE_ITERATIONS = 60
NO_REBALANCE_ITERATIONS = 10**9  # the disk references never move their experts
READY_TIMEOUT_S = 300.0
BETWEEN_CHUNKS = "between_chunks"
MID_MOVE = "mid_move"

_TIMINGS: list[dict[str, Any]] = []


def model_dir() -> str:
    """The tiny Qwen3-MoE checkpoint (built once, cached under ``build/``)."""
    from expert_layout_real.model import build_tiny_qwen3_moe

    return str(build_tiny_qwen3_moe().resolve())


def timings() -> list[dict[str, Any]]:
    """Every server started in this process: name, outcome, seconds to ready or to failure."""
    return list(_TIMINGS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(plugin: bool, extra: dict[str, str]) -> dict[str, str]:
    from expert_layout_cpu_bridge import bridge_env

    env = bridge_env(tp_size=WORLD)
    env.pop("SGLANG_PLUGINS", None)
    if not plugin:
        env["SGLANG_PLUGINS"] = "none"  # sglang loads no plugin in any process: the protocol is off
    env.update(extra)
    return env


def common_args(
    model: str, *, enable_eplb: bool = True, rebalance_iterations: int = REBALANCE_ITERATIONS, chunked: bool = True
) -> list[str]:
    """The flags every server and daemon of the demo shares (a daemon's config must match its engines')."""
    from expert_layout_cpu_bridge import CPU_SERVER_ARGS

    args = ["--model-path", model, "--tp-size", str(WORLD), "--ep-size", str(WORLD), *CPU_SERVER_ARGS]
    args += ["--ep-num-redundant-experts", "2"]
    if enable_eplb:
        args += ["--enable-eplb", "--eplb-rebalance-num-iterations", str(rebalance_iterations)]
        if chunked:  # one layer per chunk: two chunks per rebalance, a point between them to kill at
            args += ["--eplb-rebalance-layers-per-chunk", "1"]
    return args


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log_path: str
    started: float
    ready: bool = False
    ready_s: float = 0.0
    failure: str = ""
    stopped: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def log_count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log_text()))

    def generate(self, prompt: str, max_new_tokens: int) -> list[int]:
        body = {"text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens}}
        req = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=120) as reply:
            out = json.loads(reply.read())
        return list(out["output_ids"])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.failure = _last_error(self.log_text()) or f"exited with code {self.proc.returncode}"
                return False
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=30) as reply:
                    if reply.status == 200:
                        self.ready, self.ready_s = True, time.monotonic() - self.started
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        self.failure = f"not ready within {timeout:.0f}s"
        return False

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM to the process group (sglang's own shutdown), SIGKILL if it lingers."""
        if self.stopped:
            return
        self.stopped = True
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(10)
        _wait_group_gone(self.proc.pid, timeout)

    def kill(self) -> None:
        """SIGKILL to every process of the server at once."""
        self.stopped = True
        self._signal_group(signal.SIGKILL)
        self.proc.wait(10)
        _wait_group_gone(self.proc.pid, 10.0)


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _last_error(log: str) -> str:
    """The line that says why a server failed: an exception's message, or a refusal of this project."""
    patterns = (
        r"[^\n]*\[expert-layout\][^\n]*(fail|refus|dirty|cannot|must)[^\n]*",
        r"[^\n]*\b[A-Z]\w+(Error|Exception): [^\n]*",
    )
    for pattern in patterns:
        found = [m.group(0) for m in re.finditer(pattern, log)]
        if found:
            return " ".join(found[-1].split())
    return ""


def start_server(
    name: str,
    model: str,
    *,
    plugin: bool,
    weight_cache: str,
    enable_eplb: bool,
    init_expert_location: str | None,
    env: dict[str, str],
    log_path: str,
    expect_ready: bool = True,
    chunked: bool = True,
) -> Server:
    """Start ``python -m sglang.launch_server`` and wait until it serves or fails."""
    iterations = REBALANCE_ITERATIONS if weight_cache != "off" else NO_REBALANCE_ITERATIONS
    args = common_args(model, enable_eplb=enable_eplb, rebalance_iterations=iterations, chunked=chunked)
    cmd = [sys.executable, "-m", "sglang.launch_server", *args]
    port = _free_port()
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--weight-cache-mode", weight_cache]
    if init_expert_location is not None:
        cmd += ["--init-expert-location", init_expert_location]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(plugin, env), start_new_session=True
        )
    server = Server(name, proc, port, log_path, time.monotonic())
    ok = server.wait_ready()
    _TIMINGS.append(
        {
            "server": name,
            "ready": ok,
            "seconds": round(server.ready_s if ok else time.monotonic() - server.started, 1),
            "failure": server.failure,
        }
    )
    if not ok:
        server.stop()
        if expect_ready:
            raise RuntimeError(f"server {name} did not start: {server.failure} (log: {log_path})")
    return server


@dataclass
class Daemons:
    proc: subprocess.Popen[bytes]
    log_path: str
    sockets: list[str] = field(default_factory=list)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        _wait_group_gone(self.proc.pid, 10.0)


def daemon_sockets(template: str, count: int) -> list[str]:
    """The daemons' sockets that ``template`` names, in rank order."""
    from daemon_adapter.status_cli import discover_sockets

    found = discover_sockets(template)
    if len(found) != count:
        raise RuntimeError(f"expected {count} daemon sockets for {template}, found {found}")
    return found


def start_daemons(model: str, *, layout_aware: bool, enable_eplb: bool, env: dict[str, str], log_path: str) -> Daemons:
    """Standalone daemons for every rank: ``python -m daemon_adapter`` (layout-aware) or sglang's own module."""
    module = "daemon_adapter" if layout_aware else "sglang.srt.weight_cache.daemon"
    cmd = [sys.executable, "-m", module, *common_args(model, enable_eplb=enable_eplb)]
    with open(log_path, "ab") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(layout_aware, env), start_new_session=True
        )
    daemons = Daemons(proc, log_path)
    template = env[SOCKET_TEMPLATE_ENV]
    deadline = time.monotonic() + READY_TIMEOUT_S
    from daemon_adapter.status_cli import discover_sockets

    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"daemons exited with code {proc.returncode}; see {log_path}")
        found = discover_sockets(template)
        ready = glob.glob(env[READY_TEMPLATE_ENV].replace("{device_uuid}", "*"))
        if len(found) == WORLD and len(ready) == WORLD:
            daemons.sockets = found
            return daemons
        time.sleep(0.5)
    daemons.stop()
    raise RuntimeError(f"daemons not ready within {READY_TIMEOUT_S:.0f}s; see {log_path}")


def kill_at(server: Server, point: str, drive: Callable[[], None]) -> str:
    """Drive ``server`` to ``point`` of the chunk protocol and SIGKILL its process tree there."""
    raise NotImplementedError(f"stopping a server at {point} comes with the real-server library")
