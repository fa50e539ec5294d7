"""Every refusal that names a next step: the step, followed, brings the system back.

One case per refusing rung of the daemon's ladders (``layout_sm.ladders``) and per failure of an
engine's startup: it builds the state in which that refusal is given, checks the text names the
step, carries the step out on the machines and asks again, which is then accepted. Carried out as
an operator would: a daemon started again from disk is a fresh ``DaemonMachine`` at the initial
map; an engine started again is a new engine (``Ranks``) with a new id; "retry" asks again once the
state the text names has ended. The refusals that answer the engine's own code, not an operator (a
session the engine does not hold, a layer list it made up) are listed in ``TO_THE_ENGINE`` with
why; a refusing rung in neither fails the test, so a new refusal comes with its case.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from layout_sm.daemon import DaemonMachine, RepairDone
from layout_sm.engine import EngineLayout, Go, Step
from layout_sm.ladders import LADDERS
from layout_sm.messages import (
    AbortRequest,
    AttachRequest,
    BeginRequest,
    ClaimRequest,
    CommitRequest,
    FetchLayoutField,
    ParkRequest,
    RejoinRequest,
)
from layout_sm.ready import Fetched, Started
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutRecord

from .ranks import Ranks

ROWS = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED_ROWS = ((1, 0, 2, 3), (3, 2, 1, 0))
INITIAL = LayoutRecord.initial(ROWS, 4)
MOVED = LayoutRecord.build(MOVED_ROWS, 4, 1)
LAYOUT = EngineLayout(2, 4, 4, INITIAL.digest, routes_by_metadata=True)
RESTART = "restart the weight cache daemons"
REPAIR = "expert-layout repair"


def daemon(*engines: str, record: LayoutRecord | None = INITIAL, auto_repair: bool = False) -> DaemonMachine:
    """A daemon started from disk with ``engines`` attached (each with session ``s<engine>``)."""
    machine = DaemonMachine(record, auto_repair)
    attach(machine, *engines)
    return machine


def begin(machine: DaemonMachine, engine: str, layers: tuple[int, ...] = (0,)) -> Reply:
    record = machine.view().record
    return machine.begin_move(BeginRequest(engine, f"s{engine}", 0 if record is None else record.version, layers))


def commit(machine: DaemonMachine, engine: str) -> Reply:
    return machine.commit_move(CommitRequest(engine, f"s{engine}", (0,), (MOVED_ROWS[0],)))


def attach(machine: DaemonMachine, *engines: str) -> None:
    for engine in engines:
        assert machine.attach_engine(AttachRequest(engine), session=f"s{engine}").ok


def moved(machine: DaemonMachine, engine: str, *then_attached: str) -> DaemonMachine:
    """``engine``, alone, moved layer 0; ``then_attached`` attached after it began."""
    assert begin(machine, engine).ok
    attach(machine, *then_attached)
    assert commit(machine, engine).ok
    return machine


def torn(machine: DaemonMachine, engine: str, *then_attached: str) -> DaemonMachine:
    """``engine``, alone, died mid-move (``then_attached`` attached after it began): the daemon is
    dirty, or repairing with auto repair."""
    assert begin(machine, engine).ok
    attach(machine, *then_attached)
    machine.detach_engine(engine, f"s{engine}")
    return machine


def repaired(machine: DaemonMachine) -> None:
    """``expert-layout repair`` run to its end (the reload of the torn layers)."""
    if machine.phase != "repairing":
        assert machine.begin_repair().ok
    layers = machine.view().dirty.layers  # type: ignore[union-attr]
    assert machine.handle(RepairDone(tuple(layers), "reloaded")).reply.ok
    assert machine.phase == "clean"


def claim(record: LayoutRecord, engine: str) -> FetchLayoutField:
    return FetchLayoutField(engine, f"s{engine}", record.version, record.digest)


def rejoin(engine: str, target: LayoutRecord = MOVED) -> RejoinRequest:
    return RejoinRequest(engine, f"s{engine}", target.version, target.digest, target.rows)


def refused(reply: Reply, reason: Reason, *advice: str) -> None:
    assert reply.status is not Status.OK and reply.reason is reason, reply
    for words in advice:
        assert words in reply.message, (words, reply.message)


# -- the daemon's refusals, one case per rung ----------------------------------------------------


def attach_engine_id_free() -> None:
    machine = daemon("A")
    refused(machine.attach_engine(AttachRequest("A"), "s2"), Reason.ENGINE_ID_IN_USE, "picks a new one")
    assert machine.attach_engine(AttachRequest("A2"), "sA2").ok


def attach_has_room() -> None:
    machine = daemon(*(f"E{i}" for i in range(64)))
    refused(machine.attach_engine(AttachRequest("X"), "sX"), Reason.TOO_MANY_ATTACHMENTS, "Retry after some stop")
    machine.detach_engine("E0", "sE0")
    assert machine.attach_engine(AttachRequest("X"), "sX").ok


def fetch_is_dirty() -> None:
    machine = torn(daemon("A"), "A", "B")
    refused(machine.fetch_check(claim(INITIAL, "B")), Reason.DIRTY, REPAIR)
    repaired(machine)
    assert machine.fetch_check(claim(INITIAL, "B")).ok


def fetch_is_repairing() -> None:
    machine = torn(daemon("A", auto_repair=True), "A", "B")
    refused(machine.fetch_check(claim(INITIAL, "B")), Reason.REPAIRING, "retry when the repair ends")
    repaired(machine)
    assert machine.fetch_check(claim(INITIAL, "B")).ok


def fetch_move_pending() -> None:
    machine = daemon("A")
    assert begin(machine, "A").ok
    attach(machine, "B")
    refused(machine.fetch_check(claim(INITIAL, "B")), Reason.MOVE_PENDING, "retry after it ends")
    assert commit(machine, "A").ok
    # The engine started again reads the record the move left, and claims it.
    assert machine.fetch_check(claim(machine.view().record, "B")).ok  # type: ignore[arg-type]


def fetch_plugin_complete() -> None:
    machine = daemon("A")
    refused(machine.fetch_check(None, gap="fetch_hook_missing"), Reason.PLUGIN_INCOMPLETE, "tested with")
    assert machine.fetch_check(claim(INITIAL, "A")).ok  # a tested sglang applies every hook


def fetch_claims_or_initial() -> None:
    machine = moved(daemon("A"), "A")
    refused(machine.fetch_check(None), Reason.OLDER_ENGINE_AFTER_MOVE, "Install the expert-layout plugin", RESTART)
    assert machine.attach_engine(AttachRequest("B"), "sB").ok  # the plugin installed: it attaches and claims
    assert machine.fetch_check(claim(MOVED, "B")).ok
    assert daemon().fetch_check(None).ok  # or the daemons restarted: served at the initial layout


def fetch_digest_is_current() -> None:
    machine = moved(daemon("A"), "A", "B")
    refused(machine.fetch_check(claim(INITIAL, "B")), Reason.DIGEST_MISMATCH, "start from the daemon's record")
    assert machine.fetch_check(claim(MOVED, "B")).ok


def begin_has_record() -> None:
    refused(begin(daemon("A", record=None), "A"), Reason.NO_RECORD, "--enable-eplb")
    assert begin(daemon("A"), "A").ok  # the daemons started with --enable-eplb keep a record


def begin_is_dirty() -> None:
    machine = torn(daemon("A"), "A", "B")
    refused(begin(machine, "B"), Reason.DIRTY, REPAIR)
    repaired(machine)
    assert begin(machine, "B").ok


def begin_is_repairing() -> None:
    machine = torn(daemon("A", auto_repair=True), "A", "B")
    refused(begin(machine, "B"), Reason.REPAIRING, "retry when the repair ends")
    repaired(machine)
    assert begin(machine, "B").ok


def begin_saw_non_following() -> None:
    machine = daemon("A")
    assert machine.fetch_check(None).ok  # an engine without the plugin
    refused(begin(machine, "A"), Reason.NON_FOLLOWING_SEEN, RESTART)
    assert begin(daemon("A"), "A").ok


def begin_foreign_pending() -> None:
    machine = daemon("A")
    assert begin(machine, "A").ok
    # B attached while A moves (alone when A began): its begin waits for A's move.
    assert machine.attach_engine(AttachRequest("B"), "sB").ok
    refused(begin(machine, "B"), Reason.MOVE_PENDING, "retry later")
    assert machine.abort_move(AbortRequest("A", "sA")).ok
    machine.detach_engine("A", "sA")
    assert begin(machine, "B").ok


def begin_alone() -> None:
    machine = daemon("A", "B")
    refused(begin(machine, "A"), Reason.OTHER_ENGINE_ATTACHED, "resumes when they detach")
    machine.detach_engine("B", "sB")
    assert begin(machine, "A").ok


def claim_holds() -> None:
    machine = daemon()
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.NOT_ATTACHED, "attach first")
    assert machine.attach_engine(AttachRequest("S"), "sS").ok and machine.park_engine(ParkRequest("S", "sS")).ok
    assert machine.claim_primary(ClaimRequest("S", "sS")).ok


def park_holds() -> None:
    machine = daemon()
    refused(machine.park_engine(ParkRequest("S", "sS")), Reason.NOT_ATTACHED, "attach first")
    assert machine.attach_engine(AttachRequest("S"), "sS").ok
    assert machine.park_engine(ParkRequest("S", "sS")).ok


def claim_is_parked() -> None:
    machine = daemon("S")
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.NOT_PARKED, "only a parked standby")
    assert machine.park_engine(ParkRequest("S", "sS")).ok
    assert machine.claim_primary(ClaimRequest("S", "sS")).ok


def _parked(*primaries: str, record: LayoutRecord | None = INITIAL, auto_repair: bool = False) -> DaemonMachine:
    machine = daemon(*primaries, "S", record=record, auto_repair=auto_repair)
    assert machine.park_engine(ParkRequest("S", "sS")).ok
    return machine


def claim_none_unparked() -> None:
    machine = _parked("A")
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.PRIMARY_ATTACHED, "stay parked")
    effect = machine.detach_engine("A", "sA")
    assert "S" in effect.notified  # the daemon tells the parked standby, which claims again
    assert machine.claim_primary(ClaimRequest("S", "sS")).ok


def claim_has_record() -> None:
    machine = _parked(record=None)
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.NO_RECORD, "start the engine as a primary")
    assert machine.attach_engine(AttachRequest("P"), "sP").ok and machine.fetch_check(None).ok


def claim_is_dirty() -> None:
    machine = torn(_parked("A"), "A")
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.DIRTY, REPAIR)
    repaired(machine)
    assert machine.claim_primary(ClaimRequest("S", "sS")).ok


def claim_is_repairing() -> None:
    machine = torn(_parked("A", auto_repair=True), "A")
    refused(machine.claim_primary(ClaimRequest("S", "sS")), Reason.REPAIRING, "stay parked")
    step = machine.handle(RepairDone((0,), "reloaded"))
    assert "S" in step.notify  # told when the repair ends
    assert machine.claim_primary(ClaimRequest("S", "sS")).ok


def repair_is_repairing() -> None:
    machine = torn(daemon("A", auto_repair=True), "A")
    refused(machine.begin_repair(), Reason.REPAIR_RUNNING, "wait for it to end")
    repaired(machine)
    assert machine.query_state().data["phase"] == "clean"


def rejoin_holds() -> None:
    machine = daemon("A")
    refused(machine.rejoin_layout(rejoin("X")), Reason.NOT_ATTACHED, "start the engine again")
    machine.detach_engine("A", "sA")
    assert machine.attach_engine(AttachRequest("A2"), "sA2").ok  # the engine started again asks with its session
    assert machine.rejoin_layout(rejoin("A2")).ok


def rejoin_has_record() -> None:
    refused(daemon("A", record=None).rejoin_layout(rejoin("A")), Reason.NO_RECORD, "--enable-eplb")
    assert daemon("A").rejoin_layout(rejoin("A")).ok


def rejoin_is_dirty() -> None:
    machine = torn(daemon("X"), "X", "A")
    refused(machine.rejoin_layout(rejoin("A")), Reason.DIRTY, REPAIR)
    repaired(machine)
    assert machine.rejoin_layout(rejoin("A")).ok


def rejoin_is_repairing() -> None:
    machine = torn(daemon("X", auto_repair=True), "X", "A")
    refused(machine.rejoin_layout(rejoin("A")), Reason.REPAIRING, "once the repair has ended", "do not restart")
    repaired(machine)
    assert machine.rejoin_layout(rejoin("A")).ok


def rejoin_move_pending() -> None:
    machine = daemon("X")
    assert begin(machine, "X").ok
    assert machine.attach_engine(AttachRequest("A"), "sA").ok
    refused(machine.rejoin_layout(rejoin("A")), Reason.MOVE_PENDING, "once the move has ended", "do not restart")
    assert machine.abort_move(AbortRequest("X", "sX")).ok
    machine.detach_engine("X", "sX")
    assert machine.rejoin_layout(rejoin("A")).ok


def rejoin_behind() -> None:
    machine = moved(daemon("A"), "A")  # at version 1: an engine's stale view asks it to rejoin at version 1
    refused(machine.rejoin_layout(rejoin("A")), Reason.NOT_BEHIND, "start the engine again", "do not restart")
    # Started again, the engine finds every daemon at version 1 and adopts it: the daemon serves as it was.
    assert machine.view().record == MOVED and begin(machine, "A").ok


def rejoin_only_attached() -> None:
    machine = daemon("A", "B")
    text = "start this engine again once that one is up or has stopped"
    refused(machine.rejoin_layout(rejoin("A")), Reason.OTHER_ENGINE_ATTACHED, text, "do not restart")
    refused(machine.rejoin_layout(rejoin("B")), Reason.OTHER_ENGINE_ATTACHED, text)
    machine.detach_engine("A", "sA")  # both failed; each, started again alone, rejoins
    assert machine.rejoin_layout(rejoin("B")).ok


def rejoin_saw_non_following() -> None:
    machine = daemon("A")
    assert machine.fetch_check(None).ok
    refused(machine.rejoin_layout(rejoin("A")), Reason.NON_FOLLOWING_SEEN, "start this daemon again", "alone")
    assert daemon("A").rejoin_layout(rejoin("A")).ok  # that daemon started again, alone


def rejoin_rejoin_fits() -> None:
    machine = daemon("A")
    bad = RejoinRequest("A", "sA", 1, MOVED.digest, ((0, 1),))
    refused(machine.rejoin_layout(bad), Reason.BAD_ROWS, "--ep-num-redundant-experts")
    assert machine.rejoin_layout(rejoin("A")).ok


ADVICE: dict[tuple[str, str], Callable[[], None]] = {
    ("attach", "engine_id_free"): attach_engine_id_free,
    ("attach", "has_room"): attach_has_room,
    ("fetch", "is_dirty"): fetch_is_dirty,
    ("fetch", "is_repairing"): fetch_is_repairing,
    ("fetch", "move_pending"): fetch_move_pending,
    ("fetch", "plugin_complete"): fetch_plugin_complete,
    ("fetch", "claims_or_initial"): fetch_claims_or_initial,
    ("fetch", "digest_is_current"): fetch_digest_is_current,
    ("begin", "has_record"): begin_has_record,
    ("begin", "is_dirty"): begin_is_dirty,
    ("begin", "is_repairing"): begin_is_repairing,
    ("begin", "saw_non_following"): begin_saw_non_following,
    ("begin", "foreign_pending"): begin_foreign_pending,
    ("begin", "alone"): begin_alone,
    ("park", "holds"): park_holds,
    ("claim", "holds"): claim_holds,
    ("claim", "is_parked"): claim_is_parked,
    ("claim", "none_unparked"): claim_none_unparked,
    ("claim", "has_record"): claim_has_record,
    ("claim", "is_dirty"): claim_is_dirty,
    ("claim", "is_repairing"): claim_is_repairing,
    ("repair", "is_repairing"): repair_is_repairing,
    ("rejoin", "holds"): rejoin_holds,
    ("rejoin", "has_record"): rejoin_has_record,
    ("rejoin", "is_dirty"): rejoin_is_dirty,
    ("rejoin", "is_repairing"): rejoin_is_repairing,
    ("rejoin", "move_pending"): rejoin_move_pending,
    ("rejoin", "behind"): rejoin_behind,
    ("rejoin", "only_attached"): rejoin_only_attached,
    ("rejoin", "saw_non_following"): rejoin_saw_non_following,
    ("rejoin", "rejoin_fits"): rejoin_rejoin_fits,
}

# Refusals that answer the engine's own code: the adapter sent what the session said, so these
# reach an operator only through the engine's rebalance or startup step, whose text is checked below.
TO_THE_ENGINE: dict[tuple[str, str], str] = {
    ("fetch", "has_record"): "served: not a refusal",
    ("fetch", "claims"): "served (turning rebalancing off): not a refusal",
    ("fetch", "holds"): "served (turning rebalancing off): not a refusal",
    ("begin", "holds"): "the session's own token: its rebalance stops, the next engine attaches anew",
    ("begin", "layers_valid"): "sglang's chunk, checked before any change",
    ("begin", "own_move_pending"): "the session never begins twice",
    ("begin", "base_is_current"): "the rebalance stops; the next engine's startup adopts the record",
    ("commit", "holds"): "the session's own token",
    ("commit", "is_dirty"): "the move's commit is refused: the rebalance stops with the daemon's advice",
    ("commit", "moved_by"): "the session commits only what it began",
    ("commit", "pending_layers_are"): "the session commits the layers it began",
    ("commit", "rows_fit"): "sglang's map, checked: the move stays pending and the session aborts it",
    ("abort", "holds"): "the session's own token",
    ("abort", "moved_by"): "nothing to abort: answered ok",
    ("detach", "holds"): "an EOF the daemon saw already",
    ("detach", "moved_by"): "a detach is never refused",
    ("repair", "has_record"): "nothing to repair: the daemon never moves experts",
    ("repair", "is_dirty"): "nothing to repair: the daemon is clean",
    ("repair_done", "is_repairing"): "the daemon's own reload reports to it",
    ("repair_done", "repair_is_of"): "the daemon's own reload reports to it",
    ("repair_failed", "is_repairing"): "the daemon's own reload reports to it",
}


def test_every_refusing_rung_has_its_advice_case_or_says_why_not() -> None:
    rungs = {(name, r.conjunct.method) for name, ladder in LADDERS.items() for r in ladder.rungs}
    assert rungs == set(ADVICE) | set(TO_THE_ENGINE), rungs ^ (set(ADVICE) | set(TO_THE_ENGINE))
    assert not set(ADVICE) & set(TO_THE_ENGINE)


@pytest.mark.parametrize("rung", sorted(ADVICE), ids=["-".join(k) for k in sorted(ADVICE)])
def test_the_advice_of_a_daemon_refusal_followed_brings_the_request_back(rung: tuple[str, str]) -> None:
    ADVICE[rung]()


# -- the engine's startup failures -----------------------------------------------------------


def _start(
    daemons: list[DaemonMachine | None], engine: str = "E", layout: EngineLayout = LAYOUT, gone: set[int] = frozenset()
) -> Step:
    """An engine's startup on ``daemons`` (``gone``: ranks whose daemon's socket refuses connections),
    every rank's fetch, and the server's stop: the step its startup ended with."""
    ranks = Ranks(daemons, layout, engine)
    ranks.gone = set(gone)
    steps = ranks.step(lambda r: Started(r, ROWS))
    assert len({(s.go, s.reason) for s in steps if s is not None}) == 1, steps
    step = steps[0]
    assert step is not None
    if step.go is Go.PROCEED:
        for r, rank in enumerate(ranks.ranks):
            machine = daemons[r]
            assert machine is not None
            reply = machine.fetch_check(rank.session.fetch_claim(r)).to_wire()
            assert rank.session.step(Fetched(r, reply)).done.go is Go.PROCEED
    for r, machine in enumerate(daemons):
        if machine is not None:  # the server stops (or failed): its attachments end
            machine.detach_engine(engine, f"s{engine}{r}")
    return step


def _failed(step: Step, reason: Reason, *advice: str) -> None:
    assert step.go is Go.STOP and step.reason is reason, step
    for words in advice:
        assert words in step.message, (words, step.message)


def test_daemons_that_disagree_restarted_let_the_engine_start() -> None:
    # A daemon without a record (started without --enable-eplb) beside a moved one.
    daemons: list[DaemonMachine | None] = [moved(daemon("A"), "A"), daemon(record=None)]
    _failed(_start(daemons), Reason.MIXED_AFTER_MOVE, RESTART)
    other = LayoutRecord.build(((0, 1, 3, 2), ROWS[1]), 4, 1)
    differ: list[DaemonMachine | None] = [daemon(record=MOVED), daemon(record=other)]
    _failed(_start(differ), Reason.DISAGREE, RESTART)
    assert _start([daemon(), daemon()]).go is Go.PROCEED


def test_a_dirty_daemon_repaired_lets_the_engine_start() -> None:
    daemons: list[DaemonMachine | None] = [torn(daemon("A"), "A"), daemon()]
    _failed(_start(daemons), Reason.DIRTY, REPAIR, RESTART)
    repaired(daemons[0])  # type: ignore[arg-type]
    assert _start(daemons).go is Go.PROCEED


def test_a_shape_mismatch_started_with_the_daemons_shape_starts() -> None:
    wide = LayoutRecord.initial(((0, 1, 2, 3, 0), (3, 2, 1, 0, 1)), 4)
    _failed(_start([daemon(record=wide)]), Reason.SHAPE_MISMATCH, "--ep-num-redundant-experts")
    layout = EngineLayout(2, 5, 4, wide.digest, routes_by_metadata=True)
    ranks = Ranks([daemon(record=wide)], layout, "E")
    [step] = ranks.step(lambda r: Started(r, wide.rows))
    assert step is not None and step.go is Go.PROCEED


def test_an_engine_routing_statically_started_with_eplb_adopts_the_moved_layout() -> None:
    static = EngineLayout(2, 4, 4, INITIAL.digest, routes_by_metadata=False)
    _failed(_start([daemon(record=MOVED)], layout=static), Reason.NOT_ROUTING_BY_METADATA, "--enable-eplb")
    assert _start([daemon(record=MOVED)]).go is Go.PROCEED


def test_a_lost_daemon_started_again_alone_rejoins_and_the_engine_starts() -> None:
    kept = daemon(record=MOVED)
    step = _start([kept, None], gone={1})
    _failed(step, Reason.UNREADABLE, "ConnectionRefusedError", "start the daemon at that socket again", "alone")
    fresh = daemon()  # started again from disk, alone: at the initial layout
    assert _start([kept, fresh]).go is Go.PROCEED
    assert fresh.view().record == MOVED


def test_two_engines_refused_a_rejoin_start_again_one_at_a_time() -> None:
    # Rank 1's daemon started again from disk; engines A and B attached to it at once.
    kept, fresh = daemon(record=MOVED), daemon("B")
    step = _start([kept, fresh], "A")
    _failed(step, Reason.REJOIN_REFUSED, "start this engine again once that one is up or has stopped")
    assert RESTART not in step.message
    fresh.detach_engine("B", "sB")  # B failed too (or is up: then its startup rejoined)
    assert _start([kept, fresh], "A").go is Go.PROCEED
    assert fresh.view().record == MOVED
