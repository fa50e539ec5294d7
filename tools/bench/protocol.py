"""``make bench`` / ``python -m tools.bench.protocol``: the protocol's costs, each against a floor.

Every figure is a ratio to a floor measured in the same run, with the absolute numbers beside it
(medians over many repetitions; the machine is shared, so medians, not means). Parts:

1. chunk: begin + commit of one chunk (one layer of a DeepSeek-V3-sized map, 61 x 288) against a
   real layout-aware daemon process, on 1 rank and on 2 ranks (gloo all-gathers, as the engine
   adapter does), with the engine adapter's own socket client (``daemon_adapter.client``) and
   the engine session every rank runs (``layout_sm.session.EngineSession``); floor: the same
   number of bare round trips (sglang's ``ping`` through the same serve loop) and bare all-gathers,
   timed in the same loop right before each chunk (the back-to-back figures are shown beside).
   Beside it, in blocks of one rebalance each, the same session with the commit's check in an
   all-gather of its own (the shape before: two all-gathers a chunk), against its own floor.
2. startup: attach + all-gather of the findings + the session's ``agree``; floor: a bare
   ``query_config`` (and a bare all-gather on 2 ranks), each sample after the same pause as a
   startup's (a detach must be noticed between two attaches; after a pause this machine is slower
   at everything, so a floor measured back to back would not be the same conditions).
3. scale: the digest of a 61 x 288 map, a full-map commit daemon-side (parse + machine + reply),
   and the commit's size on the wire.
4. fetch: ``fetch_state`` through the layout-aware handler (with the layout check) against
   sglang's own daemon (``FakeLoadedDaemon``) on the same transport backend and the same exported
   tensors; and, in the same rotation, a handler that only reads the request (one read, the
   hardening's check, unpickling, the field) and hands it to sglang's handler as the layout-aware
   daemon does: the floor of any check. The layout check's own time is taken where it runs (in
   sglang's handler, once the reply is built) and warm, back to back: the first is several times the
   second, because the reply just built has pushed the check's code and data out of the caches.
5. throughput: ``expert_layout_query`` requests per second with 16 attached engines polling
   against 1.
6. request check: the daemon's check of a request's pickle before unpickling it
   (``daemon_adapter.wire.request_pickle_problem``) on a full-map commit and on a one-layer chunk;
   floor: unpickling the same bytes.
7. metrics: the engine adapter's metrics calls per chunk (``tools.bench.metrics``), with sglang's
   metrics on, in prometheus_client's multiprocess mode; floor: the same calls with metrics off
   (each returns at once), and the share of the 2-rank chunk of part 1 they add.
8. trace: the daemon's protocol trace (``daemon_adapter.trace``) per chunk: a one-layer chunk's begin
   and commit through the daemon's machine (61 x 288), tracing on (each step a line in a file) against
   off, alternated; and the off path's own cost (the machine's test of its observer, once a step),
   as a share of the 2-rank chunk of part 1.
9. real servers (``tools.bench.real``): ``python -m sglang.launch_server`` ready time
   with and without the plugin on the same daemons, and EPLB's rebalance wall time with and
   without the protocol; a few minutes on 2 cores (``--no-real`` skips it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from tools.bench.metrics import add_chunk_share, bench_metrics
from tools.bench.two_nodes import NodePlacement, TwoNodeLink, enter
from tools.demo.results import machine

LAYERS, PHYSICAL, LOGICAL = 61, 288, 256  # DeepSeek-V3: 58 MoE layers of 61, 256 routed + 32 redundant
TARGETS = {
    "chunk_ratio_max": 2.0,
    "startup_ratio_max": 3.0,
    "fetch_overhead_max": 0.02,
    "commit_ms_max": 1.0,
    "one_layer_check_ratio_max": 3.0,
    "metrics_share_of_chunk_max": 0.01,
    # The durable copy is written off the chunk's path: a chunk with it on, to its floor, against off.
    "durable_chunk_ratio_max": 1.10,
}


def deepseek_map(layers: int = LAYERS, physical: int = PHYSICAL, logical: int = LOGICAL) -> list[list[int]]:
    """A valid map (61 x 288 by default): every logical expert placed, the redundant slots spread."""
    return [[(p + layer) % logical for p in range(physical)] for layer in range(layers)]


def _median_us(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e6, 1)


def _timeit(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


# -- 1 and 2: chunk and startup, in rank processes -------------------------------------------


def _rank_worker(
    rank: int,
    world: int,
    init: str,
    sockets: list[str],
    n: int,
    conn: Any,
    shape: tuple[int, int, int],
    placement: NodePlacement | None,
) -> None:
    """One engine rank: attach to its daemon, then time startup and chunks against their floors;
    ``placement``: its node, when the ranks are split over two."""
    if placement is not None:
        enter(placement)
    import torch.distributed as dist

    from daemon_adapter import client
    from engine_adapter.collective import all_gather_small
    from layout_sm.engine import EngineLayout
    from layout_sm.messages import request_wire
    from layout_sm.ready import ChunkAsked, Fetched, Ready, RebalanceAsked, RebalanceEnded, Started
    from layout_sm.record import layout_digest
    from layout_sm.session import EngineSession

    dist.init_process_group("gloo", init_method=init, world_size=world, rank=rank)
    path = sockets[rank]
    num_layers, num_physical, num_logical = shape
    rows = deepseek_map(*shape)
    engine = EngineLayout(num_layers, num_physical, num_logical, layout_digest(rows), True)

    def gather(obj: Any) -> list[Any]:  # as engine_adapter.startup.all_gather: one rank, no collective
        return [obj] if world == 1 else all_gather_small(obj)

    def barrier() -> None:  # lines the ranks up; one rank has none to wait for (as the adapter: no collective)
        if world > 1:
            dist.barrier()

    def collective(fn: Callable[[], Any]) -> list[float]:
        barrier()
        return _timeit(fn, n)

    ping = {"type": "ping"}
    floors = {
        "ping_s": collective(lambda: client.request(path, ping)),
        "query_config_s": collective(lambda: client.request(path, {"type": "query_config"})),
        "all_gather_s": collective(lambda: gather({"status": "ok"})) if world > 1 else [0.0],
    }

    attachments: list[Any] = []
    unread: list[Any] = []  # a commit sent and not read yet: (its reader, the session's event for its reply)

    def send(ready: Ready) -> Any:
        """A request to this rank's daemon, as the engine adapter sends it; None for a commit left unread."""
        assert ready.send is not None
        if ready.attach:
            attachments.append(client.Attachment(path, request_wire(ready.send)))
            return attachments[-1].reply
        if ready.read_later:
            unread.append((client.send_request(path, request_wire(ready.send)), ready.then))
            return None
        return client.request(path, request_wire(ready.send))

    def all_gather(part: Any) -> list[Any]:
        gathers[shape_now[0]] += 1
        return gather(part)

    def carry_out(session: EngineSession, ready: Ready) -> Ready:
        """What the session says, done as the engine adapter does (``engine_adapter.runner``): each request
        to this rank's daemon, each all-gather over the ranks, the move (the map ``rows``), a commit left
        unread; the last ``Ready`` that said how the sequence ended."""
        return _carry(session, ready, send, all_gather, lambda: rows)

    def flush(session: EngineSession) -> None:
        while unread:
            sent, then = unread.pop()
            carry_out(session, session.step(then(sent.read(), 0.0)))

    gathers = {"startup": 0, "chunk": 0, "two_collectives": 0, "rebalance_end": 0}
    shape_now = ["startup"]

    def startup() -> None:
        session = EngineSession(f"bench-{rank}", world, engine)
        carry_out(session, session.step(Started(rank, rows)))

    def startup_floor() -> None:
        client.request(path, {"type": "query_config"})
        gather({"status": "ok"})

    # Each startup follows a pause (the daemon notices the detach on its watcher thread: let it, before
    # the next attach), and so does each floor sample: after a pause this machine runs everything
    # slower (caches, clocks), so a floor taken back to back would flatter the floor, not the protocol.
    startup_s, floors["startup_floor_s"] = [], []
    for _ in range(n):
        for series, fn in ((floors["startup_floor_s"], startup_floor), (startup_s, startup)):
            time.sleep(0.002)
            barrier()
            t0 = time.perf_counter()
            fn()
            series.append(time.perf_counter() - t0)
        attachments.pop().close()

    session = EngineSession("bench-chunks", world, engine)
    agreed = carry_out(session, session.step(Started(rank, rows)))
    assert agreed.done is not None and agreed.done.reason == "initial", agreed
    session.step(Fetched(rank, {"status": "ok"}))  # the load's fetch_state is not timed here
    assert carry_out(session, session.step(RebalanceAsked(rank, source="daemon"))).done.go == "proceed"
    att = attachments.pop()
    time.sleep(0.05)

    def chunk(layer: int, shape: str) -> None:
        """One chunk as the engine adapter runs it: the last chunk's commit read, the begin, one all-gather
        (the begin replies and the last chunk's commit answers), the commit sent with no collective after
        it. ``two_collectives``: the shape before it, the commit's answers all-gathered and checked at once
        (the same steps plus that all-gather, as a rebalance's end makes it)."""
        shape_now[0] = shape
        flush(session)
        decision = carry_out(session, session.step(ChunkAsked(rank, [layer])))
        assert decision.done is not None and decision.done.go == "proceed", decision.done
        if shape == "two_collectives":
            flush(session)
            verdict = carry_out(session, session.step(RebalanceEnded(rank)))
            assert verdict.done is not None and verdict.done.go == "proceed", verdict.done

    # The floors in the same loop, right before each chunk: their round trips and all-gathers then run
    # in the state the chunks' own run in (a hot loop of pings alone is a best case). The chunk's own
    # floor is its shape without the protocol: a round trip and an all-gather before the move, a round
    # trip after it; the shape before it had an all-gather after too. Both shapes run in blocks, each
    # ending as a rebalance does (the new shape's last chunk's check: one more all-gather, timed apart).
    chunk_s, two_s, end_s, floors["chunk_floor_s"], floors["two_floor_s"] = [], [], [], [], []
    block = 8  # chunks of one shape in a row: one rebalance
    for b in range(2 * -(-n // block)):
        shape, series, floor = (
            ("chunk", chunk_s, floors["chunk_floor_s"])
            if b % 2 == 0
            else ("two_collectives", two_s, floors["two_floor_s"])
        )
        for i in range(block):
            layer = (b * block + i) % num_layers
            # A move: the row rotates, in a new map (sglang's tolist hands the session a fresh one each chunk).
            rows = [*rows[:layer], rows[layer][1:] + rows[layer][:1], *rows[layer + 1 :]]
            barrier()
            t0 = time.perf_counter()
            gather(client.request(path, ping))
            client.request(path, ping)
            if shape == "two_collectives":
                gather({"status": "ok"})
            floor.append(time.perf_counter() - t0)
            barrier()
            t0 = time.perf_counter()
            chunk(layer, shape)
            series.append(time.perf_counter() - t0)
        if shape == "chunk":  # the rebalance ends: the last chunk's check, one all-gather
            barrier()
            shape_now[0] = "rebalance_end"
            t0 = time.perf_counter()
            flush(session)
            assert carry_out(session, session.step(RebalanceEnded(rank))).done.go == "proceed"
            end_s.append(time.perf_counter() - t0)
    att.close()
    conn.send(
        {
            "floors": floors,
            "startup_s": startup_s,
            "chunk_s": chunk_s,
            "two_s": two_s,
            "end_s": end_s,
            "gathers": gathers,
        }
    )
    dist.destroy_process_group()


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bench_ranks(
    world: int,
    workdir: str,
    n: int,
    shape: tuple[int, int, int] = (LAYERS, PHYSICAL, LOGICAL),
    link: TwoNodeLink | None = None,
    durable: bool = False,
) -> dict[str, Any]:
    """Chunk and startup on ``world`` ranks, each with its own daemon process, for a map of ``shape``
    (layers, physical, logical), against the floors measured in the same processes; with ``link``,
    the first half of the ranks on node 0 and the rest on node 1 (each rank beside its own daemon);
    ``durable``: the daemons keep their durable copies (``daemon_adapter.durable``)."""
    from tools.harness.daemon_proc import start_daemon

    if link is not None and world % 2:
        raise ValueError(f"{world} ranks do not split over two nodes")
    placements = [link.placement(0 if r < world // 2 else 1) if link else None for r in range(world)]
    tag = f"{world}-{shape[0]}x{shape[1]}{'-2nodes' if link else ''}{'-durable' if durable else ''}"
    daemons = [
        start_daemon(
            os.path.join(workdir, f"chunk{tag}-{r}.sock"),
            physical_to_logical_map=deepseek_map(*shape),
            num_logical=shape[2],
            log_path=os.path.join(workdir, f"chunk{tag}-{r}.log"),
            durable=durable,
        )
        for r in range(world)
    ]
    ctx = mp.get_context("spawn")
    host = link.addresses()[0] if link else "127.0.0.1"
    init = f"tcp://{host}:{_free_port(host)}"
    pipes, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=_rank_worker,
            args=(rank, world, init, [d.socket_path for d in daemons], n, child, shape, placements[rank]),
        )
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    out = []
    for rank, (pipe, proc) in enumerate(zip(pipes, procs, strict=True)):
        while not pipe.poll(0.5):
            if not proc.is_alive():  # a worker that died never answers: fail instead of waiting
                for other in procs:
                    other.kill()
                raise RuntimeError(f"bench rank {rank} exited with code {proc.exitcode}")
        out.append(pipe.recv())
    for proc in procs:
        proc.join(30)
    for d in daemons:
        d.stop()

    # The slowest rank decides a collective step: take rank-wise maxima per repetition.
    def worst(key: str, sub: str | None = None) -> list[float]:
        series = [o[key][sub] if sub else o[key] for o in out]
        return [max(vals) for vals in zip(*series, strict=True)]

    ping, allg = _median_us(worst("floors", "ping_s")), _median_us(worst("floors", "all_gather_s"))
    query_config = _median_us(worst("floors", "query_config_s"))
    chunk, startup = _median_us(worst("chunk_s")), _median_us(worst("startup_s"))
    chunk_floor = _median_us(worst("floors", "chunk_floor_s"))  # 2 pings + 1 all-gather, beside each chunk
    two, two_floor = _median_us(worst("two_s")), _median_us(worst("floors", "two_floor_s"))  # the shape before
    startup_floor = _median_us(worst("floors", "startup_floor_s"))  # query_config + all-gather, after a pause
    chunks = len(out[0]["chunk_s"])
    return {
        "ranks": world,
        "nodes": 2 if link else 1,
        "map": f"{shape[0]}x{shape[1]}",
        "chunk_us": chunk,
        "chunk_floor_us": round(chunk_floor, 1),
        "chunk_ratio": round(chunk / chunk_floor, 2),
        "chunk_own_us": round(chunk - chunk_floor, 1),
        "all_gathers_per_chunk": round(out[0]["gathers"]["chunk"] / chunks, 3),
        "all_gathers_per_rebalance_end": round(out[0]["gathers"]["rebalance_end"] / len(out[0]["end_s"]), 3),
        "rebalance_end_us": _median_us(worst("end_s")),
        "two_collectives_us": two,
        "two_collectives_floor_us": round(two_floor, 1),
        "two_collectives_ratio": round(two / two_floor, 2),
        "two_collectives_own_us": round(two - two_floor, 1),
        "two_collectives_all_gathers_per_chunk": round(out[0]["gathers"]["two_collectives"] / len(out[0]["two_s"]), 3),
        "ping_us": ping,
        "all_gather_us": allg,
        "startup_us": startup,
        "query_config_us": query_config,
        "startup_floor_us": round(startup_floor, 1),
        "startup_ratio": round(startup / startup_floor, 2),
        "repetitions": n,
    }


# -- 3: digest and commit at DeepSeek scale -----------------------------------------------------


def bench_scale(n: int) -> dict[str, Any]:
    from layout_sm.daemon import DaemonMachine
    from layout_sm.messages import begin_request, commit_request, parse_request
    from layout_sm.reasons import Reply
    from layout_sm.record import LayoutRecord, layout_digest

    rows = deepseek_map()
    digest_s = _timeit(lambda: layout_digest(rows), n)
    machine = DaemonMachine(LayoutRecord.initial(rows, LOGICAL))
    session = "s" * 32
    attach = parse_request({"type": "expert_layout_attach", "engine_id": "bench"})
    assert not isinstance(attach, Reply)
    machine.handle(attach, session=session)
    layers = list(range(LAYERS))
    commit_s: list[float] = []
    for version in range(n):
        new_rows = [[(p + layer + version + 1) % LOGICAL for p in range(PHYSICAL)] for layer in range(LAYERS)]
        begin = parse_request(begin_request("bench", session, version, layers))
        assert not isinstance(begin, Reply)
        assert machine.handle(begin).reply.ok
        wire = pickle.loads(pickle.dumps(commit_request("bench", session, layers, new_rows)))  # as received
        t0 = time.perf_counter()
        parsed = parse_request(wire)  # daemon-side: validate, then the machine, then the reply dict
        assert not isinstance(parsed, Reply)
        reply = machine.handle(parsed).reply
        reply.to_wire()
        commit_s.append(time.perf_counter() - t0)
        assert reply.ok, reply.message
    wire_bytes = 4 + len(pickle.dumps(commit_request("bench", session, layers, rows), protocol=pickle.HIGHEST_PROTOCOL))
    # Floor for the commit: unpickling the same message (what any request of this size costs).
    blob = pickle.dumps(commit_request("bench", session, layers, rows), protocol=pickle.HIGHEST_PROTOCOL)
    unpickle_s = _timeit(lambda: pickle.loads(blob), n)
    commit_us, unpickle_us = _median_us(commit_s), _median_us(unpickle_s)
    return {
        "map": f"{LAYERS}x{PHYSICAL}",
        "digest_us": _median_us(digest_s),
        "commit_full_map_daemon_us": commit_us,
        "commit_floor_unpickle_us": unpickle_us,
        "commit_ratio_to_unpickle": round(commit_us / unpickle_us, 2),
        "commit_wire_bytes": wire_bytes,
        "repetitions": n,
    }


def bench_machine_start(n: int) -> dict[str, Any]:
    """A daemon's layout machine at its start: one machine, made while the weights load and loaded with the
    record (the runner's table read once per class), against the shape before, in the same run: two
    machines, each built by python-statemachine's own ``__init__`` (its callbacks registered per instance),
    the first without a record, the second with it."""
    from layout_sm.daemon import DaemonMachine
    from layout_sm.record import LayoutRecord
    from tools.mirror.reference import ReferenceDaemonMachine

    record = LayoutRecord.initial(deepseek_map(), LOGICAL)

    def one_machine() -> None:
        machine = DaemonMachine(loaded=False)
        machine.load_weights(record)

    def two_machines() -> None:
        ReferenceDaemonMachine(None)
        ReferenceDaemonMachine(record)

    samples: dict[str, list[float]] = {"one": [], "two": []}
    for i in range(n):  # alternated, so that drift on the machine falls on both alike
        for side, fn in (
            (("one", one_machine), ("two", two_machines)) if i % 2 else (("two", two_machines), ("one", one_machine))
        ):
            t0 = time.perf_counter()
            fn()
            samples[side].append(time.perf_counter() - t0)
    one_us, two_us = _median_us(samples["one"]), _median_us(samples["two"])
    return {"one_machine_us": one_us, "two_machines_us": two_us, "ratio": round(one_us / two_us, 3), "repetitions": n}


def bench_trace(n: int, workdir: str) -> dict[str, Any]:
    """A one-layer chunk (begin + commit) through the daemon's machine, tracing off and on, alternated."""
    from pathlib import Path

    from daemon_adapter.trace import DaemonTrace
    from layout_sm.daemon import DaemonMachine
    from layout_sm.messages import begin_request, commit_request, parse_request
    from layout_sm.record import LayoutRecord

    rows = deepseek_map()
    session = "s" * 32
    trace = DaemonTrace(Path(workdir) / "traces", "bench")
    machines = {
        "off": DaemonMachine(LayoutRecord.initial(rows, LOGICAL)),
        "on": DaemonMachine(LayoutRecord.initial(rows, LOGICAL)),
    }
    machines["on"].observer = trace.step
    for each in machines.values():
        each.handle(parse_request({"type": "expert_layout_attach", "engine_id": "bench"}), session=session)  # type: ignore[arg-type]
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for version in range(n):
        layer = version % LAYERS
        new_row = [[(p + layer + version + 1) % LOGICAL for p in range(PHYSICAL)]]
        begin = parse_request(begin_request("bench", session, version, [layer]))
        commit = parse_request(commit_request("bench", session, [layer], new_row))
        for side in ("off", "on") if version % 2 else ("on", "off"):
            t0 = time.perf_counter()
            assert machines[side].handle(begin).reply.ok  # type: ignore[arg-type]
            assert machines[side].handle(commit).reply.ok  # type: ignore[arg-type]
            samples[side].append(time.perf_counter() - t0)
    off = machines["off"]
    check_s = _timeit(lambda: off.observer is not None, n)  # what the off path adds, once a step
    return {
        **_on_against_off(samples),
        "off_check_ns_per_chunk": round(2 * 1e9 * statistics.median(check_s), 1),
        "trace_bytes_per_chunk": round(trace.path.stat().st_size / (2 * n + 1)) * 2,
        **bench_engine_trace(n, Path(workdir) / "traces"),
        "repetitions": n,
    }


def _on_against_off(samples: dict[str, list[float]], prefix: str = "") -> dict[str, float]:
    """A chunk's median with tracing off and on, what tracing adds, and the ratio."""
    off_us, on_us = _median_us(samples["off"]), _median_us(samples["on"])
    return {
        f"{prefix}chunk_off_us": off_us,
        f"{prefix}chunk_on_us": on_us,
        f"{prefix}tracing_us_per_chunk": round(on_us - off_us, 2),
        f"{prefix}ratio_on_to_off": round(on_us / off_us, 2),
    }


def _carry(session: Any, ready: Any, send: Any, gather: Any, rows: Any) -> Any:
    """One rank's ``Ready``s carried out as the engine adapter's loop does (``engine_adapter.runner``):
    ``send(ready)`` gives the reply (None: read later), ``gather(part)`` the all-gathered list, ``rows()``
    the map sglang moved to; the last ``Ready`` that said how the sequence ended."""
    from layout_sm.ready import NOTHING

    ended = NOTHING
    while True:
        if ready.done is not None:
            ended = ready
        if ready.send is not None:
            reply = send(ready)
            event = ready.then(reply, 0.0) if ready.then and not (ready.read_later and reply is None) else None
        elif ready.gathers:
            event = ready.then(gather(ready.gather), 0.0)
        elif ready.move:
            event = ready.then(rows(), 0.0)
        else:
            event = None
        event = event or ready.next
        if event is None:
            return ended
        ready = session.step(event)


def _carry_in_process(session: Any, daemon: Any, ready: Any, rows: Any) -> Any:
    """``_carry`` against a daemon machine in this process (its only rank: a gather is its own part)."""
    from layout_sm.messages import AttachRequest

    def send(ready: Any) -> Any:
        attach = isinstance(ready.send, AttachRequest)
        return daemon.handle(ready.send, session="s" * 32 if attach else None).reply.to_wire()

    return _carry(session, ready, send, lambda part: [part], lambda: rows)


def bench_engine_trace(n: int, folder: Any) -> dict[str, Any]:
    """A one-layer chunk through one rank's ``EngineSession`` (a daemon machine in this process answers),
    tracing off and on, alternated: what an engine rank's trace adds to a chunk."""
    from engine_adapter.trace import EngineTrace
    from layout_sm.daemon import DaemonMachine
    from layout_sm.engine import EngineLayout
    from layout_sm.ready import ChunkAsked, Fetched, RebalanceAsked, Started
    from layout_sm.record import LayoutRecord, layout_digest
    from layout_sm.session import EngineSession

    rows = deepseek_map()
    layout = EngineLayout(LAYERS, PHYSICAL, LOGICAL, layout_digest(rows), True)
    trace = EngineTrace(folder, "bench", 0)
    sessions, daemons = {}, {}
    for side in ("off", "on"):
        session = EngineSession(f"bench-{side}", 1, layout)
        daemons[side] = daemon = DaemonMachine(LayoutRecord.initial(rows, LOGICAL))  # answers, in this process
        _carry_in_process(session, daemon, session.step(Started(0, rows)), rows)
        session.step(Fetched(0, {"status": "ok"}))
        _carry_in_process(session, daemon, session.step(RebalanceAsked(0, source="daemon")), rows)
        sessions[side] = session
    trace.start(sessions["on"], 0, "bench.sock", False, rows)
    sessions["on"].observers.append(trace.step)
    size_before = trace.path.stat().st_size
    samples: dict[str, list[float]] = {"off": [], "on": []}
    routed = [list(row) for row in rows]
    for version in range(n):
        layer = version % LAYERS
        # The map sglang routes with after the chunk's move, a new one each chunk, as its tolist gives it.
        routed = [*routed[:layer], routed[layer][1:] + routed[layer][:1], *routed[layer + 1 :]]
        for side in ("off", "on") if version % 2 else ("on", "off"):
            session, daemon = sessions[side], daemons[side]
            t0 = time.perf_counter()
            decision = _carry_in_process(session, daemon, session.step(ChunkAsked(0, [layer])), rows)
            assert decision.done is not None and decision.done.go == "proceed", decision.done
            if side == "on":
                trace.routes(routed)  # the runner's line after each move
            samples[side].append(time.perf_counter() - t0)
    return {
        **_on_against_off(samples, "engine_"),
        "engine_trace_bytes_per_chunk": round((trace.path.stat().st_size - size_before) / n),
    }


# -- 4: fetch_state with and without the layout check, same daemon object -----------------------


def bench_fetch(n: int, num_tensors: int = 1000) -> dict[str, Any]:
    import torch
    from sglang.srt.weight_cache.transport import TorchIpcTransportBackend

    from daemon_adapter.daemon import _ReadConnection, _RequestFrame, _take_buffered
    from layout_sm.messages import FETCH_FIELD, AttachRequest, fetch_layout_field, parse_fetch_field
    from layout_sm.record import layout_digest
    from tools.harness.daemon_proc import default_cache_config, recv_frame, send_frame
    from tools.harness.loaded_daemon import FakeLoadedDaemon, FakeLoadedLayoutAwareDaemon

    torch.multiprocessing.set_sharing_strategy("file_system")
    rows = deepseek_map()
    tensors = {f"model.layers.{i // 16}.t{i}": torch.zeros(8) for i in range(num_tensors)}
    config = default_cache_config()
    backend = TorchIpcTransportBackend()
    daemon = FakeLoadedLayoutAwareDaemon(socket_path="", config=config, tensors=tensors, transport_backend=backend)
    # sglang's own daemon on the same backend and the same exported entries: the baseline.
    sglang_own = FakeLoadedDaemon(socket_path="", config=config, transport_backend=backend)
    sglang_own.state_entries = daemon.state_entries
    daemon.set_initial_layout(rows, LOGICAL)
    machine, _ = daemon._machine()
    machine.handle(AttachRequest("bench"), session="s" * 32)
    field = fetch_layout_field("bench", "s" * 32, 0, layout_digest(rows))
    with_check = {"type": "fetch_state", "config": config, "expert_layout": field}
    plain = {"type": "fetch_state", "config": config}
    # The layout check alone, where it runs: in sglang's handler, right after the handler built its reply
    # (the caches then hold that reply, not the daemon's layout code), and warm, back to back. The timer
    # wraps the gate's call to the check (two clock reads, in the layout side's time).
    gate = daemon._layout_gate
    assert gate is not None
    check, check_in_situ_s = gate._check, []

    def timed_check(*args: Any) -> Any:
        t0 = time.perf_counter()
        verdict = check(*args)
        check_in_situ_s.append(time.perf_counter() - t0)
        return verdict

    gate._check = timed_check
    claim = parse_fetch_field(field)
    assert check(claim, None).ok
    check_warm_s = _timeit(lambda: check(claim, None), n)
    client, server = socket.socketpair()
    replies: list[Any] = []
    got = threading.Event()

    def reader() -> None:
        while True:
            try:
                replies.append(recv_frame(client))
            except (ConnectionError, OSError):
                return
            got.set()

    threading.Thread(target=reader, daemon=True).start()

    def one(handler: Callable[[socket.socket], None], msg: dict[str, Any]) -> float:
        got.clear()
        t0 = time.perf_counter()
        send_frame(client, msg)
        # As sglang's serve loop does before each handler (the layout-aware handler serves a dup
        # of the connection in a thread, which sets the shared descriptor non-blocking).
        server.settimeout(30.0)
        handler(server)
        got.wait()
        return time.perf_counter() - t0

    def read_only(conn: socket.socket) -> None:
        """What any layout check must do before sglang's handler runs, and no more: read the frame, check
        and unpickle it under the hardening's bounds, read the field; then sglang's handler, ungated, on
        the request read (as the daemon hands it over)."""
        taken = _take_buffered(conn)
        frame = _RequestFrame.of_taken(taken) if taken is not None else None
        assert frame is not None and frame.problem is None and isinstance(frame.request, dict)
        assert FETCH_FIELD in frame.request
        conn.settimeout(30.0)
        sglang_own._handle_connection(_ReadConnection(conn, frame.request, frame.raw))  # type: ignore[arg-type]

    layout_s, plain_s, floor_s = [], [], []
    sides = [
        (layout_s, daemon._handle_connection, with_check),
        (plain_s, sglang_own._handle_connection, plain),
        (floor_s, read_only, with_check),
    ]
    for i in range(n):  # each side first, second and third in turn, so drift and order hit all alike
        for series, handler, msg in sides[i % 3 :] + sides[: i % 3]:
            series.append(one(handler, msg))
    assert all(reply["status"] == "ok" for reply in replies[:3])
    assert len(replies[0]["entries"]) == num_tensors
    assert len(check_in_situ_s) == n, "every fetch through the layout-aware handler runs the check once"
    client.close()
    server.close()
    layout_us, plain_us = _median_us(layout_s), _median_us(plain_s)
    # The overhead is the median of the pairs' ratios: two requests back to back see the same machine,
    # which on a shared VM moves by more than the few percent measured here from one second to the next.
    paired = statistics.median(a / b for a, b in zip(layout_s, plain_s, strict=True))
    floor_paired = statistics.median(a / b for a, b in zip(floor_s, plain_s, strict=True))
    return {
        "tensors": num_tensors,
        "fetch_with_layout_check_us": layout_us,
        "fetch_plain_sglang_us": plain_us,
        "overhead": round(paired - 1, 4),
        "overhead_of_medians": round(layout_us / plain_us - 1, 4),
        # Reading the request alone, as the hardening requires before any decision: the floor of any check.
        "fetch_reading_the_request_us": _median_us(floor_s),
        "reading_overhead": round(floor_paired - 1, 4),
        "check_in_situ_us": _median_us(check_in_situ_s),
        "check_warm_us": _median_us(check_warm_s),
        "repetitions": n,
    }


# -- 5: throughput with 16 attached engines polling query ---------------------------------------


def _poller(path: str, engine_id: str, ready: Any, go: Any, seconds: float, out: Any) -> None:
    from layout_sm.messages import query_request
    from tools.harness.daemon_proc import attach, request

    conn, reply = attach(path, engine_id)
    assert reply["status"] == "ok", reply
    ready.put(engine_id)
    go.wait()
    count, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        request(path, query_request())
        count += 1
    out.put(count)
    conn.close()


def bench_throughput(workdir: str, seconds: float) -> dict[str, Any]:
    from tools.harness.daemon_proc import start_daemon

    daemon = start_daemon(
        os.path.join(workdir, "tput.sock"),
        physical_to_logical_map=deepseek_map(),
        num_logical=LOGICAL,
        log_path=os.path.join(workdir, "tput.log"),
    )
    ctx = mp.get_context("spawn")
    result = {}
    for clients in (1, 16):
        ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
        procs = [
            ctx.Process(target=_poller, args=(daemon.socket_path, f"poller-{i}", ready, go, seconds, out))
            for i in range(clients)
        ]
        for p in procs:
            p.start()
        for _ in procs:  # every engine attached (and its watcher thread running) before polling starts
            ready.get(timeout=120)
        go.set()
        counts = [out.get(timeout=60 + seconds) for _ in procs]
        for p in procs:
            p.join(10)
        result[clients] = sum(counts) / seconds
    daemon.stop()
    return {
        "queries_per_s_1_engine": round(result[1]),
        "queries_per_s_16_engines": round(result[16]),
        "ratio_16_to_1": round(result[16] / result[1], 2),
        "seconds_each": seconds,
    }


# -- 6: the request check before unpickling ------------------------------------------------------


def bench_request_check(n: int) -> dict[str, Any]:
    """The daemon's check of a request's pickle before it is unpickled (``daemon_adapter.wire``: one
    compiled pattern), against unpickling it, and against the same check read opcode by opcode
    (``pickletools``, the pattern's reference): whether the pattern is needed."""
    from daemon_adapter.wire import opcode_problem, request_pickle_problem
    from layout_sm.messages import commit_request

    rows = deepseek_map()
    out: dict[str, Any] = {"repetitions": n}
    for name, layers in (("full_map", list(range(LAYERS))), ("one_layer", [0])):
        blob = pickle.dumps(commit_request("bench", "s" * 32, layers, [rows[i] for i in layers]), protocol=5)
        assert request_pickle_problem(blob) is None and opcode_problem(blob) is None
        check_us = _median_us(_timeit(lambda blob=blob: request_pickle_problem(blob), n))
        unpickle_us = _median_us(_timeit(lambda blob=blob: pickle.loads(blob), n))
        opcodes_us = _median_us(_timeit(lambda blob=blob: opcode_problem(blob), n))
        out[f"{name}_check_us"], out[f"{name}_unpickle_us"] = check_us, unpickle_us
        out[f"{name}_ratio"] = round(check_us / unpickle_us, 1)
        out[f"{name}_opcodes_us"], out[f"{name}_opcodes_ratio"] = opcodes_us, round(opcodes_us / unpickle_us, 1)
    return out


# -- report ------------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    r1, r2, sc, fe, tp = data["chunk_1_rank"], data["chunk_2_ranks"], data["scale"], data["fetch"], data["throughput"]
    ms = data["machine_start"]
    t = data["targets"]

    def yes(ok: bool) -> str:
        return "met" if ok else "**missed**"

    lines = [
        "# Expert-layout protocol: bench",
        "",
        "Medians; every figure beside the floor measured in the same run. Daemons are real processes",
        "(tools.harness.daemon_proc), clients use the engine adapter's socket client and layout_sm.",
        "",
        "| what | measured | floor | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    durable = data.get("durable")
    if durable:
        lines.append(
            f"| begin+commit per chunk, 2 ranks, with the daemons' durable copies on (each commit written to a "
            f"file off the chunk's path) | {durable['chunk_on_us']} µs ({durable['chunk_on_ratio_to_floor']}x its "
            f"floor) | {durable['chunk_off_us']} µs with them off ({durable['chunk_off_ratio_to_floor']}x its "
            f"floor) | {durable['ratio']}x (ratio to floor, on against off) | ≤{t['durable_chunk_ratio_max']}x: "
            f"{yes(durable['ratio'] <= t['durable_chunk_ratio_max'])} |"
        )
    for r in (r1, r2):
        lines.append(
            f"| begin+commit per chunk, {r['ranks']} rank(s), 1 layer of 61x288 | {r['chunk_us']} µs | "
            f"{r['chunk_floor_us']} µs (2 pings + 1 all-gather, beside each chunk; back to back a ping "
            f"{r['ping_us']} µs, an all-gather {r['all_gather_us']} µs) | "
            f"{r['chunk_ratio']}x | ≤{t['chunk_ratio_max']}x: {yes(r['chunk_ratio'] <= t['chunk_ratio_max'])} |"
        )
        lines.append(
            f"| the same chunk with the commit's check in an all-gather of its own (the shape before: "
            f"{r['two_collectives_all_gathers_per_chunk']} all-gathers a chunk against "
            f"{r['all_gathers_per_chunk']}, +{r['all_gathers_per_rebalance_end']} at a rebalance's end, "
            f"{r['rebalance_end_us']} µs), {r['ranks']} rank(s) | {r['two_collectives_us']} µs | "
            f"{r['two_collectives_floor_us']} µs (2 pings + 2 all-gathers) | {r['two_collectives_ratio']}x; "
            f"own time {r['two_collectives_own_us']} µs against {r['chunk_own_us']} µs | the one-collective "
            f"chunk's own time no larger: {yes(r['chunk_own_us'] <= r['two_collectives_own_us'])} |"
        )
    for r in (r1, r2):
        lines.append(
            f"| startup (attach + agreement), {r['ranks']} rank(s) | {r['startup_us']} µs | "
            f"{r['startup_floor_us']} µs (query_config + all-gather, each after the same pause; back to back "
            f"query_config {r['query_config_us']} µs) | "
            f"{r['startup_ratio']}x | ≤{t['startup_ratio_max']}x: {yes(r['startup_ratio'] <= t['startup_ratio_max'])} |"
        )
    lines += [
        f"| digest of a 61x288 map | {sc['digest_us']} µs | | | |",
        f"| full-map commit, daemon side (parse + machine + reply) | {sc['commit_full_map_daemon_us']} µs | "
        f"{sc['commit_floor_unpickle_us']} µs (unpickling the message) | {sc['commit_ratio_to_unpickle']}x | "
        f"< {t['commit_ms_max']} ms: {yes(sc['commit_full_map_daemon_us'] < 1000 * t['commit_ms_max'])} |",
        f"| full-map commit on the wire | {sc['commit_wire_bytes']} bytes | | | |",
        f"| a daemon's layout machine at its start (made while the weights load, loaded with the 61x288 record) | "
        f"{ms['one_machine_us']} µs | {ms['two_machines_us']} µs (two machines by python-statemachine's own "
        f"`__init__`: the shape before) | {ms['ratio']}x | no slower: {yes(ms['ratio'] <= 1.0)} |",
        f"| fetch_state with the layout check, {fe['tensors']} tensors | {fe['fetch_with_layout_check_us']} µs | "
        f"{fe['fetch_plain_sglang_us']} µs (sglang's own handler, same daemon) | overhead "
        f"{100 * fe['overhead']:.2f}% | ≤{100 * t['fetch_overhead_max']:.0f}%: "
        f"{yes(fe['overhead'] <= t['fetch_overhead_max'])} |",
        f"| fetch_state reading the request only (one read, the hardening's check, unpickling, the field; "
        f"sglang's handler gets the request read: what any check does before deciding) | "
        f"{fe['fetch_reading_the_request_us']} µs | "
        f"{fe['fetch_plain_sglang_us']} µs (sglang's own handler) | overhead {100 * fe['reading_overhead']:.2f}% | "
        f"none: the floor of any check |",
        f"| the layout check alone (`DaemonMachine.fetch_check`), timed where it runs: in sglang's handler, "
        f"right after the reply is built | {fe['check_in_situ_us']} µs | {fe['check_warm_us']} µs (the same "
        f"check warm, back to back) | {fe['check_in_situ_us'] / fe['check_warm_us']:.1f}x; "
        f"{100 * fe['check_in_situ_us'] / fe['fetch_plain_sglang_us']:.2f}% of sglang's fetch | "
        f"none: where the overhead goes |",
        f"| query throughput, 16 attached engines polling | {tp['queries_per_s_16_engines']} /s | "
        f"{tp['queries_per_s_1_engine']} /s (1 engine) | {tp['ratio_16_to_1']}x | none |",
    ]
    if "request_check" in data:
        rc = data["request_check"]

        def target(key: str, ratio: float) -> str:
            if key != "one_layer":
                return "none"
            return f"≤{t['one_layer_check_ratio_max']}x: {yes(ratio <= t['one_layer_check_ratio_max'])}"

        lines += [
            f"| request check before unpickling, {what} commit (one compiled pattern) | {rc[f'{key}_check_us']} µs | "
            f"{rc[f'{key}_unpickle_us']} µs (unpickling it) | {rc[f'{key}_ratio']}x; read opcode by opcode "
            f"(pickletools, the pattern's reference): {rc[f'{key}_opcodes_us']} µs, {rc[f'{key}_opcodes_ratio']}x | "
            f"{target(key, rc[f'{key}_ratio'])} |"
            for key, what in (("full_map", "full-map (61x288)"), ("one_layer", "one-layer"))
        ]
    if "metrics" in data:
        me = data["metrics"]
        lines.append(
            f"| the engine adapter's metrics calls per chunk (one `protocol_time`, and the session telling "
            f"`metrics.ChunkWatch` of each of the chunk's events), "
            f"sglang's metrics on, multiprocess mode | {me['on_ns']} ns | {me['off_ns']} ns (metrics off: each "
            f"call returns at once) | {me['ratio_on_to_off']}x; {100 * me['share_of_chunk']:.3f}% of a 2-rank "
            f"chunk ({me['chunk_us']} µs) | ≤{100 * t['metrics_share_of_chunk_max']:.0f}% of a chunk: "
            f"{yes(me['share_of_chunk'] <= t['metrics_share_of_chunk_max'])} |"
        )
    if "trace" in data:
        tr = data["trace"]
        lines.append(
            f"| the daemon's protocol trace per one-layer chunk (begin + commit through its machine, 61x288; "
            f"about {tr['trace_bytes_per_chunk']} bytes written) | {tr['chunk_on_us']} µs on | "
            f"{tr['chunk_off_us']} µs off | {tr['ratio_on_to_off']}x: +{tr['tracing_us_per_chunk']} µs a chunk, on; "
            f"off, the machine's test of its observer: {tr['off_check_ns_per_chunk']} ns a chunk, "
            f"{100 * tr['off_check_share_of_chunk']:.4f}% of a 2-rank chunk | reported |"
        )
        if "engine_chunk_on_us" in tr:
            lines.append(
                f"| an engine rank's protocol trace per one-layer chunk (its session's six events and the digest of "
                f"sglang's map after the move, a daemon machine "
                f"answering in-process, 61x288; "
                f"about {tr['engine_trace_bytes_per_chunk']} bytes written, the chunk's rows once) | "
                f"{tr['engine_chunk_on_us']} µs on | {tr['engine_chunk_off_us']} µs off | "
                f"{tr['engine_ratio_on_to_off']}x: +{tr['engine_tracing_us_per_chunk']} µs a chunk, on; off, one "
                f"test of the observer a step | reported |"
            )
    if data.get("real_servers"):
        from tools.bench.real import markdown_rows

        lines += markdown_rows(data["real_servers"])
    if data.get("scaling"):
        from tools.bench import scaling

        lines += [
            "",
            "Growth with ranks (61x288 map; one node, and two nodes joined by a veth link) and with the map "
            "(2 ranks); `scaling.png`:",
            "",
        ]
        lines += scaling.markdown_rows(data["scaling"])
    lines += [
        "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.protocol", description=__doc__)
    parser.add_argument("--out", default="bench-results")
    parser.add_argument("-n", type=int, default=200, help="repetitions per figure")
    parser.add_argument("--seconds", type=float, default=2.0, help="throughput window per client count")
    parser.add_argument("--no-real", action="store_true", help="skip the real-server part (a few minutes)")
    parser.add_argument("--real-repeats", type=int, default=3, help="real servers per side, alternated, per figure")
    parser.add_argument("--real-rebalances", type=int, default=8, help="rebalances timed per server")
    parser.add_argument("--no-scaling", action="store_true", help="skip the growth with ranks and map size")
    parser.add_argument("--only-scaling", action="store_true", help="the growth with ranks and map size alone")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="expert-layout-bench-")
    t0 = time.monotonic()

    def step(msg: str) -> None:
        print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)

    if args.only_scaling:
        from tools.bench.scaling import bench_scaling, markdown_rows, plot

        data = bench_scaling(bench_ranks, workdir, args.n, step)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "scaling.json"), "w") as f:
            json.dump(data, f, indent=2)
        plot(data, os.path.join(args.out, "scaling.png"))
        print("\n".join(markdown_rows(data)))
        return 0
    step("scale: digest and full-map commit at DeepSeek-V3 scale (61 x 288)")
    scale = bench_scale(args.n)
    step(f"  {scale}")
    step("machine start: a daemon's one layout machine against two by python-statemachine's own __init__")
    machine_start = bench_machine_start(args.n)
    step(f"  {machine_start}")
    step("chunk + startup on 1 rank (a daemon process, the engine adapter's client)")
    one = bench_ranks(1, workdir, args.n)
    step(f"  {one}")
    step("chunk + startup on 2 ranks (2 daemons, 2 rank processes over gloo)")
    two = bench_ranks(2, workdir, args.n)
    step(f"  {two}")
    step("durable copy: chunk + startup on 2 ranks with the daemons' durable copies on")
    durable = bench_ranks(2, workdir, args.n, durable=True)
    durable_against_off = {
        "chunk_on_us": durable["chunk_us"],
        "chunk_off_us": two["chunk_us"],
        "chunk_on_ratio_to_floor": durable["chunk_ratio"],
        "chunk_off_ratio_to_floor": two["chunk_ratio"],
        "ratio": round(durable["chunk_ratio"] / two["chunk_ratio"], 3),
    }
    step(f"  {durable_against_off}")
    step("metrics: the engine adapter's metrics calls per chunk, on against off (a fresh interpreter)")
    metrics = bench_metrics(workdir)
    add_chunk_share(metrics, two["chunk_us"])
    step(f"  {metrics}")
    step("fetch_state: layout-aware handler vs sglang's own, same daemon object")
    fetch = bench_fetch(args.n)
    step(f"  {fetch}")
    step("throughput: query with 1 and with 16 attached engines polling")
    tput = bench_throughput(workdir, args.seconds)
    step(f"  {tput}")
    step("request check: the daemon's pickle check before unpickling, against unpickling")
    request_check = bench_request_check(args.n)
    step(f"  {request_check}")
    step("trace: a chunk through the daemon's machine with its protocol trace on against off")
    trace = bench_trace(args.n, workdir)
    trace["off_check_share_of_chunk"] = round(trace["off_check_ns_per_chunk"] / (1000 * two["chunk_us"]), 6)
    step(f"  {trace}")
    scaling = None
    if not args.no_scaling:
        from tools.bench.scaling import bench_scaling, plot

        step("scaling: chunk and startup against the number of ranks (1-16) and the map size (2 ranks)")
        scaling = bench_scaling(bench_ranks, workdir, max(20, args.n // 4), step)
    real = None
    if not args.no_real:
        from tools.bench.real import bench_real_servers, floor_bound

        real = bench_real_servers(workdir, args.real_repeats, args.real_rebalances, step)
        floor_bound(real["rebalance"], two["chunk_floor_us"])
        step(f"  {real['ready']}")
        step(f"  {real['rebalance']}")
    data = {
        "chunk_1_rank": one,
        "chunk_2_ranks": two,
        "scale": scale,
        "machine_start": machine_start,
        "fetch": fetch,
        "throughput": tput,
        "request_check": request_check,
        "metrics": metrics,
        "trace": trace,
        "durable": durable_against_off,
        "scaling": scaling,
        "real_servers": real,
        "targets": TARGETS,
        "met": {
            "chunk_1_rank": one["chunk_ratio"] <= TARGETS["chunk_ratio_max"],
            "chunk_2_ranks": two["chunk_ratio"] <= TARGETS["chunk_ratio_max"],
            "fetch_overhead": fetch["overhead"] <= TARGETS["fetch_overhead_max"],
            "commit_full_map": scale["commit_full_map_daemon_us"] < 1000 * TARGETS["commit_ms_max"],
            "startup_1_rank": one["startup_ratio"] <= TARGETS["startup_ratio_max"],
            "startup_2_ranks": two["startup_ratio"] <= TARGETS["startup_ratio_max"],
            "one_layer_check": request_check["one_layer_ratio"] <= TARGETS["one_layer_check_ratio_max"],
            "metrics_per_chunk": metrics["share_of_chunk"] <= TARGETS["metrics_share_of_chunk_max"],
            "machine_start": machine_start["ratio"] <= 1.0,
            "durable_chunk": durable_against_off["ratio"] <= TARGETS["durable_chunk_ratio_max"],
        },
        "machine": machine(),
        "seconds": round(time.monotonic() - t0, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    if scaling is not None and plot(scaling, os.path.join(args.out, "scaling.png")):
        step(f"wrote {args.out}/scaling.png")
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    text = markdown(data)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(text)
    print()
    print(text)
    step(f"wrote {args.out}/bench.md and bench.json; targets met: {data['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
