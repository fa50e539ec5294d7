"""The spec oracle's trace check (``tools.oracle.traces``, ``python -m tools.oracle``).

Why: it judges a run's traces with no ``layout_sm`` in the judge. It must accept a real run (the shrunk
harness schedule in ``fixtures/``), and reject the same traces with one line changed, naming that line:
a commit whose logged version did not advance, a chunk's decision that went another way. Where TLC is
(``TLA2TOOLS_JAR``), TLC's verdict on the same logs (``tools.mirror.trace_tla``) must be the oracle's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tools.mirror.check_spec import find_jar
from tools.mirror.trace_tla import check_with_tlc, runs
from tools.oracle.__main__ import main
from tools.oracle.traces import OracleVerdict, check_paths

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "rank-killed-mid-chunk"
DAEMON0 = "daemon-tp0-rank0-8551"
ENGINE = "engine-vm-8555-7eb332b5c7c9"

JAR, _ = find_jar()
needs_tlc = pytest.mark.skipif(JAR is None, reason="TLC is missing (TLA2TOOLS_JAR)")


def _changed(tmp: Path, name_part: str, seq: int, change: Callable[[dict[str, Any]], None]) -> Path:
    """A copy of the fixture where line ``seq`` of every trace whose name holds ``name_part`` is changed."""
    out = tmp / FIXTURE.name
    shutil.copytree(FIXTURE, out)
    touched = 0
    for path in sorted(out.glob(f"*{name_part}*.ndjson")):
        lines = [json.loads(text) for text in path.read_text().splitlines()]
        assert lines[seq - 1]["seq"] == seq
        change(lines[seq - 1])
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        touched += 1
    assert touched
    return out


def _version_not_advanced(line: dict[str, Any]) -> None:
    assert (line["event"], line["after"]["version"]) == ("commit", 1)
    line["after"]["version"] = 0


def _decided_to_abort(line: dict[str, Any]) -> None:
    assert (line["event"], line["after"]["rebalance"]) == ("decide", "moving")
    line["after"]["rebalance"] = "aborting"


def _one(paths: list[Path]) -> OracleVerdict:
    (verdict,) = check_paths(paths)
    return verdict


def test_the_oracle_accepts_a_harness_run() -> None:
    verdict = _one([FIXTURE])
    assert verdict.accepted, verdict.report()
    assert (verdict.steps, verdict.taken) == (30, 30)
    assert main([str(FIXTURE)]) == 0


def test_a_commit_whose_version_did_not_advance_is_rejected_at_its_line(tmp_path: Path) -> None:
    broken = _changed(tmp_path, DAEMON0, 5, _version_not_advanced)
    verdict = _one([broken])
    assert not verdict.accepted
    first = verdict.first
    assert first is not None and (first.source.path.stem, first.source.line) == (DAEMON0, 5), verdict.report()
    assert f"{broken / DAEMON0}.ndjson:5" in verdict.report()
    assert first.enabled and first.why.endswith("gives ver = 1 (logged: 0)"), first.why
    assert main([str(broken)]) == 1


def test_a_decision_that_went_another_way_is_rejected_at_its_line(tmp_path: Path) -> None:
    broken = _changed(tmp_path, ENGINE, 3, _decided_to_abort)
    verdict = _one([broken])
    assert not verdict.accepted
    first = verdict.first
    assert first is not None and first.who == f"engine {ENGINE}", verdict.report()
    assert ENGINE in first.source.path.name and first.source.line == 3, verdict.report()
    # The spec's Decide there is enabled and goes another way: to "move", or (a begin lost on its way)
    # to "idle" with rebalancing off; the report names what the logged line says otherwise.
    assert first.enabled and "but gives" in first.why and "(logged: " in first.why, first.why


Plant = tuple[str, int, Callable[[dict[str, Any]], None]]


@needs_tlc
@pytest.mark.parametrize(
    "plant",
    [None, (DAEMON0, 5, _version_not_advanced), (ENGINE, 3, _decided_to_abort)],
    ids=["as-run", "commit", "decide"],
)
def test_tlc_s_verdict_is_the_oracle_s(plant: Plant | None, tmp_path: Path) -> None:
    assert JAR is not None
    folder = FIXTURE if plant is None else _changed(tmp_path, *plant)
    (run,) = runs([folder])
    tlc = check_with_tlc(JAR, run)
    oracle = _one([folder])
    assert oracle.accepted == tlc.accepted == (plant is None), (oracle.report(), tlc.report)
