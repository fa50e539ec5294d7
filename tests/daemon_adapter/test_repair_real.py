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
import re
from collections.abc import Iterator

import pytest
from tools.demo import memory_probe
from tools.realserver import torn_move
from tools.realserver.server import StandaloneDaemons

from tests.daemon_adapter.real_daemons import tiny_daemon_set

LAYER = 0
TP = 2


@pytest.fixture(params=[True, False], ids=["auto-repair", "no-auto-repair"])
def daemon_set(request: pytest.FixtureRequest) -> Iterator[tuple[StandaloneDaemons, float]]:
    with tiny_daemon_set(TP, "rep-", [] if request.param else ["--expert-layout-no-auto-repair"]) as started:
        yield started


@pytest.mark.timeout(1800)
def test_a_torn_move_is_repaired_back_to_the_base_version(daemon_set: tuple[StandaloneDaemons, float]) -> None:
    import torch

    daemons, start_s = daemon_set
    auto_repair = "--expert-layout-no-auto-repair" not in daemons.tree.argv
    model_dir = str(daemons.topology.model_path)
    sockets = [daemons.run.socket_path(rank) for rank in range(TP)]
    engines = torn_move.attach_all(daemons)
    initial_row = engines[0].record["map"][LAYER]

    # 1. A committed move: layer 0 reversed, memory and record (version 1).
    moved_row = list(reversed(initial_row))
    assert moved_row != initial_row
    torn_move.move_layer(engines, LAYER, 0, moved_row)
    committed = torn_move.wait_phase(daemons, "clean")
    assert {s["version"] for s in committed} == {1} and committed[0]["map"][LAYER] == moved_row
    at_v1 = {(id(e), kind): e.experts[(LAYER, kind)].clone() for e in engines for kind in ("w13_weight", "w2_weight")}

    # 2. Killed mid-move: begun, layer 0's experts overwritten, the attach connections closed.
    torn_move.tear_move(engines, LAYER, 1)
    torn = {"engine_id": torn_move.ENGINE_ID, "layers": [LAYER], "base_version": 1}
    local = len(moved_row) // TP
    if auto_repair:
        # 3a. The daemons repair by themselves: repairing on the EOF, then clean.
        clean = torn_move.wait_phase(daemons, "clean", timeout_s=300.0)
        log = daemons.tree.log_path.read_text(errors="replace")
        assert log.count("daemon is now REPAIRING") == TP, daemons.tree.log_tail()
        replies = [vars(r) for r in torn_move.logged_repairs(log)]
        assert len(replies) == TP, daemons.tree.log_tail()
        repair_wall_s = max(r["seconds"] for r in replies)
    else:
        dirty = torn_move.wait_phase(daemons, "dirty")
        assert all(s["dirty"] == torn and s["repairing"] is None for s in dirty), dirty
        with pytest.raises(memory_probe.ProbeRefused, match="unknown"):  # a dirty daemon serves no fetch_state
            memory_probe.held_map(sockets, model_dir)
        # 3b. The operator's repair.
        done, repair_wall_s = torn_move.run_repair_cli(daemons)
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
    clean = torn_move.wait_phase(daemons, "clean")
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
    # How much faster than a restart the repair is: `make bench`'s repair row (a ratio, same run).
