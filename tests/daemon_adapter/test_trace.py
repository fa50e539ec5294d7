"""The daemon's protocol trace (``daemon_adapter.trace``) and its checker (``tools.trace_check``).

Real ``LayoutAwareDaemon`` serve loops on real Unix sockets, in this process (the model-based tests'
in-process host), write their traces while samples of the TLC-derived suites drive them; every trace
must replay on the protocol's daemon machine. Then the checker must be able to fail: a trace whose
answer was changed is reported at that line, a gate broken to serve what its check refused (a
fetch served while a move is pending) is caught while the same requests on the real gate pass, and
so is a daemon broken to tell a parked standby that the primary role is free while it is not.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tools.harness import daemon_proc
from tools.mirror.system import load_model
from tools.trace_check import check_all, check_order

from daemon_adapter import client
from daemon_adapter import daemon as daemon_module
from layout_sm.messages import FETCH_FIELD, NOTICE, begin_request, park_request
from layout_sm.trace_codec import TRACE_ENV
from tests.model_based.daemon_hosts import InProcessHost
from tests.model_based.suites import SPEC
from tests.model_based.test_replay_adapters import replay_on_adapters, sample
from tests.model_based.test_replay_mirror import load

ROWS = [[0, 1], [1, 0]]


def _replayed(model: str, n: int, traces: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    monkeypatch.setenv(TRACE_ENV, str(traces))
    suite = load(model)
    with tempfile.TemporaryDirectory(prefix="trace-", dir="/tmp") as tmp:  # AF_UNIX paths: at most 107 bytes
        host = InProcessHost(Path(tmp), load_model(SPEC, model).repairs)
        problems, stats = replay_on_adapters(model, suite, host, sample(len(suite.paths), n))
    assert not problems, problems
    return stats


@pytest.mark.parametrize(("model", "n"), [("MCSmall", 60), ("MCStandby", 30), ("MCRejoin", 30)])
def test_the_daemons_traces_of_suite_behaviours_are_behaviours_of_the_protocol(
    model: str, n: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stats = _replayed(model, n, tmp_path, monkeypatch)
    verdicts = check_all([tmp_path])
    assert verdicts, f"no trace written under {tmp_path}"
    assert all(v.ok for v in verdicts), "\n".join(v.divergence.report(v.path) for v in verdicts if v.divergence)
    events: dict[str, int] = {}
    for verdict in verdicts:
        for event, count in verdict.events.items():
            events[event] = events.get(event, 0) + count
    assert sum(events.values()) >= stats["steps"] // 4, (events, stats)  # engine-only steps write no line
    assert {"attach", "detach", "fetch"} <= set(events), events
    if model == "MCSmall":
        assert {"begin", "commit"} <= set(events) and sum(v.fetches_served for v in verdicts) > 0, events
    if model == "MCRejoin":
        assert {"rejoin", "repair_done"} <= set(events), events


def test_a_trace_whose_answer_was_changed_is_reported_at_that_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replayed("MCSmall", 20, tmp_path / "traces", monkeypatch)
    for path in sorted((tmp_path / "traces").glob("daemon-*.ndjson")):
        lines = [json.loads(text) for text in path.read_text().splitlines()]
        begun = [line for line in lines if line.get("event") == "begin" and line["answer"]["status"] == "ok"]
        if begun:
            break
    else:
        pytest.fail("no begin was granted in the sample")
    begun[0]["answer"]["status"] = "busy"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (verdict,) = check_all([path])
    assert verdict.divergence is not None and verdict.divergence.seq == begun[0]["seq"], verdict
    report = verdict.divergence.report(path)
    assert "the protocol answers" in report and "the record before it" in report and "begin -> pending" in report


def _fetch_during_a_move(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """e1 attaches and begins a move on a traced daemon; e2 attaches and fetches during it."""
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "traces"))
    with tempfile.TemporaryDirectory(prefix="trace-", dir="/tmp") as tmp:
        daemon = InProcessHost(Path(tmp)).start("d1", ROWS, 2)
        try:
            mover, reply = client.attach(daemon.socket_path, "e1")
            begun = client.request(daemon.socket_path, begin_request("e1", reply["session"], 0, [0]))
            assert begun["status"] == "ok", begun
            other, other_reply = client.attach(daemon.socket_path, "e2")
            digest = reply["record"]["digest"]
            claim = {"engine_id": "e2", "session": other_reply["session"], "version": 0, "digest": digest}
            fetch = {"type": "fetch_state", "config": daemon_proc.default_cache_config(), FETCH_FIELD: claim}
            fetched = daemon_proc.request(daemon.socket_path, fetch)
            other.close()
            mover.close()
        finally:
            daemon.stop()
    return [fetched, check_all([tmp_path / "traces"])]


def test_the_real_gate_refuses_a_fetch_during_a_move_and_its_trace_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched, verdicts = _fetch_during_a_move(tmp_path, monkeypatch)
    assert fetched.get("status") == "layout_refused", fetched
    assert verdicts and all(v.ok for v in verdicts), [v.divergence for v in verdicts]
    assert sum(v.events.get("fetch", 0) for v in verdicts) == 1 and not any(v.fetches_served for v in verdicts)


def test_a_gate_that_serves_a_fetch_its_check_refused_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def serves_whatever_the_check_says(self: Any, conn: Any, **kwargs: Any) -> None:
        self._check(*conn.fetch)
        self._backend.send_fetch_state_response(conn, **kwargs)

    gate = daemon_module._LayoutGatedTransport
    monkeypatch.setattr(gate, "send_fetch_state_response", serves_whatever_the_check_says)
    _fetched, verdicts = _fetch_during_a_move(tmp_path, monkeypatch)
    caught = [v for v in verdicts if v.divergence is not None]
    assert caught, "the checker passed a trace where handles went out on a refused check"
    assert "without a layout check that passed" in caught[0].divergence.why, caught[0].divergence.report(caught[0].path)


def _standby_parked_then_primary_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, told_at_park: bool = False
) -> tuple[Any, list[Any]]:
    """Primary e1 attaches; standby s1 attaches and parks beside it (no notice: e1 is unparked); e1's
    connection closes. The frame s1 reads on its attach connection, and the daemon's trace verdicts.
    ``told_at_park``: s1 reads its frame before e1 goes (the daemon writes it after the park's reply)."""
    monkeypatch.setenv(TRACE_ENV, str(tmp_path / "traces"))
    with tempfile.TemporaryDirectory(prefix="trace-", dir="/tmp") as tmp:
        daemon = InProcessHost(Path(tmp)).start("d1", ROWS, 2)
        try:
            primary, _ = client.attach(daemon.socket_path, "e1")
            standby, reply = client.attach(daemon.socket_path, "s1")
            parked = client.request(daemon.socket_path, park_request("s1", reply["session"]))
            assert parked["status"] == "ok", parked
            standby.settimeout(30.0)
            notice = client.recv_frame(standby) if told_at_park else None
            primary.close()
            notice = notice or client.recv_frame(standby)
            standby.close()
        finally:
            daemon.stop()
    return notice, check_all([tmp_path / "traces"])


def test_a_parked_standby_is_told_once_the_primary_is_gone_and_its_trace_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notice, verdicts = _standby_parked_then_primary_gone(tmp_path, monkeypatch)
    assert notice.get("type") == NOTICE, notice
    assert verdicts and all(v.ok for v in verdicts), [v.divergence for v in verdicts]
    assert sum(v.notices_sent for v in verdicts) == 1, verdicts


def test_a_daemon_that_tells_a_standby_while_a_primary_is_attached_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def tells_every_attached_engine(self: Any, engines: Any) -> None:  # its own rule, not the machine's
        list(engines)
        tell(self, list(self._attach_conns))

    tell = daemon_module.LayoutAwareDaemon._notify
    monkeypatch.setattr(daemon_module.LayoutAwareDaemon, "_notify", tells_every_attached_engine)
    # s1 reads the notice while e1 is still attached: the daemon tells it in the park's thread, after
    # the reply, so a test that closed e1 first could see it told after e1's detach, where it is owed.
    notice, verdicts = _standby_parked_then_primary_gone(tmp_path, monkeypatch, told_at_park=True)
    assert notice.get("type") == NOTICE, notice
    caught = [v for v in verdicts if v.divergence is not None]
    assert caught, "the checker passed a trace with a notice sent while the primary was attached"
    assert "which no step's answer named" in caught[0].divergence.why, caught[0].divergence.report(caught[0].path)


def test_a_last_line_cut_by_a_kill_is_left_out_and_a_cut_line_before_it_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _replayed("MCSmall", 3, tmp_path / "traces", monkeypatch)
    path = max((tmp_path / "traces").glob("daemon-*.ndjson"), key=lambda p: p.stat().st_size)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])  # SIGKILL while writing
    (verdict,) = check_all([path])
    assert verdict.ok and verdict.cut_short, verdict
    path.write_text("\n".join([*lines[:2], lines[2][:40], *lines[3:]]) + "\n")
    (verdict,) = check_all([path])
    assert verdict.divergence is not None and "not JSON" in verdict.divergence.why, verdict
    for text in ("", lines[0][:30]):  # killed before its start line was whole: no step, nothing wrong
        path.write_text(text)
        (verdict,) = check_all([path])
        assert verdict.ok and verdict.cut_short and verdict.steps == 0, verdict
    path.write_text("\n".join(lines[1:]) + "\n")
    (verdict,) = check_all([path])
    assert verdict.divergence is not None and "start line" in verdict.divergence.why, verdict


def test_without_the_variable_no_daemon_writes_a_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with tempfile.TemporaryDirectory(prefix="trace-", dir="/tmp") as tmp:
        daemon = InProcessHost(Path(tmp)).start("d1", ROWS, 2)
        try:
            conn, _ = client.attach(daemon.socket_path, "e1")
            conn.close()
            assert daemon.daemon._trace is None and daemon.daemon._layout_machine.observer is None
        finally:
            daemon.stop()
    assert not list(tmp_path.rglob("*.ndjson"))
    assert check_all([tmp_path, tmp_path / "missing"]) == []  # nothing traced: nothing to check, no error


def test_an_engine_line_after_its_daemon_was_lost_is_caught_in_one_order() -> None:
    """A daemon started again on the same socket ends the engines attached to the one before it that it
    served their weights (the spec's Lose): a line any of their ranks wrote after that start is
    reported; one written before is not, nor a line of an engine attached but not served (G: it maps
    nothing of the daemon's), nor of one never attached (F)."""
    daemon = [
        {"seq": 1, "t_ns": 10, "kind": "start", "socket": "s0"},
        {"seq": 2, "t_ns": 20, "kind": "step", "event": "attach", "after": {"attached": ["E"]}},
        {"seq": 3, "t_ns": 21, "kind": "step", "event": "attach", "after": {"attached": ["E", "G"]}},
        {
            "seq": 4,
            "t_ns": 22,
            "kind": "step",
            "event": "fetch",
            "payload": {"claim": {"engine_id": "E"}},
            "answer": {"status": "ok"},
            "after": {"attached": ["E", "G"]},
        },
    ]
    again = [{"seq": 1, "t_ns": 50, "kind": "start", "socket": "s0"}]
    daemons = {Path("daemon-s0-1.ndjson"): daemon, Path("daemon-s0-2.ndjson"): again}

    def rank(engine: str, last_ns: int) -> list[dict[str, Any]]:
        return [
            {"seq": 1, "t_ns": 15, "kind": "start", "engine_id": engine, "socket": "s0"},
            {"seq": 2, "t_ns": last_ns, "kind": "step", "event": "decide"},
        ]

    assert check_order(Path("run"), {Path("engine-E-r0.ndjson"): rank("E", 40)}, daemons).ok
    assert check_order(Path("run"), {Path("engine-F-r0.ndjson"): rank("F", 60)}, daemons).ok
    assert check_order(Path("run"), {Path("engine-G-r0.ndjson"): rank("G", 60)}, daemons).ok
    late = check_order(Path("run"), {Path("engine-E-r0.ndjson"): rank("E", 60)}, daemons)
    assert late.divergence is not None and late.divergence.seq == 2, late
    assert "after its daemon at s0, whose memory it maps, was lost" in late.divergence.why
