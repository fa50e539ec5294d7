"""``make chaos`` must catch a planted bug: each case copies ``src/`` into a scratch folder, changes one
line there, and runs a few harness schedules on the copy (its daemons and ranks alike); the campaign
must fail and name the check that caught it. The same seeds on the unbroken build must pass, so a
case that fails for another reason shows up there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAOS_TIMEOUT_S = 300


@dataclass(frozen=True)
class Planted:
    """A one-line bug in ``path`` (under ``src/``) and the schedules and check that catch it."""

    path: str
    original: str
    broken: str
    seeds: tuple[int, ...]  # the first seed and the number of schedules: --seed, --schedules
    caught_by: tuple[str, ...]  # words of the failing schedule's problems that name the checks, each one
    missed_by: tuple[str, ...] = ()  # a check that must not see it (the build's own checker, for a core bug)


BUGS = {
    # A commit whose record keeps its version, in the daemons and the ranks alike. tools.trace_check
    # replays the traces on this very layout_sm and finds them consistent: the core judges itself. The
    # independent oracle, which shares no code with layout_sm, names the daemon's commit line.
    "commit_keeps_version": Planted(
        "layout_sm/record.py",
        "self.num_layers, self.num_physical, self.num_logical, self.version + 1, tuple(new_layers)",
        "self.num_layers, self.num_physical, self.num_logical, self.version, tuple(new_layers)",
        (2, 1),
        ("the independent oracle: not a behaviour of the spec", "gives ver = 1 (logged: 0)"),
        ("a trace is not a behaviour of the protocol",),
    ),
    # The owed commit check passes a refused or missing answer: the engine goes on rebalancing over a
    # daemon that never recorded its commit (seed 2's reply fault loses one), and its next begin there
    # is refused; the campaign's check of a faulted commit sees the rebalance end other than unverified.
    "owed_check_skips_missing": Planted(
        "layout_sm/rebalance_rules.py",
        "return all(a is not None and a.ok and a.version == v.version and a.digest == v.digest for a in v.owed)",
        "return all(a is None or not a.ok or (a.version == v.version and a.digest == v.digest) for a in v.owed)",
        (2, 1),
        ("not commit_unverified",),
    ),
    # sglang moves a chunk the session did not let it move: in seed 3 the newest engine's begin is
    # refused as busy (an older engine maps the same weights), and the older one then routes to
    # experts the move took from under it. The same line moves after a failed check or a refusal.
    "moves_when_told_not_to": Planted(
        "engine_adapter/rebalance.py",
        "        raise _StopRebalance\n    return st.move_result",
        "        return original(*args, **kwargs)\n    return st.move_result",
        (3, 1),
        ("routes to the wrong expert",),
    ),
    # The adopted map reaches every layer's routing but the first one (seed 81's last engine adopts a
    # moved first layer).
    "install_skips_a_layer": Planted(
        "engine_adapter/runner.py",
        "metadata.update(adopted, update_layer_ids=list(range(metadata.num_layers)))",
        "metadata.update(adopted, update_layer_ids=list(range(1, metadata.num_layers)))",
        (81, 1),
        ("routes to the wrong expert",),
    ),
}


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A short folder for the campaign's schedules: a daemon's socket path must stay within the
    kernel's 107 bytes, which pytest's tmp_path and the campaign's folders together can pass."""
    path = Path(tempfile.mkdtemp(prefix="chaos-planted-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _plant(folder: Path, bug: Planted) -> Path:
    """A copy of ``src/`` and ``tools/`` in ``folder`` with ``bug`` in it (the test breaks loudly if the
    line moved): the campaign runs from there, so its children, daemons included, import that ``src/``
    (``tools.with_project_path`` names the copy's own)."""
    for part in ("src", "tools"):
        shutil.copytree(ROOT / part, folder / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target = folder / "src" / bug.path
    text = target.read_text()
    assert text.count(bug.original) == 1, f"{bug.path} no longer holds the planted bug's line: {bug.original!r}"
    target.write_text(text.replace(bug.original, bug.broken))
    return folder


def _chaos(
    root: Path, out: Path, seeds: tuple[int, ...], scratch: Path
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """The campaign run from ``root`` (its ``src/`` and ``tools/``); its schedules' folders under
    ``scratch`` (a failing one is kept for its replay: the fixture removes it)."""
    first, count = seeds
    # Its own process: the ranks are forked from it, which a test process that ran torch ops cannot do.
    args = ["--seed", str(first), "--schedules", str(count), "--real", "0", "--jobs", "1", "--no-tlc"]
    done = subprocess.run(
        [sys.executable, "-m", "tools.chaos", *args, "--out", str(out)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root / 'src'}:{root}", "TMPDIR": str(scratch)},
        capture_output=True,
        text=True,
        timeout=CHAOS_TIMEOUT_S,
    )
    outcomes = [json.loads(line) for line in (out / "schedules.ndjson").read_text().splitlines()]
    return done, outcomes


@pytest.mark.slow("harness schedules on a copy of src with a planted bug")
@pytest.mark.parametrize("name", list(BUGS))
def test_the_campaign_catches_a_planted_bug(name: str, tmp_path: Path, scratch: Path) -> None:
    bug = BUGS[name]
    done, outcomes = _chaos(_plant(tmp_path, bug), tmp_path / "out", bug.seeds, scratch)
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]
    problems = [p for o in outcomes if not o["ok"] for p in o["problems"]]
    for words in bug.caught_by:
        assert any(words in p for p in problems), (words, problems)
    for words in bug.missed_by:
        assert not any(words in p for p in problems), (words, problems)


@pytest.mark.slow("the planted bugs' seeds on the unbroken build")
def test_the_planted_bugs_seeds_pass_unbroken(tmp_path: Path, scratch: Path) -> None:
    for n, seeds in enumerate(sorted({bug.seeds for bug in BUGS.values()})):
        done, outcomes = _chaos(ROOT, tmp_path / str(n), seeds, scratch)
        assert done.returncode == 0, f"seeds {seeds}: " + done.stdout[-4000:] + done.stderr[-4000:]
        assert all(o["ok"] for o in outcomes), outcomes
