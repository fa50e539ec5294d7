"""Named mutants: each breaks one rule of the protocol, in `layout_sm` or in an adapter.

A mutant is applied when its target module is imported (see `site/sitecustomize.py`), in every
Python process that has `LAYOUT_MUTANT=<name>` in its environment: the test process and the
daemon processes it spawns alike. Source files are never edited (others work in this tree).

Each patch wraps or replaces one module attribute (or one method of a class, such as a conjunct
of `layout_sm.daemon.DaemonView` that the daemon machine's guards and the reply functions both
ask, or a guard of the engine machines on `layout_sm.engine_machines.EngineState`, which the declared
tables and python-statemachine both look up by name); the rest of the code calls it by that
name, so the break reaches every caller.
`module.__layout_mutant__` records what was applied. A reply function broken alone, so that it
accepts what the machine's guards refuse (or the reverse), is caught by the machine itself: the
request raises `layout_sm.daemon.MachineDisagrees` instead of being answered.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

ENV = "LAYOUT_MUTANT"


@dataclass(frozen=True)
class Mutant:
    name: str
    target: str  # the module patched when it is imported
    rule: str  # the rule of docs/protocol.md §4-§6 that it breaks
    patch: Callable[[ModuleType], None]
    tests: tuple[str, ...] = ()  # tests outside tests/model_based that exercise this rule (run too)


MUTANTS: dict[str, Mutant] = {}

# The rule of a defensive check that no behaviour of the bounded models reaches (the spec's engines
# never send such a request: e.g. begin without an attachment, or a stale base version) is caught
# by the unit tests of layout_sm, which the run of such a mutant includes.
UNIT = ("tests/layout_sm",)


def mutant(
    name: str, target: str, rule: str, tests: tuple[str, ...] = ()
) -> Callable[[Callable[[ModuleType], None]], Callable]:
    def register(fn: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
        assert name not in MUTANTS, name
        MUTANTS[name] = Mutant(name, target, rule, fn, tests)
        return fn

    return register


def _wrap(mod: ModuleType, attr: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    setattr(mod, attr, make(getattr(mod, attr)))


# -- the daemon's replies (layout_sm.daemon) ----------------------------------------------------

D = "layout_sm.daemon"


@mutant("no_dirty_on_mover_detach", D, "a mover that detaches mid-move leaves the daemon dirty")
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def detach_effect(view: Any, engine_id: str, session: str) -> Any:
            eff = orig(view, engine_id, session)
            return mod.DetachEffect(eff.dropped, None, eff.message) if eff.dirty is not None else eff

        return detach_effect

    _wrap(mod, "detach_effect", make)


@mutant("begin_ignores_other_attached", D, "begin is busy while another engine is attached")
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: datt[r] \ {e} = {}), asked by the begin guard and begin_reply alike
    mod.DaemonView.alone = lambda self, engine_id: True


@mutant("busy_before_permanent", D, "begin: permanent refusals come before transient busy")
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def begin_reply(view: Any, req: Any) -> Any:
            if view.holds(req.engine_id, req.session) and view.record is not None:
                if view.pending is not None and view.pending.engine_id != req.engine_id:
                    return mod.busy(mod.Reason.MOVE_PENDING, "mutant: busy first")
                if any(e != req.engine_id for e in view.attachments):
                    return mod.busy(mod.Reason.OTHER_ENGINE_ATTACHED, "mutant: busy first")
            return orig(view, req)

        return begin_reply

    _wrap(mod, "begin_reply", make)


@mutant("stale_base_accepted", D, "begin is refused when base_version is not the current version", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: ever[e] = dver[r]), asked by the begin guard and begin_reply alike
    mod.DaemonView.base_is_current = lambda self, base_version: self.record is not None


@mutant("begin_when_dirty", D, "a dirty daemon refuses begin until restarted", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def begin_reply(view: Any, req: Any) -> Any:
            return orig(replace(view, dirty=None), req)

        return begin_reply

    _wrap(mod, "begin_reply", make)


@mutant("begin_despite_non_following", D, "begin is refused once a non-following engine was served")
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def begin_reply(view: Any, req: Any) -> Any:
            return orig(replace(view, non_following_seen=False), req)

        return begin_reply

    _wrap(mod, "begin_reply", make)


@mutant("begin_without_attachment", D, "begin is honoured only for the session a live attachment holds", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def begin_reply(view: Any, req: Any) -> Any:
            if not view.holds(req.engine_id, req.session):
                view = replace(view, attachments={**view.attachments, req.engine_id: req.session})
            return orig(view, req)

        return begin_reply

    _wrap(mod, "begin_reply", make)


@mutant("abort_clears_other_session", D, "abort clears only this session's move", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def abort_reply(view: Any, req: Any) -> Any:
            if view.holds(req.engine_id, req.session) and view.pending is not None:
                return mod.ok(mod.Reason.ABORTED, "mutant: aborted whoever's move")
            return orig(view, req)

        return abort_reply

    _wrap(mod, "abort_reply", make)


@mutant("commit_any_layers", D, "commit needs the same layer list as the pending move", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: dpend[r].layers = reb[e].chunk), asked by the commit guard and
    # commit_decision alike
    mod.DaemonView.pending_layers_are = lambda self, layers: self.pending is not None


@mutant("commit_other_session", D, "commit is honoured only for the mover's own live session", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def commit_decision(view: Any, req: Any, built: Any = None) -> Any:
            if view.pending is not None and view.holds(req.engine_id, req.session):
                view = replace(view, pending=replace(view.pending, engine_id=req.engine_id, session=req.session))
            return orig(view, req, built)

        return commit_decision

    _wrap(mod, "commit_decision", make)


@mutant("fetch_skips_digest", D, "fetch_state with the field is refused when the digest differs", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def fetch_reply(view: Any, claim: Any, *gap: Any) -> Any:
            if claim is not None and view.record is not None:
                claim = replace(claim, digest=view.record.digest)
            return orig(view, claim, *gap)

        return fetch_reply

    _wrap(mod, "fetch_reply", make)


@mutant("fetch_while_pending", D, "fetch_state is refused while a move is pending")
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def fetch_reply(view: Any, claim: Any, *gap: Any) -> Any:
            return orig(replace(view, pending=None), claim, *gap)

        return fetch_reply

    _wrap(mod, "fetch_reply", make)


@mutant("fetch_when_dirty", D, "a dirty daemon refuses fetch_state until restarted", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def fetch_reply(view: Any, claim: Any, *gap: Any) -> Any:
            return orig(replace(view, dirty=None), claim, *gap)

        return fetch_reply

    _wrap(mod, "fetch_reply", make)


@mutant("older_engine_served_after_move", D, "an engine without the field is served only at version 0")
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def fetch_reply(view: Any, claim: Any, *gap: Any) -> Any:
            if claim is None and view.record is not None and view.record.version != 0:
                record = mod.LayoutRecord.build(view.record.rows, view.record.num_logical, 0)
                return orig(replace(view, record=record), claim, *gap)
            return orig(view, claim, *gap)

        return fetch_reply

    _wrap(mod, "fetch_reply", make)


@mutant("non_following_never_set", D, "serving without a live attachment sets the sticky flag")
def _(mod: ModuleType) -> None:
    def fetch_check(self: Any, claim: Any) -> Any:
        return mod.fetch_reply(self._view, claim)  # the reply, without setting the flag

    mod.DaemonMachine.fetch_check = fetch_check


@mutant("dirty_cleared_when_all_detach", D, "dirty is sticky: only a daemon restart clears it")
def _(mod: ModuleType) -> None:
    # the last detach from a dirty daemon clears the dirty mark (as if the daemon had recovered)
    orig = mod.DaemonMachine.detach_engine

    def detach_engine(self: Any, engine_id: str, session: str) -> Any:
        effect = orig(self, engine_id, session)
        if self._view.dirty is not None and not self._view.attachments and effect.dirty is None:
            self._view = replace(self._view, dirty=None)
            self.current_state_value = self._view.phase
        return effect

    mod.DaemonMachine.detach_engine = detach_engine


@mutant("stale_detach_drops_attachment", D, "the EOF of a stale session does not drop a live attachment", tests=UNIT)
def _(mod: ModuleType) -> None:
    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def detach_effect(view: Any, engine_id: str, session: str) -> Any:
            if engine_id in view.attachments:
                session = view.attachments[engine_id]
            return orig(view, engine_id, session)

        return detach_effect

    _wrap(mod, "detach_effect", make)


# -- the record (layout_sm.record) --------------------------------------------------------------

R = "layout_sm.record"


@mutant("version_not_incremented", R, "a commit increments the version")
def _(mod: ModuleType) -> None:
    orig = mod.LayoutRecord.with_rows

    def with_rows(self: Any, layers: Any, rows: Any) -> Any:
        new = orig(self, layers, rows)
        return dataclasses.replace(new, version=self.version)

    mod.LayoutRecord.with_rows = with_rows


@mutant("digest_ignores_values", R, "the digest covers every value of the map", tests=UNIT)
def _(mod: ModuleType) -> None:
    orig = mod.layout_digest

    def layout_digest(rows: Any) -> str:
        rows = [list(r) for r in rows]
        return orig([[0] * len(r) for r in rows])  # shape only

    mod.layout_digest = layout_digest
    mod.LayoutRecord.digest = property(lambda self: layout_digest(self.rows))


# -- the engine's rules (layout_sm.engine_machines: the guards of its machines, methods of EngineState) --

E = "layout_sm.engine_machines"


@mutant("engine_trusts_daemon_digest", E, "the engine computes its own digest of its own map", tests=UNIT)
def _(mod: ModuleType) -> None:
    def good(self: Any) -> bool:  # the daemons agree with each other: their digest is taken
        v = self.view
        answers = [a for a in v.commits if a is not None]
        versions_ok = all(a.ok and a.version == v.version + 1 for a in answers) and len(answers) == v.num_ranks
        return versions_ok and len({a.digest for a in answers}) == 1

    mod.EngineState.good = good


@mutant("startup_adopts_on_disagreement", E, "startup fails when the daemons disagree")
def _(mod: ModuleType) -> None:
    mod.EngineState.records_differ = lambda self: False


@mutant("startup_ignores_dirty", E, "startup fails when any daemon is dirty")
def _(mod: ModuleType) -> None:
    mod.EngineState.dirty = lambda self: False


@mutant("startup_keeps_own_after_move", E, "some daemons without a record: fail if a recording one moved", tests=UNIT)
def _(mod: ModuleType) -> None:
    mod.EngineState.moved_beside_no_record = lambda self: False


@mutant("no_abort_ok_ranks_on_busy", E, "on busy, the engine aborts the ranks whose begin was ok")
def _(mod: ModuleType) -> None:
    any_ok = mod.EngineState.any_ok
    mod.EngineState.any_ok = lambda self: any_ok(self) and self.any_refused()  # a busy chunk aborts nothing


@mutant("busy_disables_for_good", E, "busy pauses the rebalance; only refused turns it off")
def _(mod: ModuleType) -> None:
    from layout_sm.reasons import Status

    any_refused = mod.EngineState.any_refused

    def any_refused_or_busy(self: Any) -> bool:
        return any_refused(self) or any(a is not None and a.status is Status.BUSY for a in self.view.begins)

    mod.EngineState.any_refused = any_refused_or_busy


# -- the engine session (layout_sm.session): the steps every rank of an engine and the mirror run --

S = "layout_sm.session"
# The adapter's chunk protocol against real daemons and sglang's EPLB, and the mirror against TLC.
SESSION_TESTS = (
    "tests/engine_adapter/test_rebalance.py::test_busy_daemon_pauses_the_rebalance_and_nothing_moves",
    "tests/spec/test_mirror_equals_spec.py",
)


@mutant("session_proceeds_on_busy", S, "busy pauses the rebalance: nothing moves on a busy begin", tests=SESSION_TESTS)
def _(mod: ModuleType) -> None:
    from layout_sm.reasons import Status

    def all_ok(self: Any) -> bool:
        return all(a is not None and (a.ok or a.status is Status.BUSY) for a in self.view.begins)

    mod.EngineState.all_ok = all_ok


# -- the adapters ------------------------------------------------------------------------------

DA = "daemon_adapter.daemon"
EA = "daemon_adapter.client"


@mutant("daemon_fetch_gate_bypassed", DA, "the daemon asks the layout machine before sglang sends fetch_state")
def _(mod: ModuleType) -> None:
    from layout_sm.reasons import Reason, ok

    def _fetch_check(self: Any, claim: Any) -> Any:
        return ok(Reason.SERVED_FOLLOWING, "mutant: served without the layout check")

    mod.LayoutAwareDaemon._fetch_check = _fetch_check


@mutant("daemon_misses_eof", DA, "the daemon notices the EOF of an attach connection (the detach)")
def _(mod: ModuleType) -> None:
    def _watch_attachment(self: Any, watched: Any, engine_id: str, session: str) -> None:
        while True:  # reads the connection to the end, and then forgets to detach
            try:
                if not watched.recv(4096):
                    break
            except OSError:
                break
        watched.close()

    mod.LayoutAwareDaemon._watch_attachment = _watch_attachment


@mutant(
    "attach_socket_survives_fork",
    EA,
    "a forked child of the engine does not keep its attach connection open",
    tests=(
        "tests/engine_adapter/test_startup.py::"
        "test_forked_child_outlives_the_engine_and_the_daemon_still_sees_the_detach",
    ),
)
def _(mod: ModuleType) -> None:
    mod.Attachment._drop_in_child = lambda self: None


def apply(mod: ModuleType, name: str) -> None:
    m = MUTANTS[name]
    m.patch(mod)
    mod.__layout_mutant__ = name  # type: ignore[attr-defined]


def active() -> Mutant | None:
    name = os.environ.get(ENV, "")
    if not name:
        return None
    if name not in MUTANTS:
        raise SystemExit(f"{ENV}={name!r} is not a mutant; known: {', '.join(sorted(MUTANTS))}")
    return MUTANTS[name]
