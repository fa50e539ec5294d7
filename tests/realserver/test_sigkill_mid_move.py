"""Cases 3a and 3b on real servers, on one set of standalone daemons (one module fixture).

3a, SIGKILL between chunks: server A runs with the test probe
``EXPERT_LAYOUT_TEST_STOP=after_commit:1`` (``tools.realserver.engine_probes``): each rank stops
once its daemon has answered ok to the commit of A's first chunk (one layer of two), before the
second chunk begins. The test SIGKILLs A's whole process tree. The daemons must stay clean at
that committed version, and server D on the same daemons must adopt it on every rank.

3b, SIGKILL mid-move: D runs with ``before_commit:1``: each rank stops once sglang has moved D's first
chunk in the daemons' memory, before its commit (the record still at the base version: memory and
record apart, the torn move at its worst). The test SIGKILLs D's tree. Server E
on the same daemons must exit on its own, well before the protocol's wait timeout, and its log
(its launcher's output) must say the daemons are dirty and what to do. Before E starts, the
checkpoint is moved away for an operator's ``expert-layout repair``, which fails, and put back: E's
startup refusal must quote that repair's cause, as the daemons keep it. These daemons run with
``--expert-layout-no-auto-repair``, so they stay dirty until the operator's ``expert-layout
repair``: then they are clean at the base version, server F adopts it on every rank, and F's
outputs equal those of a plain server (no plugin, no daemons) loaded from disk with
``--init-expert-location`` set to the file ``expert-layout export`` wrote from the daemons.
(Auto repair, the default, on real servers: ``make demo``'s case 3b.)

D is 3a's next server and 3b's mover: one server start serves both cases.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tools.realserver import torn_move
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS
from tools.realserver.server import (
    RealServer,
    RunDir,
    ServerFailed,
    ServerSpec,
    StandaloneDaemons,
    Topology,
    daemon_status,
    disk_reference,
    export_layout,
    park,
)

from daemon_adapter.__main__ import NO_AUTO_REPAIR

# B's SGLANG_PLUGINS can be set from outside, to run the test with the plugin's startup check off.
B_PLUGINS = os.environ.get("EXPERT_LAYOUT_TEST_B_PLUGINS") or None
PROMPT_TIMEOUT_S = 240.0
# Starts took up to ~300 s at a load average of 15-20 (other work on 2 cores); a stuck one still ends.
START_TIMEOUT_S = 600.0
# The engine-side wait for another engine's move; E must fail well before it.
WAIT_TIMEOUT_S = 300.0
REBALANCE_END = "[EPLBManager] rebalance end"
CHECKPOINT = "model.safetensors"
# sglang's loader, when the model folder holds no weights: the failed repair's cause E must quote.
NO_WEIGHTS = "Cannot find any model weights"
STARTUP_REFUSAL = "expert-layout startup check failed"


@dataclass
class BetweenChunks:
    """What case 3a left: the daemons (clean, at A's committed version) and D on them."""

    run: RunDir
    topology: Topology
    at_stop: list[dict[str, Any]]  # the daemons' states while A's ranks were parked
    a_rebalance_ended: bool  # whether A's log had a finished rebalance when it was parked
    after_kill: list[dict[str, Any]]  # the daemons' states after A's SIGKILL, with the map
    d_beliefs: dict[int, dict[str, Any]]
    d: RealServer
    daemons: StandaloneDaemons


@pytest.fixture(scope="module")
def between_chunks(
    realserver_lock: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BetweenChunks]:
    run_dir = RunDir(tmp_path_factory.mktemp("sigkill") / "run")
    # A copy of the model: 3b moves its checkpoint away for a while.
    model = tmp_path_factory.mktemp("model") / tiny_model.name
    shutil.copytree(tiny_model, model)
    topology = Topology(model)
    # Auto repair off: this is the torn move that stays dirty (its repair: tests/daemon_adapter/test_repair_real.py).
    daemons = StandaloneDaemons(run_dir, topology, extra_args=(NO_AUTO_REPAIR,)).start()
    d: RealServer | None = None
    try:
        daemons.wait_ready(START_TIMEOUT_S)
        a = RealServer(
            run_dir,
            topology,
            ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=StopPoint("after_commit", 1)),
        ).start()
        try:
            a.wait_ready(START_TIMEOUT_S)
            park([a], PROMPT_TIMEOUT_S)
            at_stop = _states(run_dir)
            ended = REBALANCE_END in a.log_text()
        finally:
            a.kill()
        after_kill = _wait_detached(run_dir, timeout_s=30.0)
        d = RealServer(
            run_dir,
            topology,
            ServerSpec("D", rebalance_iterations=10, layers_per_chunk=1, stop_at=StopPoint("before_commit", 1)),
        ).start()
        d.wait_ready(START_TIMEOUT_S)
        yield BetweenChunks(run_dir, topology, at_stop, ended, after_kill, d.beliefs(), d, daemons)
    finally:
        if d is not None:
            d.kill()
        daemons.kill()


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
def test_sigkill_between_chunks_the_next_server_adopts_the_committed_version(between_chunks: BetweenChunks) -> None:
    ran = between_chunks
    assert not ran.a_rebalance_ended, "A was parked after a whole rebalance, not between two chunks"
    committed = [s.get("version") for s in ran.at_stop]
    assert all(v is not None and v >= 1 for v in committed), f"no chunk committed at the stop point: {ran.at_stop}"
    assert not any(s.get("pending") for s in ran.at_stop), f"a move is pending at the stop point: {ran.at_stop}"
    version = committed[0]
    for state in ran.after_kill:
        assert not state.get("dirty") and not state.get("pending"), f"a daemon is not clean after A's kill: {state}"
        assert state.get("version") == version, f"a daemon left version {version} after A's kill: {state}"
    record_map = ran.after_kill[0]["map"]
    assert sorted(ran.d_beliefs) == list(range(ran.topology.tp_size)), f"a rank of D wrote no belief: {ran.d_beliefs}"
    for rank, belief in ran.d_beliefs.items():
        assert belief["startup"] == "adopt", f"D's rank {rank} startup was {belief['startup']}"
        assert belief["version"] == version, f"D's rank {rank} is at version {belief['version']}, not {version}"
        assert belief["map"] == record_map, f"D's rank {rank} routes with another map than the daemons' record"


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
def test_sigkill_mid_move_makes_the_next_server_fail_at_startup(between_chunks: BetweenChunks) -> None:
    run_dir, topology, d = between_chunks.run, between_chunks.topology, between_chunks.d
    try:
        park([d], PROMPT_TIMEOUT_S)
        pending = [s.get("pending") for s in _states(run_dir)]
        assert all(pending), f"the stop point is not mid-move: pending={pending}"
    finally:
        d.kill()
    dirty = _wait_dirty(run_dir, topology.tp_size, timeout_s=30.0)
    assert all(dirty), f"daemons are not dirty after the mover's SIGKILL: {dirty}"

    # The operator's repair, with the checkpoint unreadable: it fails, and the daemons keep its cause.
    checkpoint = topology.model_path / CHECKPOINT
    checkpoint.rename(checkpoint.with_name(CHECKPOINT + ".away"))
    try:
        done, _seconds = torn_move.run_repair_cli(between_chunks.daemons)
    finally:
        checkpoint.with_name(CHECKPOINT + ".away").rename(checkpoint)
    assert done.returncode != 0, f"the repair without a checkpoint did not fail: {done.stdout}"
    failures = [s.get("repair_failed") or "" for s in _states(run_dir)]
    assert all(NO_WEIGHTS in f for f in failures), f"the daemons keep no repair failure: {failures}"

    e = RealServer(run_dir, topology, ServerSpec("E", rebalance_iterations=100_000, plugins=B_PLUGINS)).start()
    started = time.monotonic()
    try:
        with pytest.raises(ServerFailed) as failed:
            e.wait_ready(timeout_s=WAIT_TIMEOUT_S)
        took = time.monotonic() - started
    finally:
        e.kill()

    message = str(failed.value)
    assert "exited with code" in message, f"E did not exit by itself: {message[:2000]}"
    # A start is mostly sglang's imports, whose time follows the machine's load: E is prompt when
    # it fails less than half the protocol's wait after the time D took to be ready (a wait for
    # the timeout would add all of it).
    d_ready_s = d.ready_s or 0.0
    assert took < d_ready_s + WAIT_TIMEOUT_S / 2, f"E failed only after {took:.0f}s (D was ready in {d_ready_s:.0f}s)"
    assert "dirty" in message, message[-3000:]
    # The refusal in full, as E logged it (the failure report above cuts long lines).
    refusals = [line for line in e.log_text().splitlines() if STARTUP_REFUSAL in line]
    assert refusals, e.log_text()[-3000:]
    for line in refusals:
        assert "restart the weight cache daemons" in line and "expert-layout repair" in line, line
        assert "its repair failed: " in line and NO_WEIGHTS in line, f"E's refusal does not quote the cause: {line}"


@pytest.mark.timeout(3600)  # includes waiting for /tmp/realserver.lock
def test_after_the_operators_repair_the_next_server_adopts_the_base_version(between_chunks: BetweenChunks) -> None:
    """Runs after the test above (the same module fixture): the daemons are dirty from D's kill."""
    ran = between_chunks
    run_dir, topology = ran.run, ran.topology
    torn = [s.get("dirty") for s in _states(run_dir)]
    assert all(torn), f"the daemons are not dirty (the test above ran first?): {torn}"
    base = torn[0]["base_version"]

    done, _seconds = torn_move.run_repair_cli(ran.daemons)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    clean = _states(run_dir)
    assert [(s.get("phase"), s.get("version")) for s in clean] == [("clean", base)] * topology.tp_size, clean
    record_map = clean[0]["map"]
    # The operator's export of the layout the daemons hold, for a server outside the daemon set.
    exported = run_dir.root.parent / "exported-layout.json"
    done = export_layout(run_dir, exported)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert json.loads(exported.read_text())["physical_to_logical_map"] == record_map, exported.read_text()

    f = RealServer(run_dir, topology, ServerSpec("F", rebalance_iterations=100_000)).start()
    ref = disk_reference(run_dir.root.parent / "reference", topology, record_map, init_file=exported).start()
    try:
        f.wait_ready(START_TIMEOUT_S)
        ref.wait_ready(START_TIMEOUT_S)
        beliefs = f.beliefs()
        for rank, belief in sorted(beliefs.items()):
            assert (belief["startup"], belief["version"]) == ("adopt", base), f"F's rank {rank}: {belief}"
            assert belief["map"] == record_map, f"F's rank {rank} routes with another map than the record"
        assert sorted(beliefs) == list(range(topology.tp_size)), beliefs
        f_out = f.generate(list(PROMPTS), max_new_tokens=16)
        ref_out = ref.generate(list(PROMPTS), max_new_tokens=16)
    finally:
        f.kill()
        ref.kill()
    assert f_out == ref_out, "F's outputs differ from a plain server started with the exported layout file"


def _states(run: RunDir) -> list[dict[str, Any]]:
    return [d["state"] or {} for d in daemon_status(run, include_map=True)["daemons"]]


def _wait_detached(run: RunDir, timeout_s: float) -> list[dict[str, Any]]:
    """The daemons' states once a killed engine's attachment is gone (its connection's EOF
    reaches the daemons' watchers a moment after the kill), or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        states = _states(run)
        if not any(s.get("attached") for s in states) or time.monotonic() > deadline:
            return states
        time.sleep(0.5)


def _wait_dirty(run: RunDir, daemons: int, timeout_s: float) -> list:
    """Each daemon's dirty field, once all are dirty or after ``timeout_s`` (the daemon sees the
    killed engine's attach connection close, then turns dirty)."""
    deadline = time.monotonic() + timeout_s
    while True:
        dirty = [s.get("dirty") for s in _states(run)]
        if (len(dirty) == daemons and all(dirty)) or time.monotonic() > deadline:
            return dirty
        time.sleep(0.5)
