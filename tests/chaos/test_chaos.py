"""``make chaos`` on a few seeds: schedules drawn from a seed replay the same, SIGKILLs land inside
protocol steps, and every schedule ends with its traces checked and a working engine."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tools.chaos import real
from tools.chaos.campaign import draw
from tools.mirror.check_spec import find_jar

ROOT = Path(__file__).resolve().parents[2]
MUTANTS_SITE = ROOT / "tests" / "model_based" / "mutants" / "site"


def test_a_seed_draws_the_same_schedule() -> None:
    assert draw(7) == draw(7)
    assert any(draw(seed) != draw(7) for seed in range(8, 12))
    kills = [op.kill for seed in range(200) for op in draw(seed) if op.kill is not None]
    assert {event for event, _, _ in kills} >= {"begin", "move", "commit", "attach", "agree", "fetch"}
    assert any(op.kind == "die_in_reload" for seed in range(20) for op in draw(seed))


def test_any_three_real_seeds_in_a_row_take_every_follower() -> None:
    for first in range(1, 10):
        assert {real.draw(seed).follower for seed in range(first, first + 3)} == set(real.FOLLOWERS)
    assert real.draw(2) == real.draw(2)
    assert not any(real.draw(seed).restart for seed in range(30) if real.draw(seed).follower == "standby")


def test_harness_daemons_repair_a_torn_move_and_rejoin(tmp_path: Path) -> None:
    """Seeds 5 and 18 tear a move (a rank killed between sglang's move and its commit) and restart a
    daemon under a moved record: the daemons repair from the toy's checkpoint on their own, and the
    restarted one rejoins when the next engine asks; the last engine then starts from the daemons."""
    done = _campaign(tmp_path, "--seed", "5", "--schedules", "1")
    done18 = _campaign(tmp_path / "18", "--seed", "18", "--schedules", "1")
    assert done.returncode == 0 and done18.returncode == 0, done.stdout[-4000:] + done18.stdout[-4000:]
    steps = collections.Counter()
    for folder in (tmp_path, tmp_path / "18"):
        [outcome] = [json.loads(line) for line in (folder / "schedules.ndjson").read_text().splitlines()]
        assert outcome["ok"], outcome["problems"]
        assert not any("restarted for the last engine" in note for note in outcome["notes"]), outcome["notes"]
        steps.update(outcome["daemon_steps"])
    assert steps["repair_done"] >= 2 and steps["rejoin"] >= 1, steps


@pytest.mark.skipif(find_jar()[0] is None, reason="TLC is missing (TLA2TOOLS_JAR): CI runs the Python checker")
def test_tlc_accepts_a_schedule_with_a_repair_and_a_rejoin(tmp_path: Path) -> None:
    done = _campaign(tmp_path, "--seed", "5", "--schedules", "1", "--tlc")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    [outcome] = [json.loads(line) for line in (tmp_path / "schedules.ndjson").read_text().splitlines()]
    assert outcome["daemon_steps"].get("rejoin") and "TLC: behaviour" in outcome["tlc"], outcome
    assert "TLC accepted the traces of 1 of 1 schedules" in (tmp_path / "summary.md").read_text()
    assert outcome["tlc_ok"] and ", 3 engines," in outcome["tlc"], outcome["tlc"]  # their decisions too


def _campaign(out: Path, *args: str, mutant: str = "") -> subprocess.CompletedProcess[str]:
    """``tools.chaos`` with ``args`` on the harness alone; ``mutant``: that mutant of
    tests/model_based/mutants in every process of the campaign."""
    # Its own process: the ranks are forked from it, which a test process that ran torch ops cannot do.
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
    if mutant:
        env |= {"PYTHONPATH": f"{MUTANTS_SITE}:{env['PYTHONPATH']}", "LAYOUT_MUTANT": mutant}
    return subprocess.run(
        [sys.executable, "-m", "tools.chaos", *args, "--real", "0", "--jobs", "1", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_campaign_runs_schedules_and_checks_their_traces(tmp_path: Path) -> None:
    # Its own process: the ranks are forked from it, which a test process that ran torch ops cannot do.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.chaos",
            "--seed",
            "200",
            "--schedules",
            "6",
            "--real",
            "0",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    outcomes = [json.loads(line) for line in (tmp_path / "schedules.ndjson").read_text().splitlines()]
    assert sorted(o["seed"] for o in outcomes) == list(range(200, 206))
    assert all(o["ok"] and "every trace is a behaviour of the protocol" in o["traces"] for o in outcomes)
    assert sum(o["kills"] for o in outcomes) > 0  # seeds 200..205 fire kill points inside protocol steps
    assert "6 harness schedules" in (tmp_path / "summary.md").read_text()


@pytest.mark.skipif(find_jar()[0] is None, reason="TLC is missing (TLA2TOOLS_JAR): CI runs the Python checker")
def test_tlc_catches_an_engine_that_skips_the_commit_verification(tmp_path: Path) -> None:
    # Seed 159 rebalances with no fault: the rebalance's end is in the engine's log with the last
    # chunk's check still owed, which no behaviour of the spec allows.
    done = _campaign(tmp_path, "--seed", "159", "--schedules", "1", "--tlc", mutant="engine_skips_commit_verification")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    [outcome] = [json.loads(line) for line in (tmp_path / "schedules.ndjson").read_text().splitlines()]
    assert outcome["tlc_ok"] is False, outcome["tlc"]
    assert any("TLC: not a behaviour" in p and " rebalance_end): " in p for p in outcome["problems"]), outcome


def test_the_campaign_catches_an_engine_that_skips_the_commit_verification(tmp_path: Path) -> None:
    # The mutant (tests/model_based/mutants) breaks the adapter in every process of the campaign; the
    # checker replays the traces on layout_sm's own session, which the mutant leaves alone. Seed 159's
    # rebalances end on their own (a reply fault would end one at a failed check instead).
    done = _campaign(tmp_path, "--seed", "159", "--schedules", "1", mutant="engine_skips_commit_verification")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    assert "commits owed" in done.stdout and 'replay: make chaos CHAOS_ARGS="--seed ' in done.stdout
