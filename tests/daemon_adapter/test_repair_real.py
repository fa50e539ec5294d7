"""Issue 19 on a real standalone daemon set: a torn move's layer is reloaded from disk.

One set of layout-aware daemons (``python -m daemon_adapter``, TP2/EP2 like the demo: each rank
holds 5 of the 10 physical slots, so the reload must put experts on the right rank and local slot)
of the tiny Qwen3-MoE. The test is the engine: it attaches to both daemons and maps their tensors
through ``fetch_state`` with sglang's client transport, as an engine does; then

1. moves layer 0 (memory and record) to a reversed layout and commits it: version 1, a map
   that differs from the one the daemons loaded with, so a reload that ignored the record's rows
   would put the experts back where they started, and fail here;
2. begins a second move of layer 0, writes garbage into layer 0's routed experts, and closes its
   attach connections mid-move (EOF). With auto repair (the default) both daemons turn repairing
   and repair by themselves; with ``--expert-layout-no-auto-repair`` they turn dirty and stay so
   (a dirty daemon serves no ``fetch_state``) until
3. ``expert-layout repair``. Then it checks with ``tools.demo.memory_probe`` (a fresh mapping) that
   every slot of every layer holds the logical expert the record says, that the mapping it kept
   all along sees the repaired values (the repair wrote into the exported tensors), equal to what
   layer 0 held at version 1, and that the daemons are clean at version 1 with its digest.

It holds the real-server lock (``tests/realserver/conftest.py``) for the daemons' lifetime.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tools import with_project_path
from tools.demo import memory_probe
from tools.realserver.model import build_tiny_qwen3_moe
from tools.realserver.server import SOCKET_TEMPLATE_ENV, RunDir, StandaloneDaemons, Topology, daemon_status

from daemon_adapter import client
from layout_sm.messages import begin_request, commit_request, fetch_layout_field
from tests.realserver.conftest import LOCK_PATH, hold_lock

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0
ENGINE_ID = "repair-test-engine"
LAYER = 0
TP = 2


@pytest.fixture(params=[True, False], ids=["auto-repair", "no-auto-repair"])
def daemon_set(request: pytest.FixtureRequest) -> Iterator[tuple[StandaloneDaemons, float]]:
    model = build_tiny_qwen3_moe(REPO / "build" / "models")
    root = tempfile.mkdtemp(prefix="rep-", dir="/tmp")  # AF_UNIX paths: at most 107 bytes
    extra_args = [] if request.param else ["--expert-layout-no-auto-repair"]
    try:
        with hold_lock(LOCK_PATH):
            topology = Topology(model, tp_size=TP, ep_size=TP)
            daemons = StandaloneDaemons(RunDir(Path(root) / "run"), topology, extra_args=extra_args).start()
            try:
                yield daemons, daemons.wait_ready(START_TIMEOUT_S)
            finally:
                daemons.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Engine:
    """The test's engine on one daemon: its attach connection and its mapping of the expert tensors."""

    def __init__(self, socket_path: str, num_layers: int) -> None:
        import torch
        from sglang.srt.weight_cache.transport import get_client_transport_backend

        torch.multiprocessing.set_sharing_strategy("file_system")  # standalone daemons export so
        self.socket_path = socket_path
        config = client.request(socket_path, {"type": "query_config"})["config"]
        self.conn, reply = client.attach(socket_path, ENGINE_ID)
        assert reply["status"] == "ok", reply
        self.session: str = reply["session"]
        self.record: dict[str, Any] = reply["record"]
        claim = fetch_layout_field(ENGINE_ID, self.session, self.record["version"], self.record["digest"])
        fetched = client.request(
            socket_path, {"type": "fetch_state", "config": config, "expert_layout": claim}, timeout=60.0
        )
        assert fetched["status"] == "ok", fetched
        transport = get_client_transport_backend(fetched["transport_backend"])
        self.experts = {
            (layer, kind): transport.import_tensor(fetched["entries"][f"model.layers.{layer}.mlp.experts.{kind}"])
            for layer in range(num_layers)
            for kind in ("w13_weight", "w2_weight")
        }

    def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        reply = client.request(self.socket_path, message)
        assert reply["status"] == "ok", reply
        return reply


def _move_layer(engines: list[Engine], base_version: int, new_row: list[int], old_row: list[int]) -> None:
    """A real move of LAYER on every rank: memory (slot p takes what slot source[p] held), then commit."""
    for engine in engines:
        engine.ask(begin_request(ENGINE_ID, engine.session, base_version, [LAYER]))
    local = engines[0].experts[(LAYER, "w13_weight")].shape[0]
    for kind in ("w13_weight", "w2_weight"):
        old = [engine.experts[(LAYER, kind)][s].clone() for engine in engines for s in range(local)]
        for slot, expert in enumerate(new_row):  # any replica of an expert holds its weights
            engines[slot // local].experts[(LAYER, kind)][slot % local].copy_(old[old_row.index(expert)])
    for engine in engines:
        engine.ask(commit_request(ENGINE_ID, engine.session, [LAYER], [new_row]))


def _states(daemons: StandaloneDaemons) -> list[dict[str, Any]]:
    return [d.get("state") or {} for d in daemon_status(daemons.run, include_map=True)["daemons"]]


def _wait_phase(daemons: StandaloneDaemons, phase: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(daemons)
        if len(states) == TP and all(s.get("phase") == phase for s in states):
            return states
        assert time.monotonic() < deadline, f"daemons not {phase}: {states}"
        time.sleep(0.2)


def _repair(daemons: StandaloneDaemons) -> tuple[subprocess.CompletedProcess[str], float]:
    """``expert-layout repair`` as an operator runs it, on the run's sockets; and its wall time."""
    env = with_project_path(dict(os.environ))
    env[SOCKET_TEMPLATE_ENV] = daemons.run.socket_template
    argv = [sys.executable, "-m", "daemon_adapter.status_cli", "repair", "--json"]
    for rank in range(TP):
        argv += ["--socket", daemons.run.socket_path(rank)]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return done, time.monotonic() - started


def _logged_repairs(daemons: StandaloneDaemons) -> list[dict[str, Any]]:
    """The auto repairs' ends, as each daemon logged them (``ok(repaired): layers [0] reloaded ... in S s
    (R of C checkpoint bytes)``): seconds, bytes read, checkpoint bytes."""
    pattern = (
        r"ok\(repaired\): layers \[(\d+)\] reloaded from the checkpoint in ([0-9.]+) s \((\d+) of (\d+) checkpoint"
    )
    found = re.findall(pattern, daemons.tree.log_path.read_text(errors="replace"))
    return [
        {"layers": [int(layer)], "seconds": float(sec), "bytes_read": int(read), "checkpoint_bytes": int(whole)}
        for layer, sec, read, whole in found
    ]


@pytest.mark.timeout(1800)
def test_a_torn_move_is_repaired_back_to_the_base_version(daemon_set: tuple[StandaloneDaemons, float]) -> None:
    import torch

    daemons, start_s = daemon_set
    auto_repair = "--expert-layout-no-auto-repair" not in daemons.tree.argv
    model_dir = str(daemons.topology.model_path)
    sockets = [daemons.run.socket_path(rank) for rank in range(TP)]
    num_layers = len(_states(daemons)[0]["map"])
    engines = [Engine(path, num_layers) for path in sockets]
    initial_row = engines[0].record["map"][LAYER]

    # 1. A committed move: layer 0 reversed, memory and record (version 1).
    moved_row = list(reversed(initial_row))
    assert moved_row != initial_row
    _move_layer(engines, 0, moved_row, initial_row)
    committed = _wait_phase(daemons, "clean")
    assert {s["version"] for s in committed} == {1} and committed[0]["map"][LAYER] == moved_row
    at_v1 = {(id(e), kind): e.experts[(LAYER, kind)].clone() for e in engines for kind in ("w13_weight", "w2_weight")}

    # 2. Killed mid-move: begun, layer 0's experts overwritten, the attach connections closed.
    for engine in engines:
        engine.ask(begin_request(ENGINE_ID, engine.session, 1, [LAYER]))
        for kind in ("w13_weight", "w2_weight"):
            engine.experts[(LAYER, kind)].fill_(7.0)
        engine.conn.close()
    torn = {"engine_id": ENGINE_ID, "layers": [LAYER], "base_version": 1}
    local = len(moved_row) // TP
    if auto_repair:
        # 3a. The daemons repair by themselves: repairing on the EOF, then clean.
        clean = _wait_phase(daemons, "clean", timeout_s=300.0)
        log = daemons.tree.log_path.read_text(errors="replace")
        assert log.count("daemon is now REPAIRING") == TP, daemons.tree.log_tail()
        replies = _logged_repairs(daemons)
        assert len(replies) == TP, daemons.tree.log_tail()
        repair_wall_s = max(r["seconds"] for r in replies)
    else:
        dirty = _wait_phase(daemons, "dirty")
        assert all(s["dirty"] == torn and s["repairing"] is None for s in dirty), dirty
        with pytest.raises(memory_probe.ProbeRefused, match="unknown"):  # a dirty daemon serves no fetch_state
            memory_probe.held_map(sockets, model_dir)
        # 3b. The operator's repair.
        done, repair_wall_s = _repair(daemons)
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{daemons.tree.log_tail()}"
        replies = [d["reply"] for d in json.loads(done.stdout)["daemons"]]
        for rank, reply in enumerate(replies):
            assert (reply["reason"], reply["layers"], reply["version"]) == ("repaired", [LAYER], 1), reply
            # Only layer 0's routed experts, and of those only the ones with a slot on this rank
            # (gate, up and down each): the repair reads no other tensor of the checkpoint.
            assert reply["checkpoint_tensors_read"] == 3 * len(set(moved_row[rank * local : (rank + 1) * local]))
            assert sorted(reply["params_touched"]) == [
                f"model.layers.{LAYER}.mlp.experts.w13_weight",
                f"model.layers.{LAYER}.mlp.experts.w2_weight",
            ]
    for reply in replies:
        assert reply["layers"] == [LAYER] and 0 < reply["bytes_read"] < reply["checkpoint_bytes"], reply
    clean = _wait_phase(daemons, "clean")
    assert [(s["version"], s["digest"], s["map"]) for s in clean] == [
        (1, committed[0]["digest"], committed[0]["map"])
    ] * TP
    # A fresh mapping, each slot identified by its weights against the checkpoint: every layer.
    held = memory_probe.held_map(sockets, model_dir)
    assert held == clean[0]["map"], f"memory holds {held}, the record says {clean[0]['map']}"
    # The mapping the engine kept all along sees the repair: it went into the exported tensors,
    # and every value of layer 0 (gate, up, down, padding) is what version 1 held.
    for engine in engines:
        for kind in ("w13_weight", "w2_weight"):
            assert torch.equal(engine.experts[(LAYER, kind)], at_v1[(id(engine), kind)]), f"{kind} differs"

    seconds = max(r["seconds"] for r in replies)
    read = sum(r["bytes_read"] for r in replies)
    whole = replies[0]["checkpoint_bytes"]
    # sglang's own measure of the load from disk, in each daemon's log: the part a repair replaces.
    loads = re.findall(r"Model loaded from disk in ([0-9.]+)s", daemons.tree.log_path.read_text(errors="replace"))
    print(
        f"\n[repair, {'auto' if auto_repair else 'on demand'}] daemon set (TP{TP}) start {start_s:.1f} s "
        f"(sglang's load from disk: {loads} s); "
        f"repair {seconds:.3f} s in the daemons, "
        f"{repair_wall_s:.1f} s for the repair as seen outside; bytes read per rank "
        f"{[r['bytes_read'] for r in replies]} ({read} in all, {read / whole:.1%} of one {whole}-byte "
        f"checkpoint)"
    )
    assert seconds < start_s
