"""Test-only probes in a real server's engine (scheduler) processes: what each rank believes,
and a stop at a chosen protocol point. Loaded by the CPU bridge's sitecustomize, so only in
processes our launchers start; each probe is on only when its environment variable is set.

- ``EXPERT_LAYOUT_TEST_DIR``: after the model loads and after every forward pass in which it
  changed, each rank writes ``rank{r}.belief.json`` there (atomically): the
  ``physical_to_logical_map`` it routes with, its pid, and the version and startup outcome the
  plugin holds (``null`` with the plugin off). A HookRegistry AFTER hook on sglang's
  ``ModelRunner.load_model`` and ``EPLBManager.on_forward_pass_end``.
- ``EXPERT_LAYOUT_TEST_EPLB_TIME=1`` (with the directory above): each rank writes ``rank{r}.eplb.json``,
  the time its ``EPLBManager.on_forward_pass_end`` calls spent on rebalance work (an AROUND hook), so
  a chunked rebalance is timed whole, with the protocol or without it; and each chunk's parts as the
  plugin times them (its begin phase, sglang's move, its commit phase) or, with the floor below, as
  the floor does: where a rebalance's time goes, inside the server.
- ``EXPERT_LAYOUT_TEST_CHUNK_FLOOR=1`` or ``=2`` (for a server with the plugin off): each chunk of sglang's
  rebalance does what the protocol's floor is, where the protocol does it: a ping to the rank's daemon
  and an all-gather of its reply before sglang's move, a device synchronize and a ping after it (``=1``,
  the protocol's shape), or a ping and an all-gather after it (``=2``, the shape with the commit's check
  in an all-gather of its own) (``ChunkFloor``), with the plugin's own client, socket path and
  all-gather. A rebalance's time is then sglang's plus the floor, measured inside the server
  (``make bench``'s in-situ floors).
- ``EXPERT_LAYOUT_TEST_STOP=POINT:N`` (with the directory above): a rank that reaches the point
  writes ``rank{r}.stopped`` and blocks until it is killed (the test SIGKILLs the server's
  process tree once every rank has stopped). Points, counted per rank:
  ``after_commit:N`` the rank's daemon has answered ok to its N-th commit (between two chunks,
  the committed layout is the daemon's record); ``mid_move:N`` the rank's daemon has answered ok
  to its N-th begin (sglang's move of that chunk not started: the daemon holds a pending move);
  ``before_commit:N`` the rank is about to send its N-th commit (sglang has moved that chunk's
  experts in the daemon's memory, the record still holds the base version: the torn move at its
  worst, memory and record apart); ``after_claim:N`` a warm standby's daemon has granted its N-th
  claim (its takeover under way: the daemon has it as its primary, the other ranks may not yet);
  ``before_rejoin:N`` the rank is about to ask its daemon, started again from disk, for its N-th
  rejoin (the engine attached there, its startup under way). An
  AROUND hook on ``daemon_adapter.client.send_request``
  (every request's: ``client.request`` sends through it): it reads the request type and, once the
  reply is read, its status only, and changes neither.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DIR_ENV = "EXPERT_LAYOUT_TEST_DIR"
STOP_ENV = "EXPERT_LAYOUT_TEST_STOP"
EPLB_TIME_ENV = "EXPERT_LAYOUT_TEST_EPLB_TIME"
CHUNK_FLOOR_ENV = "EXPERT_LAYOUT_TEST_CHUNK_FLOOR"
BLOCK_S = 600.0
STOP_REQUEST = {
    "after_commit": "expert_layout_commit",
    "mid_move": "expert_layout_begin",
    "before_commit": "expert_layout_commit",
    "after_claim": "expert_layout_claim",
    "before_rejoin": "expert_layout_rejoin",
}
# The points met before the request is sent (the others: once its ok reply is back).
STOP_BEFORE = frozenset({"before_commit", "before_rejoin"})


@dataclass(frozen=True)
class StopPoint:
    name: str  # a key of STOP_REQUEST
    count: int  # stop at the count-th ok reply to that request

    @classmethod
    def parse(cls, text: str) -> StopPoint:
        name, _, n = text.partition(":")
        if name not in STOP_REQUEST or not n.isdigit() or int(n) < 1:
            raise ValueError(
                f"{STOP_ENV}={text!r}: expected one of {sorted(STOP_REQUEST)} and a count >= 1, e.g. after_commit:1"
            )
        return cls(name, int(n))

    def env_value(self) -> str:
        return f"{self.name}:{self.count}"


def _rank() -> int:
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().tp_rank)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class BeliefWriter:
    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self._last: str | None = None

    def write_if_changed(self) -> None:
        from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

        metadata = get_global_expert_location_metadata()
        rows = None if metadata is None else metadata.physical_to_logical_map_cpu.tolist()
        version, startup = None, None
        try:  # the plugin's state in this process, when the plugin is loaded
            from engine_adapter import state

            st = state.get()
            outcome = None if st.session is None else st.session.view().outcome
            version = None if outcome is None else st.session.view().version
            startup = None if outcome is None else outcome.kind
        except ImportError:
            pass
        key = hashlib.sha256(json.dumps([rows, version, startup]).encode()).hexdigest()
        if key == self._last:
            return
        self._last = key
        rank = _rank()
        _write_json(
            self.out_dir / f"rank{rank}.belief.json",
            {
                "rank": rank,
                "pid": os.getpid(),
                "map": rows,
                "version": version,
                "startup": startup,
                "time": time.time(),
            },
        )


def _in_rebalance(manager: Any) -> bool:
    """Whether sglang's EPLB generator is inside ``EPLBManager.rebalance`` (suspended between its chunks):
    ``_entrypoint`` then delegates to it (``yield from self.rebalance()``)."""
    return getattr(getattr(manager, "_main_generator", None), "gi_yieldfrom", None) is not None


def plugin_chunk_s() -> dict[str, list[float]]:
    """The plugin's own timings of each chunk in this process (``engine_adapter.rebalance``: its begin
    phase, sglang's move and the synchronize, its commit phase), in seconds; empty without the plugin
    (nothing is imported here: a process whose rebalance is timed)."""
    state = sys.modules.get("engine_adapter.state")
    if state is None:
        return {}
    timings = state.get().counters.timings
    return {part: list(timings[part]) for part in ("begin_s", "move_s", "commit_s") if part in timings}


class EplbTimer:
    """Time spent in ``EPLBManager.on_forward_pass_end`` calls that ran rebalance work, per rank:
    ``rank{r}.eplb.json`` (with the plugin, this includes every begin, commit and all-gather), and how
    much of it Python's garbage collector took (a full collection of a server's heap takes hundreds of
    milliseconds on these CPUs, and lands in whichever call allocates at the wrong moment).

    A call ran rebalance work when sglang's generator was inside ``rebalance`` before it or after it (the
    call that plans and reaches the first chunk, each chunk's, the last chunk's that ends it), whatever
    its length: a chunk's move without the protocol can take under a millisecond, and a threshold on
    the time would leave such calls out of the protocol-off side only."""

    def __init__(self, out_dir: Path, chunk_s: Callable[[], dict[str, list[float]]] = plugin_chunk_s) -> None:
        self.out_dir = out_dir
        self._chunk_s = chunk_s  # each chunk's parts (the plugin's, or ChunkFloor's), written beside
        self.calls = 0
        self.rebalance_calls = 0
        self.rebalance_s = 0.0
        self.rebalance_gc_s = 0.0
        self.rebalance_full_collections = 0
        self._in_call = False
        self._call_gc_s = 0.0
        self._call_full = 0
        self._gc_started = 0.0
        gc.callbacks.append(self._collected)

    def _collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif self._in_call:
            self._call_gc_s += time.perf_counter() - self._gc_started
            self._call_full += info.get("generation") == 2

    def around(self, original: Any, manager: Any, *args: Any, **kwargs: Any) -> Any:
        was_in_rebalance = _in_rebalance(manager)
        self._in_call, self._call_gc_s, self._call_full = True, 0.0, 0
        t0 = time.perf_counter()
        try:
            return original(manager, *args, **kwargs)
        finally:
            took = time.perf_counter() - t0
            self._in_call = False
            self.calls += 1
            if was_in_rebalance or _in_rebalance(manager):
                self.rebalance_calls += 1
                self.rebalance_s += took
                self.rebalance_gc_s += self._call_gc_s
                self.rebalance_full_collections += self._call_full
                rank = _rank()
                _write_json(
                    self.out_dir / f"rank{rank}.eplb.json",
                    {
                        "rank": rank,
                        "calls": self.calls,
                        "rebalance_calls": self.rebalance_calls,
                        "rebalance_s": self.rebalance_s,
                        "rebalance_gc_s": self.rebalance_gc_s,
                        "rebalance_full_collections": self.rebalance_full_collections,
                        "chunk_s": self._chunk_s(),
                    },
                )


class ChunkFloor:
    """Each chunk of sglang's rebalance with the floor of the protocol's two phases in it (see the module
    docstring): what no check that asks every daemon before and after each chunk can do without. What
    it calls is looked up once the model is loaded, as the plugin's modules import it: nothing more runs
    per chunk than the protocol's own round trips, all-gathers and synchronize. ``chunk_s``: each chunk's
    three parts, in seconds, named as the plugin's own (``before_s`` where its begin is, ``move_s`` for
    sglang's move and the synchronize, ``after_s`` where its commit is).

    ``collectives``: 1, the protocol's shape (a round trip and an all-gather before the move, a round trip
    after it: the commit's check rides the next all-gather); 2, the shape with an all-gather after too."""

    def __init__(self, collectives: int) -> None:
        self.collectives = collectives
        self._round_trip: Any = None  # () -> the ping's reply from this rank's daemon
        self._all_gather: Any = None
        self._synchronize: Any = None
        self.chunk_s: dict[str, list[float]] = {"before_s": [], "move_s": [], "after_s": []}

    def after_load_model(self, result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
        import torch
        from sglang.srt.runtime_context import get_device

        from daemon_adapter import client
        from engine_adapter.collective import all_gather
        from engine_adapter.startup import daemon_socket_path

        path = daemon_socket_path(runner.gpu_id)
        self._round_trip = lambda: client.request(path, {"type": "ping"})
        self._all_gather = all_gather
        self._synchronize = torch.get_device_module(get_device().device).synchronize

    def around_chunk(self, original: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._round_trip is not None, "the model was not loaded through ModelRunner.load_model"
        t0 = time.perf_counter()
        self._all_gather(self._round_trip())
        t1 = time.perf_counter()
        result = original(*args, **kwargs)
        self._synchronize()
        t2 = time.perf_counter()
        reply = self._round_trip()
        if self.collectives == 2:
            self._all_gather(reply)
        t3 = time.perf_counter()
        for part, seconds in zip(self.chunk_s.values(), (t1 - t0, t2 - t1, t3 - t2), strict=True):
            part.append(seconds)
        return result


class StopAt:
    def __init__(self, point: StopPoint, out_dir: Path) -> None:
        self.point = point
        self.out_dir = out_dir
        self._seen = 0
        self._lock = threading.Lock()

    def before_request(self, msg: Any) -> None:
        if self.point.name in STOP_BEFORE and self._is_the_request(msg):
            self._count_and_maybe_stop()

    def after_reply(self, msg: Any, reply: Any) -> None:
        if self.point.name in STOP_BEFORE or not self._is_the_request(msg):
            return
        if isinstance(reply, dict) and reply.get("status") == "ok":
            self._count_and_maybe_stop()

    def _is_the_request(self, msg: Any) -> bool:
        return isinstance(msg, dict) and msg.get("type") == STOP_REQUEST[self.point.name]

    def _count_and_maybe_stop(self) -> None:
        with self._lock:
            self._seen += 1
            if self._seen != self.point.count:
                return
        rank = _rank()
        (self.out_dir / f"rank{rank}.stopped").write_text(f"{os.getpid()} {self.point.env_value()}\n")
        time.sleep(BLOCK_S)
        raise TimeoutError(f"rank {rank} stopped at {self.point.env_value()} for {BLOCK_S}s and was not killed")


_registered = False


def register_if_asked() -> None:
    """Register the probes asked for by the environment (called by the bridge's sitecustomize)."""
    global _registered
    out = os.environ.get(DIR_ENV)
    if _registered or not out:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    out_dir = Path(out)
    writer = BeliefWriter(out_dir)
    shape = os.environ.get(CHUNK_FLOOR_ENV)  # "1" or "2": the all-gathers of the floor's chunk
    floor = ChunkFloor(int(shape)) if shape in ("1", "2") else None
    if os.environ.get(EPLB_TIME_ENV) == "1":  # registered first: inside the belief hook, so it is not timed
        timer = EplbTimer(out_dir, plugin_chunk_s if floor is None else lambda: floor.chunk_s)
        HookRegistry.register(
            "sglang.srt.eplb.eplb_manager.EPLBManager.on_forward_pass_end", timer.around, HookType.AROUND
        )

    if floor is not None:
        HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.load_model", floor.after_load_model)
        HookRegistry.register(
            "sglang.srt.eplb.eplb_manager.update_expert_location_with_recovery", floor.around_chunk, HookType.AROUND
        )

    def after_write_belief(result: Any, *args: Any, **kwargs: Any) -> None:
        writer.write_if_changed()

    HookRegistry.register("sglang.srt.model_executor.model_runner.ModelRunner.load_model", after_write_belief)
    HookRegistry.register("sglang.srt.eplb.eplb_manager.EPLBManager.on_forward_pass_end", after_write_belief)
    if os.environ.get(STOP_ENV):
        stop = StopAt(StopPoint.parse(os.environ[STOP_ENV]), out_dir)

        class WatchedReply:
            """The request's ``SentRequest``, whose reply the stop sees when it is read."""

            def __init__(self, sent: Any, msg: Any) -> None:
                self._sent, self._msg = sent, msg

            def read(self) -> Any:
                reply = self._sent.read()
                stop.after_reply(self._msg, reply)
                return reply

        # Every request goes through send_request (client.request is send_request(...).read()).
        def around_send(original: Any, path: str, msg: Any, *args: Any, **kwargs: Any) -> Any:
            stop.before_request(msg)
            return WatchedReply(original(path, msg, *args, **kwargs), msg)

        HookRegistry.register("daemon_adapter.client.send_request", around_send, HookType.AROUND)
    _registered = True
