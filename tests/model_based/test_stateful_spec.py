"""Hypothesis drives the spec's actions on real daemons and on the mirror, side by side.

`SpecOnRealDaemons` is a `RuleBasedStateMachine` with one rule per action of the spec's `Next`
(spec/LayoutProtocol.tla); a rule's precondition is the action's enabling condition, as the
mirror (`tools.mirror.system`, the `layout_sm` machines composed) computes it in the current
state, and the rule draws one enabled instance (its parameters). Each step is then done on real
`LayoutAwareDaemon`s (sglang's serve loop on real Unix sockets, one per rank, in this process
for speed: `daemon_hosts.InProcessHost`), whose replies and `expert_layout_query` must match the
spec state the mirror moved to. `@invariant` checks the spec's invariants (TypeOK, SafeRouting,
CleanRecordIsTruth, OneMover, AgreedVersions) on every state.

CI: 200 examples of up to 50 steps on MCSmall (derandomized: the same run every time).
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tools.mirror.invariants import INVARIANTS, Vars
from tools.mirror.system import System, load_model
from tools.mirror.tlc_formats import Action
from tools.mirror.values import Record

from tests.model_based.daemon_hosts import InProcessHost
from tests.model_based.real_system import RealSystem
from tests.model_based.suites import SPEC

MODEL = "MCSmall"
_system: System | None = None
_host: InProcessHost | None = None


def system() -> System:
    global _system
    if _system is None:
        _system = System(load_model(SPEC, MODEL))
    return _system


def host() -> InProcessHost:
    global _host
    if _host is None:
        tmp = tempfile.TemporaryDirectory(prefix="stateful-")
        atexit.register(tmp.cleanup)
        _host = InProcessHost(Path(tmp.name))
    return _host


def spec_state(s: Any) -> Record:
    return system().spec_state(s)


def _action_rule(name: str) -> Any:
    """The rule of one spec action: enabled when the mirror enables an instance of it."""

    @precondition(lambda self: bool(self.enabled(name)))
    @rule(data=st.data())
    def act(self: SpecOnRealDaemons, data: st.DataObject) -> None:
        choices = self.enabled(name)
        label = data.draw(st.sampled_from(sorted(choices)), label=name)
        self.take(label, choices[label])

    act.__name__ = name
    return act


class SpecOnRealDaemons(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.state: Any = None
        self.record: Record | None = None
        self.real: RealSystem | None = None
        self.trace: list[str] = []

    @initialize(which=st.integers(min_value=0, max_value=7))
    def start(self, which: int) -> None:
        inits = system().initial_states()
        self.state = inits[which % len(inits)]
        self.record = spec_state(self.state)
        self.real = RealSystem(host(), self.record, frozenset(system().model.older))
        self.real.check_daemons(self.record, "the initial state")

    def teardown(self) -> None:
        if self.real is not None:
            self.real.close()

    def enabled(self, name: str) -> dict[str, Any]:
        if self.state is None:
            return {}
        return {
            label: nxt
            for label, nxt in system().successors(self.state)
            if label == name or label.startswith(name + "(")
        }

    def take(self, label: str, nxt: Any) -> None:
        assert self.real is not None and self.record is not None
        after = spec_state(nxt)
        self.trace.append(label)
        self.real.step(Action.parse(label), self.record, after)
        self.real.check_daemons(after, f"{label} (behaviour: {', '.join(self.trace)})", only_touched=True)
        self.state, self.record = nxt, after

    # one rule per action of the spec's Next
    Attach = _action_rule("Attach")
    Poll = _action_rule("Poll")
    Timeout = _action_rule("Timeout")
    Agree = _action_rule("Agree")
    Fetch = _action_rule("Fetch")
    BeginChunk = _action_rule("BeginChunk")
    Begin = _action_rule("Begin")
    BeginUnanswered = _action_rule("BeginUnanswered")
    BeginUnreached = _action_rule("BeginUnreached")
    Decide = _action_rule("Decide")
    Abort = _action_rule("Abort")
    MoveLayer = _action_rule("MoveLayer")
    Commit = _action_rule("Commit")
    CommitRefused = _action_rule("CommitRefused")
    CommitUnanswered = _action_rule("CommitUnanswered")
    Committed = _action_rule("Committed")
    Verify = _action_rule("Verify")
    Crash = _action_rule("Crash")
    Detach = _action_rule("Detach")
    Restart = _action_rule("Restart")
    # never enabled on MCSmall (Repairs = FALSE); the witness KillMidMoveRepairedThenAdopted replays them
    RepairDone = _action_rule("RepairDone")
    RepairFails = _action_rule("RepairFails")
    RepairAgain = _action_rule("RepairAgain")
    # never enabled on MCSmall (Standbys = {}); the standby witnesses and MCStandby's suite replay them
    Park = _action_rule("Park")
    Claim = _action_rule("Claim")
    Promote = _action_rule("Promote")
    # never enabled on MCSmall (Rejoins = FALSE); the witness DaemonLostAndRejoined replays them
    Lose = _action_rule("Lose")
    AskRejoin = _action_rule("AskRejoin")
    # never enabled on MCSmall (Durable = FALSE); the witnesses FullRestartServesCopy and
    # FullRestartBehindRejoined replay it
    Persist = _action_rule("Persist")

    @precondition(lambda self: self.state is not None and not any(True for _ in system().successors(self.state)))
    @rule()
    def settled(self) -> None:
        """No action is enabled (every engine gone, every EOF noticed): every daemon, fully checked."""
        assert self.real is not None and self.record is not None
        self.real.check_daemons(self.record, f"the end (behaviour: {', '.join(self.trace)})")

    @invariant()
    def spec_invariants(self) -> None:
        if self.state is None:
            return
        values = Vars(system().project(self.state))
        broken = [n for n, inv in INVARIANTS.items() if not inv(system().model, values)]
        assert not broken, f"invariants {broken} broken after {', '.join(self.trace)}"


def test_every_spec_action_is_a_rule() -> None:
    from tools.mirror.system import EVENTS

    # Hypothesis marks a rule with this attribute (hypothesis.stateful.RULE_MARKER)
    missing = [n for n in EVENTS if not hasattr(getattr(SpecOnRealDaemons, n, None), "hypothesis_stateful_rule")]
    assert not missing, f"spec actions without a rule: {missing}"


SpecOnRealDaemons.TestCase.settings = settings(
    # `make mutants` runs this once per mutant: fewer examples there
    max_examples=60 if os.environ.get("LAYOUT_TEST_PROFILE") == "mutants" else 200,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSpecOnRealDaemons = SpecOnRealDaemons.TestCase
