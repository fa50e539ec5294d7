"""TLC on the traces (``tools.mirror.trace_tla``, ``spec/TraceLayoutProtocol.tla``).

Real ``LayoutAwareDaemon`` serve loops on real Unix sockets replay one behaviour of TLC's suite and
write their traces. The generated module must be TLA+ that parses (CI, without TLC) and hold every
step the Python checker replayed. Where TLC is present it must accept those traces, and reject them
once a daemon's answer is changed, naming that step among those due where no behaviour goes on.
An engine's decisions are its ranks' (one rank's a prefix of another's), and ranks that decided
differently on the same all-gathers are refused before TLC runs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import tla
from tools.mirror.check_spec import find_jar
from tools.mirror.system import load_model
from tools.mirror.trace_tla import check_with_tlc, engine_logs, module, runs
from tools.trace_check import check_all

from layout_sm.trace_codec import TRACE_ENV
from tests.model_based.daemon_hosts import InProcessHost
from tests.model_based.suites import SPEC
from tests.model_based.test_replay_adapters import replay_on_adapters
from tests.model_based.test_replay_mirror import load

JAR, _ = find_jar()
needs_tlc = pytest.mark.skipif(JAR is None, reason="TLC is missing (TLA2TOOLS_JAR): the Python checker runs in CI")


def _moving_behaviour(model: str) -> int:
    """A behaviour of the suite that commits a move on both daemons and never restarts one (its
    daemons keep one socket each)."""
    suite = load(model)
    for k, (_, _, steps) in enumerate(suite.paths):
        labels = [label for label, _ in steps]
        if sum(label.startswith("Commit(") for label in labels) >= 2 and not any(
            label.startswith(("Restart", "Lose")) for label in labels
        ):
            return k
    raise AssertionError(f"no behaviour of {model}'s suite commits a move without a restart")


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("traces")
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory(prefix="tla-", dir="/tmp") as tmp:
        patch.setenv(TRACE_ENV, str(folder))
        host = InProcessHost(Path(tmp), load_model(SPEC, "MCSmall").repairs)
        problems, _ = replay_on_adapters("MCSmall", load("MCSmall"), host, [_moving_behaviour("MCSmall")])
    assert not problems, problems
    return folder


def test_the_generated_module_is_tla_and_holds_every_step_the_python_checker_replayed(traces: Path) -> None:
    (run,) = runs([traces])
    replayed = sum(v.steps for v in check_all([traces]) if v.kind == "daemon")
    assert [log.rank for log in run.logs] == [1, 2]
    assert run.steps == replayed > 0
    tla_text, cfg = module(run)
    assert tla.parse(tla_text) is not None
    assert 'ev |-> "commit"' in tla_text and "INVARIANT TraceAccepted" in cfg


@needs_tlc
def test_tlc_accepts_the_traces_of_a_behaviour_of_the_spec(traces: Path) -> None:
    assert JAR is not None
    (run,) = runs([traces])
    verdict = check_with_tlc(JAR, run)
    assert verdict.accepted, verdict.report


@needs_tlc
def test_tlc_rejects_a_changed_answer_and_names_its_step(traces: Path, tmp_path: Path) -> None:
    assert JAR is not None
    for path in sorted(traces.glob("daemon-*.ndjson")):
        (tmp_path / path.name).write_text(path.read_text())
    changed = sorted(tmp_path.glob("daemon-*.ndjson"))[0]
    lines = [json.loads(text) for text in changed.read_text().splitlines()]
    begun = next(line for line in lines if line.get("event") == "begin" and line["answer"]["status"] == "ok")
    begun["answer"]["status"] = "busy"
    changed.write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run,) = runs([tmp_path])
    verdict = check_with_tlc(JAR, run)
    assert not verdict.accepted
    assert f"{changed.name}:{begun['seq']} begin" in verdict.report, verdict.report


def _rank_trace(engine: str, rank: int, steps: list[tuple[str, dict[str, object]]]) -> list[dict[str, object]]:
    """An engine rank's trace lines: its start, then each (event, view after); ``rebalance_end`` as written."""
    lines: list[dict[str, object]] = [{"seq": 1, "kind": "start", "engine_id": engine, "rank": rank}]
    for seq, (event, after) in enumerate(steps, start=2):
        if event == "rebalance_end":
            lines.append({"seq": seq, "kind": "rebalance_end"})
        else:
            lines.append({"seq": seq, "kind": "step", "event": event, "after": after, "result": None})
    return lines


_AGREED = {"phase": "load", "version": 0, "shares": True, "rebalance": "starting"}
_MOVING = {"phase": "load", "version": 0, "shares": True, "rebalance": "moving"}


def test_an_engine_s_decisions_are_its_longest_rank_s_and_every_rank_must_agree() -> None:
    rank0 = _rank_trace("E", 0, [("agree", _AGREED), ("begin", _AGREED), ("decide", _MOVING), ("rebalance_end", {})])
    rank1 = _rank_trace("E", 1, [("agree", _AGREED), ("begin", _AGREED), ("decide", _MOVING)])  # died first
    (log,) = engine_logs({Path("engine-E-r0.ndjson"): rank0, Path("engine-E-r1.ndjson"): rank1}, set())
    assert [record["ev"] for record in log.records] == ["agree", "decide", "rebalance_end"]
    assert log.records[1]["step"] == "move" and log.records[1]["share"] is True
    assert log.origins[2] == "engine-E-r0.ndjson:5 rebalance_end"

    aborting = _rank_trace("E", 1, [("agree", _AGREED), ("decide", {**_MOVING, "rebalance": "aborting"})])
    with pytest.raises(ValueError, match=r"engine-E-r1\.ndjson: its decisions differ"):
        engine_logs({Path("engine-E-r0.ndjson"): rank0, Path("engine-E-r1.ndjson"): aborting}, set())
