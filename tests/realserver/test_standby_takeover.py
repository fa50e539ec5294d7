"""A warm standby on real servers (issue 18): it follows EPLB while parked and takes over from a killed primary.

Primary A and standby S (``SGLANG_EXPERT_LAYOUT_ROLE=standby``) on one set of standalone daemons, TP2/EP2.

Case 1: S parks after its warmup (``/health`` 503, a request sent to it is held). A commits two
whole rebalances and one chunk of a third while S is parked (none ``busy``), and stops between
chunks (``after_commit:5``); the test SIGKILLs A's tree. S must take over: its held request and a
streamed request sent right after the kill complete, ``/health`` answers 200, both ranks route with
the daemons' record, and S's outputs equal those of a server loaded from disk with
``--init-expert-location`` set to that map. The takeover's parts (the daemons' notice, the claims
and agreement, the metadata update, the unpark: each process logs its wall clock) and the time to
the streamed request's first token are written to ``build/standby-takeover.json``.

A router's probe polls S's ``/ready`` every 50 ms (0.5 s timeout) from S's park to the end of its
takeover: it must answer 503 while S is parked, never 200 before every rank of S has agreed on the
promotion (each rank logs when), and 200 from its first 200 on. The time from the SIGKILL to that
first 200 is written beside the first token's.

Then, on the same daemons, a new standby S2 parks beside S (promoted) and the daemons are SIGKILLed:
sglang's daemon watchdog ends S2, which says why and the way back (start the daemons again, then the
primary and a new standby); that way, followed, brings a primary and a parked standby back.

Case 2: on daemons with auto repair off, A is SIGKILLed mid-move (``before_commit:1``): S must exit
by itself, promptly, with the dirty reason.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tools.realserver.engine_probes import StopPoint
from tools.realserver.model import PROMPTS
from tools.realserver.router_probe import TIMEOUT_S, ProbeAnswer, ReadyPoller, first_ready
from tools.realserver.server import (
    RealServer,
    RunDir,
    ServerSpec,
    StandaloneDaemons,
    StreamedReply,
    Topology,
    daemon_status,
    disk_reference,
    parked_engines,
    start_standby_beside,
    wait_parked,
)

from daemon_adapter.__main__ import NO_AUTO_REPAIR
from engine_adapter.roles import ROLE_ENV, STANDBY

from .conftest import REPO, daemon_versions

START_TIMEOUT_S = 600.0
STANDBY_ENV = {ROLE_ENV: STANDBY}
BUSY_LINE = "rebalance paused"
RESULTS = REPO / "build" / "standby-takeover.json"


def _wait(condition: Any, what: str, timeout_s: float, poll_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"{what} not within {timeout_s:.0f}s")


def _drive(server: RealServer, stop: threading.Event) -> None:
    """Requests to the primary until its ranks stop at the probe's point (a blocked request never returns)."""
    while not stop.is_set():
        try:
            server.generate(list(PROMPTS[:2]), max_new_tokens=8)
        except Exception:
            return


@dataclass
class Takeover:
    run: RunDir
    topology: Topology
    a_busy_lines: int
    versions_at_kill: list[int | None]
    parked_before: list[list[str]]
    health_parked: int
    held: dict[str, Any]
    streamed: StreamedReply
    killed_at: float
    killed_unix: float
    health_after: int
    s: RealServer
    record_map: list[list[int]]
    s_beliefs: dict[int, dict[str, Any]]
    s_log: str
    daemons_log: str
    ready_answers: list[ProbeAnswer]  # S's /ready, polled as a router does, from its park to after the takeover
    daemons: StandaloneDaemons  # still serving S, now the primary


@pytest.fixture(scope="module")
def takeover(realserver_lock: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Takeover]:
    run = RunDir(tmp_path_factory.mktemp("standby") / "run")
    topology = Topology(tiny_model)
    daemons = StandaloneDaemons(run, topology).start()
    s: RealServer | None = None
    poller: ReadyPoller | None = None
    try:
        daemons.wait_ready(START_TIMEOUT_S)
        a = RealServer(
            run,
            topology,
            ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=StopPoint("after_commit", 5)),
        ).start()
        s = start_standby_beside(run, a, ServerSpec("S", rebalance_iterations=100_000, extra_env=dict(STANDBY_ENV)))
        try:
            a.wait_ready(START_TIMEOUT_S)
            wait_parked(run, s, topology.tp_size, START_TIMEOUT_S)
            parked_before = parked_engines(run)
            try:
                health_parked = s.health()  # its 5 s timeout: a parked standby must still answer
            except OSError:  # no answer in time: the first test reports it
                health_parked = -1
            poller = ReadyPoller(s.url).start()
            held: dict[str, Any] = {}

            def send_held() -> None:
                try:
                    held["ids"] = s.generate([PROMPTS[0]], max_new_tokens=16)[0]
                except Exception as error:  # the assertion below reports it
                    held["error"] = repr(error)

            held_thread = threading.Thread(target=send_held, daemon=True)
            held_thread.start()
            stop = threading.Event()
            threading.Thread(target=_drive, args=(a, stop), daemon=True).start()
            a.wait_stopped(START_TIMEOUT_S)
            versions = daemon_versions(run)
            busy = a.log_text().count(BUSY_LINE)
            killed_at, killed_unix = time.monotonic(), time.time()  # the SIGKILL is sent now
        finally:
            a.kill()
        streamed = s.generate_streamed(PROMPTS[1], max_new_tokens=16)
        stop.set()
        held_thread.join(300)
        health_after = s.health()
        assert poller is not None
        ready_answers = poller.stop()
        record_map = daemon_status(run, include_map=True)["daemons"][0]["state"]["map"]
        yield Takeover(
            run,
            topology,
            busy,
            versions,
            parked_before,
            health_parked,
            held,
            streamed,
            killed_at,
            killed_unix,
            health_after,
            s,
            record_map,
            s.beliefs(),
            s.log_text(),
            run.log("daemons").read_text(errors="replace"),
            ready_answers,
            daemons,
        )
    finally:
        if poller is not None:
            poller.stop()
        if s is not None:
            s.kill()
        daemons.kill()


def _unix_marks(text: str, pattern: str) -> list[float]:
    return [float(m) for m in re.findall(pattern, text)]


def _takeover_marks(s_log: str) -> list[dict[str, float]]:
    """Each promoted rank's takeover marks (name: unix s), as it logged them, in rank order."""
    lines = re.findall(r"takeover times \(unix s\): (.*)", s_log)
    return [{k: float(v) for k, _, v in (m.partition("=") for m in line.split())} for line in lines]


@pytest.mark.timeout(3600)
@pytest.mark.slow("the module's takeover: daemons, a primary rebalancing beside a parked standby, its SIGKILL")
def test_the_primary_rebalances_while_the_standby_is_parked(takeover: Takeover) -> None:
    ran = takeover
    assert ran.parked_before == [[ran.parked_before[0][0]]] * ran.topology.tp_size, ran.parked_before
    assert ran.health_parked == 503, f"a parked standby's /health answered {ran.health_parked}"
    assert ran.versions_at_kill == [5] * ran.topology.tp_size, f"A did not commit 5 chunks: {ran.versions_at_kill}"
    assert ran.a_busy_lines == 0, f"A's rebalance was busy {ran.a_busy_lines} times with only a parked standby"


@pytest.mark.timeout(3600)
def test_the_standby_takes_over_with_the_records_layout(takeover: Takeover, tiny_model: Path) -> None:
    ran = takeover
    assert "ids" in ran.held, f"the request held by the parked standby failed: {ran.held}"
    assert ran.streamed.first_token is not None and len(ran.streamed.output_ids) == 16, ran.streamed
    assert ran.health_after == 200, f"the promoted standby's /health answered {ran.health_after}"
    for rank, belief in sorted(ran.s_beliefs.items()):
        assert belief["map"] == ran.record_map, f"S's rank {rank} routes with another map than the record"
        assert belief["version"] == 5, f"S's rank {rank}: {belief}"
    assert sorted(ran.s_beliefs) == list(range(ran.topology.tp_size)), ran.s_beliefs

    ref = disk_reference(ran.run.root.parent / "reference", ran.topology, ran.record_map).start()
    try:
        ref.wait_ready(START_TIMEOUT_S)
        assert ran.s.generate(list(PROMPTS)) == ref.generate(list(PROMPTS)), "S's outputs differ from the reference"
        assert ran.held["ids"] == ref.generate([PROMPTS[0]])[0], "the held request's output differs from the reference"
        assert ran.streamed.output_ids == ref.generate([PROMPTS[1]])[0], "the streamed output differs"
    finally:
        ref.kill()

    notices = _unix_marks(ran.daemons_log, r"no primary \(at unix ([0-9.]+)\)")
    times = re.findall(r"takeover times \(unix s\): (.*)", ran.s_log)
    parts: dict[str, Any] = {"daemon_notices_s": [round(t - ran.killed_unix, 3) for t in notices[-2:]]}
    for rank, line in enumerate(times):
        for mark in line.split():
            name, _, value = mark.partition("=")
            parts[f"rank{rank}_{name}_s"] = round(float(value) - ran.killed_unix, 3)
    first_token_s = ran.streamed.first_token - ran.killed_at
    ready = first_ready(ran.ready_answers, ran.killed_unix)
    result = {
        "first_token_after_kill_s": round(first_token_s, 3),
        "ready_200_after_kill_s": None if ready is None else round(ready.answered - ran.killed_unix, 3),
        "complete_after_kill_s": round(ran.streamed.done - ran.killed_at, 3),
        "parts": parts,
        "cold_server_ready_s": None if ref.ready_s is None else round(ref.ready_s, 1),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2))
    print(f"\nstandby takeover: {json.dumps(result)}")
    assert len(times) == ran.topology.tp_size, f"not every rank logged its takeover: {times}"


@dataclass
class MidMove:
    """A primary SIGKILLed mid-move beside a parked standby: the run, the standby, and when the kill was sent."""

    run: RunDir
    topology: Topology
    s: RealServer
    killed_at: float
    base_version: int | None


@contextlib.contextmanager
def _killed_mid_move(tmp_path: Path, tiny_model: Path, daemon_args: tuple[str, ...]) -> Iterator[MidMove]:
    run = RunDir(tmp_path / "run")
    topology = Topology(tiny_model)
    daemons = StandaloneDaemons(run, topology, extra_args=daemon_args).start()
    a = s = None
    try:
        daemons.wait_ready(START_TIMEOUT_S)
        mid_move = StopPoint("before_commit", 1)
        a = RealServer(
            run, topology, ServerSpec("A", rebalance_iterations=10, layers_per_chunk=1, stop_at=mid_move)
        ).start()
        s = start_standby_beside(run, a, ServerSpec("S", rebalance_iterations=100_000, extra_env=dict(STANDBY_ENV)))
        a.wait_ready(START_TIMEOUT_S)
        wait_parked(run, s, topology.tp_size, START_TIMEOUT_S)
        stop = threading.Event()
        threading.Thread(target=_drive, args=(a, stop), daemon=True).start()
        a.wait_stopped(START_TIMEOUT_S)
        base = daemon_versions(run)[0]
        killed = time.monotonic()
        a.kill()
        stop.set()
        yield MidMove(run, topology, s, killed, base)
    finally:
        for server in (a, s):
            if server is not None:
                server.kill()
        daemons.kill()


@pytest.mark.timeout(3600)
@pytest.mark.slow("a standby parked beside the promoted one, its daemons killed, then daemons, a primary, a standby")
def test_a_parked_standby_whose_daemons_die_says_why_and_its_way_back_works(takeover: Takeover) -> None:
    ran = takeover
    run, topology = ran.run, ran.topology
    s2 = start_standby_beside(run, ran.s, ServerSpec("S2", rebalance_iterations=100_000, extra_env=dict(STANDBY_ENV)))
    servers: list[RealServer] = [s2]
    again: StandaloneDaemons | None = None
    try:
        wait_parked(run, s2, topology.tp_size, START_TIMEOUT_S)
        ran.daemons.kill()
        code = s2.wait_exit(120.0)
        s2_log = s2.log_text()
        ran.s.kill()
        # The way back it names: the daemons again, then a primary and a new standby.
        again = StandaloneDaemons(run, topology).start()
        again.wait_ready(START_TIMEOUT_S)
        p = RealServer(run, topology, ServerSpec("P", rebalance_iterations=100_000)).start()
        servers.append(p)
        s3 = start_standby_beside(run, p, ServerSpec("S3", rebalance_iterations=100_000, extra_env=dict(STANDBY_ENV)))
        servers.append(s3)
        p.wait_ready(START_TIMEOUT_S)
        wait_parked(run, s3, topology.tp_size, START_TIMEOUT_S)
        answered = p.generate([PROMPTS[0]], max_new_tokens=8)
    finally:
        for server in servers:
            server.kill()
        if again is not None:
            again.kill()
    assert code is not None, f"the parked standby outlived its daemons: {s2.tree.log_tail()}"
    lost = [line for line in s2_log.splitlines() if "went away" in line]
    assert len(lost) == topology.tp_size, f"not every rank of S2 said why it ended:\n{s2_log[-3000:]}"
    for line in lost:
        assert "Start that daemon again" in line and "a new warm standby" in line, line
    assert len(answered) == 1 and len(answered[0]) == 8, answered


@pytest.mark.timeout(3600)
def test_a_primary_killed_mid_move_makes_the_standby_fail_dirty(
    realserver_lock: None, tiny_model: Path, tmp_path: Path
) -> None:
    """Auto repair off: the daemons stay dirty, and the standby exits by itself with the reason."""
    with _killed_mid_move(tmp_path, tiny_model, (NO_AUTO_REPAIR,)) as ran:
        code = ran.s.wait_exit(120.0)
        took = time.monotonic() - ran.killed_at
        assert code is not None, f"the standby did not exit after its primary died mid-move: {ran.s.tree.log_tail()}"
        log = ran.s.log_text()
        assert "claim refused" in log and "dirty" in log, log[-3000:]
        assert "expert-layout repair" in log, log[-3000:]
        assert took < 30.0, f"the standby failed only {took:.1f}s after the kill"


@pytest.mark.timeout(3600)
def test_a_standby_waits_out_the_repair_of_its_primarys_torn_move(
    realserver_lock: None, tiny_model: Path, tmp_path: Path
) -> None:
    """Auto repair on (the default): the daemons repair the torn move, then tell the standby, which takes
    over at the base version instead of failing."""
    with _killed_mid_move(tmp_path, tiny_model, ()) as ran:
        health = _wait(lambda: ran.s.health() == 200 or not ran.s.tree.alive(), "the standby's takeover", 120.0)
        assert ran.s.tree.alive() and health, f"the standby did not take over: {ran.s.tree.log_tail()}"
        took = time.monotonic() - ran.killed_at
        states = daemon_status(ran.run, include_map=True)["daemons"]
        assert [(d["state"]["phase"], d["state"]["version"]) for d in states] == [
            ("clean", ran.base_version)
        ] * ran.topology.tp_size
        beliefs = ran.s.beliefs()
        assert sorted(beliefs) == [0, 1], beliefs
        for belief in beliefs.values():
            assert (belief["version"], belief["map"]) == (ran.base_version, states[0]["state"]["map"]), belief
        assert len(ran.s.generate([PROMPTS[0]])[0]) == 16
        daemons_log = ran.run.log("daemons").read_text(errors="replace")
        assert daemons_log.count("daemon is now REPAIRING") == ran.topology.tp_size, daemons_log[-3000:]
        print(f"\nstandby took over after the repair {took:.2f}s after the SIGKILL")


@pytest.mark.timeout(3600)
def test_a_routers_ready_probe_sees_the_standby_only_once_promoted_on_every_rank(takeover: Takeover) -> None:
    ran = takeover
    answers = ran.ready_answers
    marks = _takeover_marks(ran.s_log)
    assert len(marks) == ran.topology.tp_size and all("agreed" in m for m in marks), marks
    agreed = max(m["agreed"] for m in marks)  # the promotion has agreed on every rank
    parked = [a for a in answers if a.answered < ran.killed_unix]
    assert parked and all(a.status == 503 for a in parked), f"/ready of the parked standby: {parked}"
    early = [a for a in answers if a.status == 200 and a.answered < agreed]
    assert not early, f"/ready answered 200 {agreed - early[0].answered:.3f}s before every rank agreed: {early}"
    ready = first_ready(answers, ran.killed_unix)
    assert ready is not None, f"/ready never answered 200 after the takeover: {answers[-20:]}"
    after = [a for a in answers if a.sent >= ready.answered]
    assert after and all(a.status == 200 for a in after), f"/ready after its first 200: {after}"
    unanswered = sum(1 for a in answers if a.status is None)
    print(
        f"\n/ready: {len(parked)} answers 503 while parked, first 200 {ready.answered - ran.killed_unix:.3f}s after "
        f"the SIGKILL ({ready.answered - agreed:.3f}s after every rank agreed), {unanswered} of {len(answers)} "
        f"requests unanswered within {TIMEOUT_S}s"
    )
