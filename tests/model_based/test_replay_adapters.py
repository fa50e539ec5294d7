"""Replay the committed behaviours against the real daemon adapters, over real Unix sockets.

Each behaviour starts fresh daemons (one `LayoutAwareDaemon` per rank, sglang's serve loop),
drives them through the spec's actions (`real_system.RealSystem`), and after every step compares
each daemon's `expert_layout_query` with the daemon part of the spec's state, and every reply
with the one the spec's action implies.

- CI: the whole MCSmall suite on in-process serve loops (fast fresh daemons), cut into shards so
  that each test stays well under pytest's per-test timeout on a slow CI machine, and an evenly
  spaced sample of the other suites; on real daemon processes (SIGKILL and restart included), a
  sample of each suite without repairs (MCRejoin's daemons repair, and only in-process daemons have
  the fake reload a repair needs).
- `make replay-full` (REPLAY_FULL=1): every behaviour of every suite, on both kinds of daemons.
- `make mutants` (LAYOUT_TEST_PROFILE=mutants): smaller samples, no daemon processes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from tools.mirror.system import load_model
from tools.mirror.tlc_formats import Suite

from tests.model_based.daemon_hosts import DaemonHost, InProcessHost, ProcessHost
from tests.model_based.real_system import Mismatch, RealSystem
from tests.model_based.suites import MODELS, SPEC
from tests.model_based.test_replay_mirror import load

FULL = os.environ.get("REPLAY_FULL") == "1"
# `make mutants` runs this suite once per mutant: smaller samples there (LAYOUT_TEST_PROFILE=mutants)
MUTANTS = os.environ.get("LAYOUT_TEST_PROFILE") == "mutants"
PROCESS_SAMPLE = (
    {"MCSmall": 30, "MCFull": 30, "MCStandby": 30, "MCRejoin": 0}
    if not MUTANTS
    else {"MCSmall": 0, "MCFull": 0, "MCStandby": 0, "MCRejoin": 0}
)
INPROCESS_CI = (  # None: all
    {"MCSmall": None, "MCFull": 300, "MCStandby": 300, "MCRejoin": 300}
    if not MUTANTS
    else {"MCSmall": 300, "MCFull": 60, "MCStandby": 60, "MCRejoin": 60}
)
MAX_REPORTED = 5
# The whole MCSmall suite took ~490 s as one test here and ran past pytest's 600 s timeout on CI;
# 4 shards of ~1600 behaviours keep each near 2 minutes with every behaviour still replayed.
INPROCESS_SHARDS = (
    {"MCSmall": 4, "MCFull": 1, "MCStandby": 1, "MCRejoin": 1}
    if not MUTANTS
    else {"MCSmall": 1, "MCFull": 1, "MCStandby": 1, "MCRejoin": 1}
)
INPROCESS_PARAMS = [
    pytest.param(model, k, id=model if INPROCESS_SHARDS[model] == 1 else f"{model}-{k + 1}of{INPROCESS_SHARDS[model]}")
    for model in MODELS
    for k in range(INPROCESS_SHARDS[model])
]


def sample(n_total: int, n: int | None) -> list[int]:
    """Evenly spaced behaviour indexes (deterministic), or all of them."""
    if n is None or n >= n_total:
        return list(range(n_total))
    return sorted({round(k * (n_total - 1) / max(n - 1, 1)) for k in range(n)})


def replay_on_adapters(
    model: str, suite: Suite, host: DaemonHost, indexes: Iterable[int]
) -> tuple[list[str], dict[str, int]]:
    constants = load_model(SPEC, model)
    older, standbys, rejoins = frozenset(constants.older), constants.standbys, constants.rejoins
    problems: list[str] = []
    stats = {"behaviours": 0, "steps": 0}
    for k in indexes:
        name, i0, steps = suite.paths[k]
        init = suite.state(i0)
        real = RealSystem(host, init, older, standbys, rejoins=rejoins)
        stats["behaviours"] += 1
        try:
            real.check_daemons(init, "the initial state")
            before = init
            for n, (label, j) in enumerate(steps):
                after = suite.state(j)
                real.step(suite.action(label), before, after)
                real.check_daemons(after, f"step {n + 1} {label}", only_touched=True)
                stats["steps"] += 1
                before = after
            real.check_daemons(before, "the last step")
        except Mismatch as exc:
            problems.append(f"{model} {name}: {exc}\n    last requests:\n    " + "\n    ".join(real.log[-12:]))
        finally:
            real.close()
        if len(problems) >= MAX_REPORTED:
            break
    return problems, stats


def _run(model: str, host_kind: str, n: int | None, shard: tuple[int, int] = (0, 1)) -> None:
    suite = load(model)
    k, shards = shard
    indexes = sample(len(suite.paths), None if FULL else n)[k::shards]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="replay-") as tmp:
        constants = load_model(SPEC, model)
        host: DaemonHost = (
            InProcessHost(Path(tmp), constants.repairs, constants.durable)
            if host_kind == "inprocess"
            else ProcessHost(Path(tmp))
        )
        problems, stats = replay_on_adapters(model, suite, host, indexes)
    part = f" (shard {k + 1} of {shards})" if shards > 1 else ""
    print(f"{model}{part} on {host_kind} daemons: {stats} in {time.monotonic() - t0:.1f} s")
    assert not problems, f"the real daemons disagree with the spec's {model} behaviours:\n" + "\n".join(problems)
    assert stats["behaviours"] == len(indexes)


@pytest.mark.parametrize(("model", "shard"), INPROCESS_PARAMS)
def test_replay_on_inprocess_daemons(model: str, shard: int) -> None:
    """Every behaviour in `sample(...)` lands in exactly one shard (`[k::shards]`)."""
    _run(model, "inprocess", INPROCESS_CI[model], (shard, INPROCESS_SHARDS[model]))


@pytest.mark.parametrize("model", MODELS)
def test_replay_on_daemon_processes(model: str) -> None:
    if load_model(SPEC, model).repairs:
        pytest.skip("a repair needs the fake reload of in-process daemons (daemon processes have none yet)")
    if not FULL and not PROCESS_SAMPLE[model]:
        pytest.skip("no daemon-process sample in this profile (LAYOUT_TEST_PROFILE=mutants)")
    _run(model, "process", PROCESS_SAMPLE[model])
