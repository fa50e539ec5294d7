"""The real-server library's own parts, without a server (fast)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from tools.realserver.engine_probes import StopPoint
from tools.realserver.processes import ProcessTree

from tests.realserver.conftest import hold_lock, lock_holders


def test_stop_point_parses_and_refuses_bad_values() -> None:
    assert StopPoint.parse("after_commit:2") == StopPoint("after_commit", 2)
    assert StopPoint.parse("mid_move:1").env_value() == "mid_move:1"
    assert StopPoint.parse("before_commit:3") == StopPoint("before_commit", 3)
    for bad in ("mid_move", "mid_move:0", "between:1", "after_commit:x"):
        with pytest.raises(ValueError, match="EXPERT_LAYOUT_TEST_STOP"):
            StopPoint.parse(bad)


def test_kill_reaches_every_descendant_and_the_log_keeps_the_output(tmp_path: Path) -> None:
    # A parent that starts a grandchild in a new session of its own: only the pid walk reaches it.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
        "print('grandchild pid', child.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    tree = ProcessTree("t", [sys.executable, "-c", code], {}, tmp_path / "t.log")
    tree.start()
    deadline = time.monotonic() + 30
    while "grandchild pid " not in tree.log_tail() and time.monotonic() < deadline:
        time.sleep(0.1)
    members = tree.members()
    assert len(members) == 2, tree.log_tail()
    assert tree.rss_bytes() > 0
    tree.kill()
    _gone, alive = psutil.wait_procs(members, timeout=10)
    assert not alive and not tree.alive()
    assert tree.exit_code() == -9
    assert "grandchild pid " in tree.log_tail()


def test_server_lock_held_by_an_outer_flock_is_not_waited_for_but_anyone_else_is(tmp_path: Path) -> None:
    lock_path = str(tmp_path / "realserver.lock")
    open(lock_path, "a").close()
    repo = Path(__file__).resolve().parents[2]
    code = "from tests.realserver.conftest import hold_lock\nwith hold_lock(%r):\n    print('held', flush=True)\n"
    env = {"PYTHONPATH": f"{repo}:{repo / 'src'}", "PATH": "/usr/bin:/bin"}
    # Under `flock LOCK pytest`: the outer hold is the test's (it once waited for it forever).
    outer = ProcessTree("outer", ["flock", lock_path, sys.executable, "-c", code % lock_path], env, tmp_path / "o.log")
    outer.start()
    try:
        assert outer.proc is not None
        assert outer.proc.wait(60) == 0 and "held" in outer.log_tail(), outer.log_tail()
    finally:
        outer.kill()  # the whole tree, if it waited
    # Held by a process that is not an ancestor (a sibling): the lock still keeps the test out.
    holder = subprocess.Popen(["flock", lock_path, "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while holder.pid not in lock_holders(lock_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder.pid in lock_holders(lock_path)
        with pytest.raises(subprocess.TimeoutExpired):
            subprocess.run([sys.executable, "-c", code % lock_path], env=env, capture_output=True, timeout=5)
    finally:
        holder.kill()
        holder.wait()


def test_eplb_timer_counts_every_call_of_a_rebalance_and_no_other_however_short(tmp_path: Path) -> None:
    """sglang's own ``EPLBManager._entrypoint`` drives the timer, as in a server: each rebalance of 2 chunks
    is 3 calls (the plan, the first chunk, the second and the end), every other call only steps the
    iteration counter; the chunks here take no time at all, as a chunk without the protocol nearly does."""
    import json

    from sglang.srt.eplb.eplb_manager import EPLBManager
    from sglang.srt.runtime_context import get_parallel
    from tools.realserver.engine_probes import EplbTimer

    chunks_moved: list[int] = []

    def rebalance() -> Any:  # the shape of sglang's: plan, then a yield before each of its chunks
        for chunk in (0, 1):
            yield
            chunks_moved.append(chunk)

    manager = object.__new__(EPLBManager)  # sglang's generator, without a model or a runtime context
    manager._rebalance_num_iterations = 3
    manager.rebalance = rebalance  # type: ignore[method-assign]
    manager.reset_generator()
    timer = EplbTimer(tmp_path)
    # 3 calls that only count iterations, then a rebalance's 3 calls (its last also takes the next period's
    # first iteration), 2 that only count, the second rebalance's 3, and 2 more: 13 calls, 6 of rebalance work.
    with get_parallel().override(tp_rank=0):  # the rank the timer names its file after, as a server's
        for _ in range(3 + 3 + 2 + 3 + 2):
            timer.around(EPLBManager.on_forward_pass_end, manager)
    assert chunks_moved == [0, 1, 0, 1]
    assert (timer.calls, timer.rebalance_calls) == (13, 6)
    assert json.loads((tmp_path / "rank0.eplb.json").read_text())["rebalance_calls"] == 6


@pytest.mark.parametrize("collectives", [1, 2])
def test_chunk_floor_asks_the_daemon_around_each_move_and_the_timer_writes_each_part(
    tmp_path: Path, collectives: int
) -> None:
    """``ChunkFloor`` around two chunks of a rebalance driven by sglang's own ``EPLBManager._entrypoint``:
    a real ping to a real daemon and an all-gather of its reply before sglang's move, a synchronize and a
    ping after it, with an all-gather of its reply too in the two-collective shape; each part timed where it
    runs, and ``EplbTimer`` writes the parts beside its figures, where ``make bench`` reads them. The
    all-gathers (one rank: the reply itself, as the plugin's ``all_gather`` on one rank) and the move take
    distinct known times, so a part timed in the wrong place shows."""
    import tempfile
    from types import SimpleNamespace

    from sglang.srt.eplb.eplb_manager import EPLBManager
    from sglang.srt.runtime_context import get_parallel
    from tools.bench.real import _part_medians_ms, _rebalance_seconds
    from tools.harness.daemon_proc import start_daemon
    from tools.realserver.engine_probes import ChunkFloor, EplbTimer

    from daemon_adapter import client

    before_s, move_s, after_s = 0.05, 0.1, 0.15
    calls: list[Any] = []
    floor = ChunkFloor(collectives)
    with pytest.raises(AssertionError, match="load_model"):  # no model loaded: nothing to ask
        floor.around_chunk(lambda: None)

    def move(layers: list[int]) -> str:  # sglang's update_expert_location_with_recovery, as the hook sees it
        calls.append(("move", layers))
        time.sleep(move_s)
        return "moved"

    def rebalance() -> Any:  # sglang's shape: plan, then a yield before each of its chunks
        for layer in (0, 1):
            yield
            assert floor.around_chunk(move, [layer]) == "moved"

    with tempfile.TemporaryDirectory(prefix="floor-", dir="/tmp") as short:
        daemon = start_daemon(f"{short}/d.sock", plain_sglang=True, log_path=f"{short}/d.log")
        try:

            def all_gather(reply: Any) -> list[Any]:
                calls.append(("all_gather", reply["status"]))
                after_the_move = calls[-3:-1] == ["synchronize", "ping"]
                time.sleep(after_s if after_the_move else before_s)
                return [reply]

            floor._round_trip = lambda: calls.append("ping") or client.request(daemon.socket_path, {"type": "ping"})
            floor._all_gather = all_gather
            floor._synchronize = lambda: calls.append("synchronize")
            manager = object.__new__(EPLBManager)
            manager._rebalance_num_iterations = 1
            manager.rebalance = rebalance  # type: ignore[method-assign]
            manager.reset_generator()
            timer = EplbTimer(tmp_path, lambda: floor.chunk_s)
            with get_parallel().override(tp_rank=0):
                for _ in range(4):  # one that counts, the plan, the first chunk, the second and the end
                    timer.around(EPLBManager.on_forward_pass_end, manager)
        finally:
            daemon.kill()

    one_chunk = ["ping", ("all_gather", "ok"), "synchronize", "ping", ("all_gather", "ok")][: 3 + collectives]
    assert calls == [*one_chunk[:2], ("move", [0]), *one_chunk[2:], *one_chunk[:2], ("move", [1]), *one_chunk[2:]]
    written = _rebalance_seconds(SimpleNamespace(probe_dir=tmp_path), 1)  # type: ignore[arg-type]
    assert written["chunk_s"] == floor.chunk_s
    assert [len(part) for part in written["chunk_s"].values()] == [2, 2, 2]
    # Lower bounds only (the machine may be slow, never fast): each part holds its own wait.
    assert all(s >= before_s for s in written["chunk_s"]["before_s"])
    assert all(s >= move_s for s in written["chunk_s"]["move_s"])
    medians = _part_medians_ms(written["chunk_s"])
    assert medians["chunks"] == 2
    if collectives == 2:
        assert all(s >= after_s for s in written["chunk_s"]["after_s"]) and medians["after"] >= after_s * 1000
    else:  # a ping alone after the move: no all-gather's wait in it
        assert all(s < before_s for s in written["chunk_s"]["after_s"])


def test_server_lock_taken_again_in_the_process_that_holds_it_is_not_waited_for(tmp_path: Path) -> None:
    # The session's hold, then a daemon-set test's (tests/daemon_adapter/real_daemons.py): once a
    # second flock on a second open file, which waited for the first for ever.
    lock_path = str(tmp_path / "realserver.lock")
    entered = threading.Event()

    def nested() -> None:
        with hold_lock(lock_path), hold_lock(lock_path):
            entered.set()

    worker = threading.Thread(target=nested, daemon=True)
    worker.start()
    worker.join(10)
    assert entered.is_set(), "hold_lock waited for its own process's hold"
    assert lock_holders(lock_path) == set(), "the lock is still held after the outer block"
