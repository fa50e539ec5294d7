"""Engine rank traces (``engine_adapter.trace.EngineTrace``) and the checks that take them
(``tools.trace_check``): each rank's trace replays on the protocol's engine machines, and each answer a
rank took from its daemon is one that daemon's trace gave it.

Real rank processes over gloo run sglang's EPLB rebalance against real daemon processes; then the
checker must be able to fail on what a broken engine would write: a rebalance that ends with its
last commits unverified, an answer that its daemon never gave, memory that a clean record does not
name, and a map sglang routes with that is not the session's (an install that left a layer out).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import ea_scripts
import pytest
from ea_helpers import OtherEngine, rotated_map
from tools.trace_check import check_all

from layout_sm.trace_codec import TRACE_ENV


def _start_then(ranks: Any, daemons: Any, rebalance: Any) -> list[Any]:
    """One engine, one rank per daemon, started, then ``rebalance`` (a script of ``ea_scripts``) run at
    phase 1, one layer a chunk: each rank's result, every one ok."""
    d = daemons()
    results = ranks.run(ea_scripts.start_load, ea_scripts.spec(d.sockets, layers_per_chunk=1))
    assert all(r.ok for r in results), [r.trace for r in results]
    results = ranks.run(rebalance, 1)
    assert all(r.ok for r in results), [r.trace for r in results]
    return results


def _rebalanced(ranks: Any, daemons: Any, traces: Path, copy_to: Path | None = None) -> list[Path]:
    """One engine, one rank per daemon, rebalancing one layer a chunk: the traces it wrote (copied to
    ``copy_to``, to be broken there: the originals are checked after the test)."""
    started = time.time()
    _start_then(ranks, daemons, ea_scripts.rebalance)
    ranks.run(ea_scripts.stop)
    written = [path for path in traces.glob("*.ndjson") if path.stat().st_mtime >= started]
    if copy_to is None:
        return written
    copy_to.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy(path, copy_to / path.name)) for path in written]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_each_ranks_trace_replays_and_its_answers_are_its_daemons(ranks, daemons, traces: Path) -> None:
    assert os.environ[TRACE_ENV] == str(traces)
    written = _rebalanced(ranks, daemons, traces)
    engines = [path for path in written if path.name.startswith("engine-")]
    assert len(engines) == 2, written
    verdicts = check_all(written)
    assert all(v.ok for v in verdicts), [v.divergence for v in verdicts if v.divergence]
    (answers,) = [v for v in verdicts if v.kind == "answers"]
    events = [line.get("event") for line in _lines(engines[0])]
    chunks = events.count("chunk")
    # Every rank's begin answers (gathered); its own commit answer only (the others' come as owed).
    assert chunks >= 2 and events.count("begin") == 2 * chunks and events.count("commit") == chunks, events
    # Each rank's own begin and commit of every chunk was matched with its daemon's step.
    assert answers.matched == 2 * 2 * chunks, answers
    kinds = [line["kind"] for line in _lines(engines[0])]
    assert "rebalance_end" in kinds
    assert kinds.count("routes") == chunks, kinds  # sglang's map read back after each move


def test_a_rebalance_broken_mid_chunk_is_not_traced_as_ended(ranks, daemons, traces: Path) -> None:
    """sglang's move raises on every rank (a peer's death breaks its collective): the chunk is neither
    committed nor aborted, so no rank's session is told the rebalance ended and no trace says it did."""
    started = time.time()
    results = _start_then(ranks, daemons, ea_scripts.rebalance_with_a_broken_move)
    assert [(r.value["error"] != "", r.value["phase"]) for r in results] == [(True, "moving")] * 2, results
    engines = [p for p in traces.glob("engine-*.ndjson") if p.stat().st_mtime >= started]
    assert len(engines) == 2, engines
    for path in engines:
        kinds = [(line["kind"], line.get("event")) for line in _lines(path)]
        assert ("step", "decide") in kinds and "rebalance_end" not in [k for k, _ in kinds], kinds


def test_a_rebalance_that_ends_with_its_commits_unverified_is_reported(
    ranks, daemons, traces: Path, tmp_path: Path
) -> None:
    written = _rebalanced(ranks, daemons, traces, tmp_path)
    engine = sorted(path for path in written if path.name.startswith("engine-"))[0]
    lines = _lines(engine)
    # What a build that skips the rebalance's last all-gather writes: its verify steps are missing.
    kept = [line for line in lines if line.get("event") not in ("owed_gathered", "verify")]
    assert len(kept) < len(lines), "the rebalance ended with no check owed"
    _write(engine, kept)
    (verdict,) = [v for v in check_all([engine]) if v.kind == "engine"]
    assert verdict.divergence is not None, verdict
    assert verdict.divergence.line["kind"] == "rebalance_end"
    assert "commits owed" in verdict.divergence.report(engine)


def test_an_answer_the_daemon_never_gave_is_reported(ranks, daemons, traces: Path, tmp_path: Path) -> None:
    written = _rebalanced(ranks, daemons, traces, tmp_path)
    engine = next(path for path in sorted(written) if path.name.startswith("engine-") and "-r1-" in path.name)
    socket = _lines(engine)[0]["socket"]
    daemon = next(path for path in written if path.name.startswith("daemon-") and _lines(path)[0]["socket"] == socket)
    # Rank 1's daemon never recorded the last chunk: its commit step is gone from the daemon's trace.
    lines = _lines(daemon)
    last_commit = max(n for n, line in enumerate(lines) if line.get("event") == "commit")
    _write(daemon, lines[:last_commit])
    verdicts = check_all(written)
    (answers,) = [v for v in verdicts if v.kind == "answers"]
    assert answers.divergence is not None, answers
    report = answers.divergence.report(answers.path)
    assert "rank 1 took a commit answer that its daemon" in report and "never gave it" in report, report
    # The engine's own trace is still a behaviour: only the daemon's word is missing.
    assert all(v.ok for v in verdicts if v.kind == "engine")


def test_memory_that_differs_from_a_clean_record_is_reported(ranks, daemons, traces: Path, tmp_path: Path) -> None:
    written = _rebalanced(ranks, daemons, traces, tmp_path)
    verdicts = check_all(written)
    assert sum(v.truths for v in verdicts) == 2, verdicts  # each rank read its daemon's memory once
    engine = next(path for path in sorted(written) if path.name.startswith("engine-") and "-r0-" in path.name)
    socket = _lines(engine)[0]["socket"]
    # Rank 0's reading of its daemon's memory (a probe's file of its own, on that daemon's socket).
    probe = next(path for path in written if path.name.startswith("probe-") and _lines(path)[0]["socket"] == socket)
    lines = _lines(probe)
    (truth,) = [line for line in lines if line["kind"] == "truth"]
    # What a rank reads where an expert moved with no begin and commit: layer 0's first slot holds another.
    truth["slots"][0][0] += 1
    _write(probe, lines)
    (daemon,) = [v for v in check_all(written) if v.kind == "daemon" and not v.ok]
    report = daemon.divergence.report(daemon.path)
    assert "memory holds another layout: layer 0" in report, report


def test_a_map_sglang_routes_with_other_than_the_sessions_is_reported(
    ranks, daemons, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = daemons()
    other = OtherEngine(d.paths)
    other.move(list(range(d.cfg.num_layers)), rotated_map(d.cfg))
    other.detach()
    # The broken build's traces go to a folder of their own: the session's traces stay behaviours.
    broken = tmp_path / "broken"
    monkeypatch.setenv(TRACE_ENV, str(broken))
    results = ranks.run(ea_scripts.start_installing_all_but_layer_0, ea_scripts.spec(d.sockets))
    ranks.run(ea_scripts.stop)
    assert [r.value["kind"] for r in results] == ["adopt", "adopt"], [r.trace for r in results]
    verdicts = [v for v in check_all(sorted(broken.glob("engine-*.ndjson"))) if v.kind == "engine"]
    assert len(verdicts) == 2 and all(v.divergence is not None for v in verdicts), verdicts
    for verdict in verdicts:
        assert verdict.divergence.line["kind"] == "routes", verdict.divergence
        assert "sglang routes with the map of digest" in verdict.divergence.report(verdict.path)


def test_an_answer_taken_before_its_daemon_gave_it_is_reported(ranks, daemons, traces: Path, tmp_path: Path) -> None:
    written = _rebalanced(ranks, daemons, traces, tmp_path)
    engine = next(path for path in sorted(written) if path.name.startswith("engine-") and "-r1-" in path.name)
    socket = _lines(engine)[0]["socket"]
    daemon = next(path for path in written if path.name.startswith("daemon-") and _lines(path)[0]["socket"] == socket)
    given = next(line for line in _lines(daemon) if line.get("event") == "begin")
    # What a rank writes that stamped its begin answer 1 ms before its daemon's step that gave it.
    lines = _lines(engine)
    taken = next(line for line in lines if line.get("event") == "begin" and line["arguments"].get("rank") == 1)
    taken["t_ns"] = given["t_ns"] - 1_000_000
    _write(engine, lines)
    (answers,) = [v for v in check_all(written) if v.kind == "answers"]
    assert answers.divergence is not None, answers
    report = answers.divergence.report(answers.path)
    assert "took a begin answer 1.000 ms before its daemon" in report, report
