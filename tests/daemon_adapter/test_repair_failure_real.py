"""A failed repair's cause, quoted by every refusal of a real dirty daemon set.

One set of layout-aware daemons (TP2/EP2, auto repair on) of a copy of the tiny Qwen3-MoE. Once they
are up, the copy's checkpoint is moved away; the test, playing the engine, begins a move of layer 0
on both daemons and closes its attach connections mid-move. Both daemons turn repairing, their
reload cannot find the weights, and they turn dirty with the repair's cause kept. Then every
refusal an engine meets must quote that cause beside the torn move: the attach reply as a starting
engine reads it (its rank finding and the startup refusal the engine words from the findings of
both ranks), ``fetch_state``, a begin, and a parked standby's claim.

It holds the real-server lock (``tests/realserver/conftest.py``) for the daemons' lifetime.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tools.realserver import torn_move
from tools.realserver.model import build_tiny_qwen3_moe
from tools.realserver.server import RunDir, StandaloneDaemons, Topology

from daemon_adapter import client
from layout_sm.engine import EngineLayout, Go, RankFinding
from layout_sm.messages import begin_request, claim_request, fetch_layout_field, park_request
from layout_sm.ready import Attached, FindingsGathered
from layout_sm.session import EngineSession
from tests.realserver.conftest import LOCK_PATH, hold_lock

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600.0
TP = 2
CHECKPOINT = "model.safetensors"
# sglang's loader, when the model folder holds no weights: the cause every refusal must quote.
CAUSE = "Cannot find any model weights"


@pytest.fixture
def dirty_daemons() -> Iterator[StandaloneDaemons]:
    """Daemons dirty after a failed repair: the checkpoint moved away, then a move torn on both ranks."""
    root = Path(tempfile.mkdtemp(prefix="repf-", dir="/tmp"))  # AF_UNIX paths: at most 107 bytes
    model = root / "model"
    shutil.copytree(build_tiny_qwen3_moe(REPO / "build" / "models"), model)
    try:
        with hold_lock(LOCK_PATH):
            daemons = StandaloneDaemons(RunDir(root / "run"), Topology(model, tp_size=TP, ep_size=TP)).start()
            try:
                daemons.wait_ready(START_TIMEOUT_S)
                (model / CHECKPOINT).rename(root / CHECKPOINT)
                movers = [client.attach(daemons.run.socket_path(rank), torn_move.ENGINE_ID) for rank in range(TP)]
                for rank, (_, reply) in enumerate(movers):
                    begun = client.request(
                        daemons.run.socket_path(rank),
                        begin_request(torn_move.ENGINE_ID, reply["session"], reply["record"]["version"], [0]),
                    )
                    assert begun["status"] == "ok", begun
                for conn, _ in movers:
                    conn.close()
                torn_move.wait_phase(daemons, "dirty", timeout_s=300.0)
                yield daemons
            finally:
                daemons.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _quotes_the_cause(text: str, what: str) -> None:
    assert "its repair failed" in text and CAUSE in text, f"{what} does not quote the failed repair's cause: {text}"
    assert "went away while moving layers [0]" in text, f"{what} does not name the torn move: {text}"


@pytest.mark.timeout(1800)
def test_every_refusal_quotes_the_failed_repairs_cause(dirty_daemons: StandaloneDaemons) -> None:
    daemons = dirty_daemons
    sockets = [daemons.run.socket_path(rank) for rank in range(TP)]
    states = torn_move.queried_states(sockets)
    for state in states:
        assert state["phase"] == "dirty" and CAUSE in (state["repair_failed"] or ""), state
    shape = states[0]["shape"]

    # A starting engine: each rank's attach reply, its finding, and the startup refusal of both ranks.
    engine = EngineSession(
        "next-engine", TP, EngineLayout(shape[0], shape[1], states[0]["num_logical"], states[0]["digest"], True)
    )
    attached = [client.attach(path, "next-engine") for path in sockets]
    try:
        for rank, (_, reply) in enumerate(attached):
            _quotes_the_cause(RankFinding.from_attach_reply(rank, reply).detail, f"rank {rank}'s attach finding")
            engine.step(Attached(rank, reply))
        refusal = engine.step(FindingsGathered(engine.view().findings)).done
        assert refusal is not None and refusal.go is Go.STOP and "startup check failed" in refusal.message, refusal
        _quotes_the_cause(refusal.message, "the startup refusal")

        for rank, (_, reply) in enumerate(attached):
            session, version = reply["session"], states[rank]["version"]
            config = client.request(sockets[rank], {"type": "query_config"})["config"]
            claim = fetch_layout_field("next-engine", session, version, states[rank]["digest"])
            fetched = client.request(
                sockets[rank], {"type": "fetch_state", "config": config, "expert_layout": claim}, timeout=60.0
            )
            assert fetched["status"] == "layout_refused" and fetched["reason"] == "dirty", fetched
            _quotes_the_cause(fetched["message"], f"rank {rank}'s fetch_state refusal")
            begun = client.request(sockets[rank], begin_request("next-engine", session, version, [1]))
            assert (begun["status"], begun["reason"]) == ("refused", "dirty"), begun
            _quotes_the_cause(begun["message"], f"rank {rank}'s begin refusal")
    finally:
        for conn, _ in attached:
            conn.close()

    # A warm standby parked on the dirty daemons: its claim of the primary role.
    standbys = [client.attach(path, "standby-engine") for path in sockets]
    try:
        for rank, (_, reply) in enumerate(standbys):
            parked = client.request(sockets[rank], park_request("standby-engine", reply["session"]))
            assert parked["status"] == "ok", parked
            claimed = client.request(sockets[rank], claim_request("standby-engine", reply["session"]))
            assert (claimed["status"], claimed["reason"]) == ("refused", "dirty"), claimed
            _quotes_the_cause(claimed["message"], f"rank {rank}'s claim refusal")
    finally:
        for conn, _ in standbys:
            conn.close()
