"""The seed's scenarios, as TLC found them (``spec/Scenarios.tla``), replayed on real daemons.

Each committed witness (``witnesses/<Name>.json``, TLC's ``-dumpTrace json``; ``make witnesses``
refreshes them) is a named scenario: a restart adopting a moved layout, a warm standby making a
move busy, a SIGKILL between chunks, a SIGKILL mid-move, an older engine after a move, a
rebalance of several chunks. Each is replayed step by step on the mirror (every state equal to
TLC's) and on real ``LayoutAwareDaemon``s (sglang's serve loop in threads here; in daemon
processes with ``make replay-full``) over real Unix sockets (``real_system``):
after every step each daemon's ``expert_layout_query`` equals the spec's daemon state, and every
reply is the one the spec's action implies.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from tools.mirror.check_spec import WITNESSES
from tools.mirror.system import load_model

from tests.model_based.daemon_hosts import DaemonHost, InProcessHost, ProcessHost
from tests.model_based.real_system import RealSystem
from tests.model_based.witness_traces import MANIFEST, REGENERATE, SPEC, WITNESS_DIR, load_witness, spec_hashes, witness

NAMES = [w.name for w in WITNESSES]
FULL = os.environ.get("REPLAY_FULL") == "1"


def manifest() -> dict:
    if not MANIFEST.exists():
        pytest.fail(f"no witness manifest at {MANIFEST}; build it with `{REGENERATE}`")
    return json.loads(MANIFEST.read_text())


@pytest.mark.parametrize("name", NAMES)
def test_witness_is_committed_and_from_this_spec(name: str) -> None:
    entry = manifest().get(name)
    assert entry is not None and (WITNESS_DIR / f"{name}.json").exists(), f"no witness trace for {name}: {REGENERATE}"
    stale = {f: h for f, h in spec_hashes(witness(name)).items() if entry["spec_sha256"].get(f) != h}
    assert not stale, f"witness {name} was found on other spec files ({sorted(stale)}); refresh with `{REGENERATE}`"


@pytest.mark.parametrize("name", NAMES)
def test_witness_replays_on_the_mirror(name: str) -> None:
    behaviour = load_witness(name)
    assert len(behaviour) == manifest()[name]["steps"] > 0


def replay(name: str, host: DaemonHost) -> list[str]:
    behaviour = load_witness(name)
    model = load_model(SPEC, witness(name).model)
    real = RealSystem(host, behaviour.init, frozenset(model.older), model.standbys, rejoins=model.rejoins)
    try:
        real.check_daemons(behaviour.init, "the initial state")
        before = behaviour.init
        for n, step in enumerate(behaviour.steps, 1):
            real.step(step.action, before, step.state)
            real.check_daemons(step.state, f"step {n} {step.action.label}", only_touched=True)
            before = step.state
        real.check_daemons(before, "the last step")
    finally:
        real.close()
    return real.log


@pytest.mark.parametrize("name", NAMES)
def test_witness_replays_on_inprocess_daemons(name: str) -> None:
    with tempfile.TemporaryDirectory(prefix="witness-") as tmp:
        model = load_model(SPEC, witness(name).model)
        log = replay(name, InProcessHost(Path(tmp), repairs=model.repairs, durable=model.durable))
    assert any(line.startswith("  d") for line in log), "nothing was sent to the daemons"


@pytest.mark.skipif(not FULL, reason="daemon processes: make replay-full (REPLAY_FULL=1)")
@pytest.mark.parametrize("name", NAMES)
def test_witness_replays_on_daemon_processes(name: str) -> None:
    if load_model(SPEC, witness(name).model).repairs:
        pytest.skip("a repair needs the fake reload of in-process daemons (daemon processes have none yet)")
    with tempfile.TemporaryDirectory(prefix="witness-") as tmp:
        log = replay(name, ProcessHost(Path(tmp)))
    assert any(line.startswith("  d") for line in log), "nothing was sent to the daemons"
