"""Runs every scenario of one engine session under testdata/session/ (see datadriven_session.py)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from .datadriven import maybe_rewrite, run_file
from .datadriven_session import SessionRunner

FILES = sorted((Path(__file__).parent / "testdata" / "session").glob("*.txt"))


def test_there_are_session_scenarios() -> None:
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_session_scenario(path: Path) -> None:
    written, produced = run_file(path, SessionRunner())
    if maybe_rewrite(path, produced):
        return
    diff = "".join(difflib.unified_diff(written.splitlines(True), produced.splitlines(True), "written", "now"))
    assert written == produced, f"{path.name} differs (REWRITE=1 regenerates it; review the diff):\n{diff}"
