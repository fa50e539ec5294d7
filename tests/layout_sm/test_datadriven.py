"""Runs every scenario file under testdata/ (see datadriven.py for the format)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from .datadriven import maybe_rewrite, run_file

FILES = sorted((Path(__file__).parent / "testdata").glob("*.txt"))


def test_there_are_scenarios() -> None:
    assert len(FILES) >= 5


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_scenario(path: Path) -> None:
    written, produced = run_file(path)
    if maybe_rewrite(path, produced):
        return
    diff = "".join(difflib.unified_diff(written.splitlines(True), produced.splitlines(True), "written", "now"))
    assert written == produced, f"{path.name} differs (REWRITE=1 regenerates it; review the diff):\n{diff}"
