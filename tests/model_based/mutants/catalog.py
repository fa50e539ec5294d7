"""Named mutants: each breaks one rule of the protocol, in `layout_sm` or in an adapter.

A mutant is applied when its target module is imported (see `site/sitecustomize.py`), in every
Python process that has `LAYOUT_MUTANT=<name>` in its environment: the test process and the
daemon processes it spawns alike. Source files are never edited (others work in this tree).

Each patch wraps or replaces one module attribute (or one method of a class, such as a conjunct
of `layout_sm.daemon.DaemonView` that the daemon machine's guards and ladders both ask, or one
ladder of `layout_sm.ladders.LADDERS`, which the machine's actions look up when they run); the
rest of the code calls it by that name, so the break reaches every caller.
`module.__layout_mutant__` records what was applied. A ladder broken alone, so that every one
of its conjuncts holds in a phase from which the machine declares no acceptance, is caught by
the machine itself: the request raises (`DaemonMachine.answer`) instead of being answered.
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


def _as_if(mod: ModuleType, method: str, field: str) -> None:
    """``DaemonMachine.<method>`` decides as if the view's ``field`` were None, and puts it back after."""
    orig = getattr(mod.DaemonMachine, method)

    def decided_without(self: Any, *args: Any) -> Any:
        kept = getattr(self._view, field)
        if kept is None:
            return orig(self, *args)
        self._view = replace(self._view, **{field: None})
        try:
            return orig(self, *args)
        finally:
            self._view = replace(self._view, **{field: kept})

    setattr(mod.DaemonMachine, method, decided_without)


@mutant("no_dirty_on_mover_detach", D, "a mover that detaches mid-move leaves the daemon dirty")
def _(mod: ModuleType) -> None:
    # the detach ladder's accepted step drops the mover's attachment and move, and keeps the daemon clean
    def answer(view: Any, req: Any) -> Any:
        return mod.DetachEffect(True, None, f"engine {req.engine_id!r} detached")

    def change(view: Any, req: Any) -> Any:
        attachments = {e: s for e, s in view.attachments.items() if e != req.engine_id}
        return replace(view, attachments=attachments, pending=None)

    from layout_sm.replies import Outcome

    mod.LADDERS["detach"] = replace(mod.LADDERS["detach"], accepted=Outcome(answer, change))


@mutant("begin_ignores_other_attached", D, "begin is busy while another engine is attached")
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: datt[r] \ {e} = {}), asked by the begin guard and ladder alike
    mod.DaemonView.alone = lambda self, engine_id: True


@mutant("busy_before_permanent", D, "begin: permanent refusals come before transient busy")
def _(mod: ModuleType) -> None:
    # the begin ladder asks the transient conjuncts right after the attachment
    ladder = mod.LADDERS["begin"]
    transient = [r for r in ladder.rungs if r.conjunct.method in ("foreign_pending", "alone")]
    permanent = [r for r in ladder.rungs if r not in transient]
    mod.LADDERS["begin"] = replace(ladder, rungs=(permanent[0], *transient, *permanent[1:]))


@mutant("stale_base_accepted", D, "begin is refused when base_version is not the current version", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: ever[e] = dver[r]), asked by the begin guard and ladder alike
    mod.DaemonView.base_is_current = lambda self, base_version: self.record is not None


@mutant("begin_when_dirty", D, "a dirty daemon refuses begin until restarted", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the begin ladder without its dirty rung: a begin that finds every other conjunct holding on a
    # dirty daemon raises (the machine declares no begin accepted from dirty)
    ladder = mod.LADDERS["begin"]
    mod.LADDERS["begin"] = replace(ladder, rungs=tuple(r for r in ladder.rungs if r.conjunct.method != "is_dirty"))


@mutant("begin_despite_non_following", D, "begin is refused once a non-following engine was served")
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: dnf[r]), asked by the begin guard and ladder alike
    mod.DaemonView.saw_non_following = lambda self: False


@mutant("begin_without_attachment", D, "begin is honoured only for the session a live attachment holds", tests=UNIT)
def _(mod: ModuleType) -> None:
    # begin decides as if the request's session were attached
    orig = mod.DaemonMachine.begin_move

    def begin_move(self: Any, request: Any) -> Any:
        view = self._view
        if view.holds(request.engine_id, request.session):
            return orig(self, request)
        self._view = replace(view, attachments={**view.attachments, request.engine_id: request.session})
        try:
            return orig(self, request)
        finally:
            self._view = replace(self._view, attachments=view.attachments)

    mod.DaemonMachine.begin_move = begin_move


@mutant("abort_clears_other_session", D, "abort clears only this session's move", tests=UNIT)
def _(mod: ModuleType) -> None:
    from layout_sm.reasons import Reason, ok

    orig = mod.DaemonMachine.abort_move

    def abort_move(self: Any, request: Any) -> Any:
        view = self._view
        if view.holds(request.engine_id, request.session) and view.pending is not None:
            self._view = replace(view, pending=None)
            return ok(Reason.ABORTED, "mutant: aborted whoever's move")
        return orig(self, request)

    mod.DaemonMachine.abort_move = abort_move


@mutant("commit_any_layers", D, "commit needs the same layer list as the pending move", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: dpend[r].layers = reb[e].chunk), asked by the commit guard and
    # ladder alike
    mod.DaemonView.pending_layers_are = lambda self, layers: self.pending is not None


@mutant("commit_other_session", D, "commit is honoured only for the mover's own live session", tests=UNIT)
def _(mod: ModuleType) -> None:
    # commit decides as if the pending move were the requester's
    orig = mod.DaemonMachine.commit_move

    def commit_move(self: Any, request: Any) -> Any:
        view = self._view
        if view.pending is not None and view.holds(request.engine_id, request.session):
            mover = replace(view.pending, engine_id=request.engine_id, session=request.session)
            self._view = replace(view, pending=mover)
        return orig(self, request)

    mod.DaemonMachine.commit_move = commit_move


@mutant("fetch_skips_digest", D, "fetch_state with the field is refused when the digest differs", tests=UNIT)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: eroute[e] = dmap[r]), asked by the fetch guard and ladder alike
    mod.DaemonView.digest_is_current = lambda self, digest: self.record is not None


@mutant("fetch_while_pending", D, "fetch_state is refused while a move is pending")
def _(mod: ModuleType) -> None:
    _as_if(mod, "fetch_check", "pending")


@mutant("fetch_when_dirty", D, "a dirty daemon refuses fetch_state until restarted", tests=UNIT)
def _(mod: ModuleType) -> None:
    _as_if(mod, "fetch_check", "dirty")


@mutant("older_engine_served_after_move", D, "an engine without the field is served only at version 0")
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: FetchServes for older engines, dver[r] = 0)
    mod.DaemonView.claims_or_initial = lambda self, claim: True


@mutant("non_following_never_set", D, "serving without a live attachment sets the sticky flag")
def _(mod: ModuleType) -> None:
    # the fetch ladder's steps serve without setting the flag
    ladder = mod.LADDERS["fetch"]
    mod.LADDERS["fetch"] = replace(
        ladder, rungs=tuple(replace(r, outcome=replace(r.outcome, change=None)) for r in ladder.rungs)
    )


@mutant("dirty_cleared_when_all_detach", D, "dirty is sticky: only a daemon restart clears it")
def _(mod: ModuleType) -> None:
    # the last detach from a dirty daemon clears the dirty mark (as if the daemon had recovered)
    orig = mod.DaemonMachine.detach_engine

    def detach_engine(self: Any, engine_id: str, session: str) -> Any:
        effect = orig(self, engine_id, session)
        if self._view.dirty is not None and not self._view.attachments and effect.dirty is None:
            self._view = replace(self._view, dirty=None)
        return effect

    mod.DaemonMachine.detach_engine = detach_engine


@mutant("stale_detach_drops_attachment", D, "the EOF of a stale session does not drop a live attachment", tests=UNIT)
def _(mod: ModuleType) -> None:
    # a detach is taken for the engine's live session, whichever session's EOF it is
    orig = mod.DaemonMachine.detach_engine

    def detach_engine(self: Any, engine_id: str, session: str) -> Any:
        return orig(self, engine_id, self._view.attachments.get(engine_id, session))

    mod.DaemonMachine.detach_engine = detach_engine


# -- the repair of a torn move (layout_sm.daemon, layout_sm.engine, daemon_adapter.repair) ---------------

# The daemon's repair rules in process, over real sockets (with a FakeReload), and in layout_sm.
REPAIR_TESTS = ("tests/layout_sm", "tests/daemon_adapter/test_repair_requests.py")


def _without_rung(mod: ModuleType, ladder: str, method: str) -> None:
    """The ladder without the rung of this conjunct: what it guarded is no longer refused."""
    found = mod.LADDERS[ladder]
    mod.LADDERS[ladder] = replace(found, rungs=tuple(r for r in found.rungs if r.conjunct.method != method))


@mutant("begin_while_repairing", D, "a repairing daemon refuses begin until the repair ends", tests=REPAIR_TESTS)
def _(mod: ModuleType) -> None:
    _without_rung(mod, "begin", "is_repairing")


@mutant("fetch_while_repairing", D, "a repairing daemon refuses fetch_state until the repair ends", tests=REPAIR_TESTS)
def _(mod: ModuleType) -> None:
    _without_rung(mod, "fetch", "is_repairing")


@mutant("no_repair_on_mover_eof", D, "with auto repair, the mover's EOF mid-move starts the repair", tests=REPAIR_TESTS)
def _(mod: ModuleType) -> None:
    # the conjunct itself (spec: the constant Repairs), asked by the detach ladder's branch
    mod.DaemonView.repairs_automatically = lambda self: False


@mutant("repair_bumps_version", D, "a repair ends clean at the base version and its map", tests=REPAIR_TESTS)
def _(mod: ModuleType) -> None:
    ladder = mod.LADDERS["repair_done"]
    change = ladder.accepted.change

    def bumped(view: Any, req: Any) -> Any:
        after = change(view, req)
        return replace(after, record=replace(after.record, version=after.record.version + 1))

    mod.LADDERS["repair_done"] = replace(ladder, accepted=replace(ladder.accepted, change=bumped))


@mutant("repair_done_stays_dirty", D, "a repair that ended well makes the daemon clean", tests=REPAIR_TESTS)
def _(mod: ModuleType) -> None:
    ladder = mod.LADDERS["repair_done"]
    mod.LADDERS["repair_done"] = replace(
        ladder, accepted=replace(ladder.accepted, change=lambda view, req: replace(view, repairing=False))
    )


@mutant(
    "engine_fails_on_repairing",
    "layout_sm.engine",
    "an engine that finds its daemon repairing waits, as for a pending move, and adopts the base version",
    tests=("tests/layout_sm",),
)
def _(mod: ModuleType) -> None:
    # the engine reads a repairing daemon's reply as a dirty one (it fails instead of waiting)
    finding = mod.RankFinding

    def as_dirty(read: Callable[..., Any]) -> Callable[..., Any]:
        def classify(cls: Any, rank: int, wire: object) -> Any:
            if isinstance(wire, dict) and wire.get("repairing"):
                return cls(rank, "dirty", detail="mutant: repairing read as dirty")
            return read.__func__(cls, rank, wire)

        return classmethod(classify)

    finding.from_attach_reply = as_dirty(finding.from_attach_reply)
    finding.from_query_reply = as_dirty(finding.from_query_reply)


@mutant(
    "repair_ignores_record_map",
    "daemon_adapter.repair",
    "the repair writes each expert into the slots the record's base rows give, not the load-time ones",
    tests=("tests/daemon_adapter/test_repair_real.py",),
)
def _(mod: ModuleType) -> None:
    # sglang's expert location is left as the daemon loaded it: the reload follows the initial map
    from sglang.srt.eplb.expert_location import get_global_expert_location_metadata

    def set_expert_location(model_config: Any, physical_to_logical_map: Any, ep_rank: int) -> Any:
        return get_global_expert_location_metadata()

    mod.set_expert_location = set_expert_location


@mutant(
    "repair_writes_nothing",
    "daemon_adapter.repair",
    "a repair reloads the torn layers' experts from the checkpoint before the daemon is clean",
    tests=("tests/daemon_adapter/test_repair_real.py",),
)
def _(mod: ModuleType) -> None:
    # the reload reports success and writes nothing: the daemon turns clean over a torn memory
    def reload_routed_experts(model: Any, model_config: Any, load_config: Any, layers: Any, *rest: Any) -> Any:
        return mod.RepairReport(tuple(sorted(layers)), 0.0, 0, 1, 0, (), 0)

    mod.reload_routed_experts = reload_routed_experts


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
    def owed_checks(self: Any) -> bool:  # the daemons agree with each other: their digest is taken
        v = self.view
        answers = [a for a in v.owed if a is not None]
        versions_ok = all(a.ok and a.version == v.version for a in answers) and len(answers) == len(v.owed)
        return versions_ok and len({a.digest for a in answers}) <= 1

    mod.EngineState.owed_checks = owed_checks


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

    def _fetch_check(self: Any, claim: Any, gap: Any = None) -> Any:
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


RB = "engine_adapter.rebalance"


@mutant(
    "engine_skips_commit_verification",
    RB,
    "a rebalance ends only after an all-gather verified every daemon's commit of its last chunk",
    tests=("tests/engine_adapter/test_rebalance.py", "tests/chaos/test_chaos.py"),
)
def _(mod: ModuleType) -> None:
    # The adapter never tells the session that sglang's rebalance ended: the last all-gather is skipped.
    mod._rebalance_ended = lambda st, manager, session, rank: None


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
