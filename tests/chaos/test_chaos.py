"""``make chaos`` on a few seeds: schedules drawn from a seed replay the same, SIGKILLs land inside
protocol steps, and every schedule ends with its traces checked and a working engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tools.chaos.campaign import draw

ROOT = Path(__file__).resolve().parents[2]


def test_a_seed_draws_the_same_schedule() -> None:
    assert draw(7) == draw(7)
    assert any(draw(seed) != draw(7) for seed in range(8, 12))
    kills = [op.kill for seed in range(200) for op in draw(seed) if op.kill is not None]
    assert {event for event, _, _ in kills} >= {"begin", "move", "commit", "attach", "agree", "fetch"}


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


def test_the_campaign_catches_an_engine_that_skips_the_commit_verification(tmp_path: Path) -> None:
    # The mutant (tests/model_based/mutants) breaks the adapter in every process of the campaign; the
    # checker replays the traces on layout_sm's own session, which the mutant leaves alone.
    site = ROOT / "tests" / "model_based" / "mutants" / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.chaos",
            "--seed",
            "1",
            "--schedules",
            "2",
            "--jobs",
            "1",
            "--real",
            "0",
            "--out",
            str(tmp_path),
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": f"{site}:{ROOT / 'src'}:{ROOT}",
            "LAYOUT_MUTANT": "engine_skips_commit_verification",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    assert "commits owed" in done.stdout and 'replay: make chaos CHAOS_ARGS="--seed 1' in done.stdout
