"""The daemon machine (docs/protocol.md §4): a python-statemachine ``StateMachine`` whose states
are the record's phases, and which takes each request as its ladder declares.

The parts, one module each:

- ``layout_sm.daemon_view``: what a daemon knows (``DaemonView``, one immutable value) and the
  conjuncts of the spec's daemon actions, its methods;
- ``layout_sm.replies``: the words a request's declaration is written in (``Ladder``, ``Rung``,
  ``Outcome``, ``Say``);
- ``layout_sm.ladders``: each request, declared once as a ladder of conjuncts in the precedence
  of docs/protocol.md §4, with the reply when each is the first to fail (``LADDERS``);
- this module: the machine. Its transitions declare from which phase each request may be
  accepted and where that leads; the accepting transition's guards are its ladder's conjuncts,
  and every other case is answered by a self-loop whose action gives the ladder's first failing
  rung's outcome.

The machine takes a request with ``layout_sm.declared``, the runner of every machine of this
package: the first of the phase's declared transitions whose guards hold (asked of the view) runs
its action, and the phase the action leaves must be the transition's target. An adapter calls
``DaemonMachine`` methods and writes the reply back; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from statemachine import State, StateMachine

from layout_sm.daemon_view import (
    CLEAN,
    DIRTY,
    LOADING,
    MAX_ATTACHMENTS,
    NO_RECORD,
    PENDING,
    REPAIRING,
    Answer,
    Attach,
    DaemonConjuncts,
    DaemonView,
    Detach,
    DetachEffect,
    DirtyInfo,
    Fetch,
    Move,
    RepairDone,
    RepairFailed,
    Request,
)
from layout_sm.declared import Declared
from layout_sm.ladders import (
    ABORT,
    ATTACH,
    BEGIN,
    CLAIM,
    COMMIT,
    DETACH,
    FETCH,
    LADDERS,
    PARK,
    REJOIN,
    REPAIR,
    REPAIR_DONE,
    REPAIR_FAILED,
    query_reply,
)
from layout_sm.messages import (
    AbortRequest,
    AttachRequest,
    BeginRequest,
    ClaimRequest,
    CommitRequest,
    FetchLayoutField,
    LayoutRequest,
    ParkRequest,
    QueryRequest,
    RejoinRequest,
    RepairRequest,
)
from layout_sm.reasons import Reply
from layout_sm.record import LayoutRecord
from layout_sm.repair import RepairPlan, repair_plan
from layout_sm.replies import Outcome


class DaemonState(DaemonConjuncts):
    """python-statemachine's model of a ``DaemonMachine``: the daemon's view, the one place its
    state is kept. The phase is the view's; the conjuncts, read off the view, are what
    python-statemachine's own engine asks as guards (this package's runner asks the view itself)."""

    __slots__ = ("view",)

    def __init__(self) -> None:
        self.view: DaemonView | None = None  # None while the daemon loads its weights

    @property
    def phase(self) -> str:
        return LOADING if self.view is None else self.view.phase

    @phase.setter
    def phase(self, target: str) -> None:
        """A transition's target: the phase its action left the view in must be that target."""
        if target != self.phase:
            raise RuntimeError(
                f"a transition declared to enter {target!r} left the daemon {self.phase!r}: "
                "the daemon machine's declarations are inconsistent"
            )

    def _loaded(self) -> DaemonView:
        assert self.view is not None, "the daemon's weights are not loaded yet"
        return self.view

    @property
    def record(self) -> LayoutRecord | None:  # type: ignore[override]
        return self._loaded().record

    @property
    def attachments(self) -> Mapping[str, str]:  # type: ignore[override]
        return self._loaded().attachments

    @property
    def pending(self) -> Move | None:  # type: ignore[override]
        return self._loaded().pending

    @property
    def dirty(self) -> DirtyInfo | None:  # type: ignore[override]
        return self._loaded().dirty

    @property
    def non_following_seen(self) -> bool:  # type: ignore[override]
        return self._loaded().non_following_seen

    @property
    def repairing(self) -> bool:  # type: ignore[override]
        return self._loaded().repairing

    @property
    def auto_repair(self) -> bool:  # type: ignore[override]
        return self._loaded().auto_repair

    @property
    def parked(self) -> frozenset[str]:  # type: ignore[override]
        return self._loaded().parked


@dataclass(frozen=True)
class DaemonStep:
    """What the adapter does once the machine took a request, in this order (etcd raft's ``Ready``):
    send ``answer`` to the asker (a ``DetachEffect`` has no one to go to: the adapter logs it), write the
    notice on the attach connection of each parked standby in ``notify``, then run ``reload``: sglang's
    loading of the plan's layers at its rows (a torn move's repair, or a rejoin), which the adapter ends
    with the machine's ``RepairDone`` or ``RepairFailed``. ``answer_after_reload``: the asker waits for
    the reload (the operator's ``expert-layout repair``), and the end's answer is its answer; otherwise
    the reload runs beside the daemon's requests and ``answer`` goes out at once."""

    answer: Answer
    notify: tuple[str, ...] = ()
    reload: RepairPlan | None = None
    answer_after_reload: bool = False

    @property
    def reply(self) -> Reply:
        assert isinstance(self.answer, Reply), "a request's step answers with a reply"
        return self.answer


def _notices(request: Request, answer: Answer) -> tuple[str, ...]:
    """The parked standbys an answer names (spec: ``Notify``), but the asker: a park's reply is its own notice."""
    if isinstance(answer, DetachEffect):
        return answer.notified
    asker = request.engine_id if isinstance(request, ParkRequest) else None
    return tuple(e for e in answer.data.get("notified", ()) if e != asker)


class EventArguments(dict[str, Any]):
    """A request event's arguments, as python-statemachine hands them to the callbacks that name
    them: the event, the request, and the request's fields (a field the request computes, such as
    a fetch's claimed digest, is read off it when a guard first names it)."""

    def __init__(self, event: str, request: Request) -> None:
        super().__init__(vars(request), event=event, request=request)

    def __missing__(self, name: str) -> Any:
        return getattr(self["request"], name)


def _answered(*phases: State) -> Any:
    """The request is answered in each of ``phases`` without a phase change: the action gives
    the outcome of its ladder's first failing conjunct."""
    transitions = phases[0].to.itself(internal=True, on="answer")
    for phase in phases[1:]:
        transitions |= phase.to.itself(internal=True, on="answer")
    return transitions


def _kept(*phases: State, cond: list[str]) -> Any:
    """The request is accepted in each of ``phases`` without a phase change."""
    transitions = phases[0].to.itself(internal=True, cond=cond, on="accept")
    for phase in phases[1:]:
        transitions |= phase.to.itself(internal=True, cond=cond, on="accept")
    return transitions


# The machine's event for each request it takes (``handle``).
_EVENTS: dict[type, str] = {
    Attach: "attach",
    Fetch: "fetch",
    BeginRequest: "begin",
    CommitRequest: "commit",
    AbortRequest: "abort",
    Detach: "detach",
    RepairRequest: "repair",
    RepairDone: "repair_done",
    RepairFailed: "repair_failed",
    ParkRequest: "park",
    ClaimRequest: "claim",
    RejoinRequest: "rejoin",
}


class DaemonMachine(StateMachine):
    """The daemon's layout record as a state machine; its request events are named after the
    spec's daemon actions (Attach, Fetch, Begin, Commit, Abort, Detach).

    The transitions declare from which phase each request may be accepted and where that leads;
    the accepting transition's guards are the request's ladder (``LADDERS``), and in every phase of
    a loaded daemon a self-loop answers the request otherwise, with the step of the first
    conjunct that fails. A request before the weights are loaded, or a second load, has no
    transition and raises ``TransitionNotAllowed``.

    A query reads the view and changes nothing, so it is no event.
    """

    # A daemon loads its weights, then keeps a record (--enable-eplb) or none for its whole life.
    loading = State(LOADING, initial=True)
    no_record = State(NO_RECORD)
    clean = State(CLEAN)
    pending = State(PENDING)
    dirty = State(DIRTY)
    repairing = State(REPAIRING)

    _LOADED = (no_record, clean, pending, dirty, repairing)

    loaded_with_record = loading.to(clean, cond="record_loaded", on="load")
    loaded_without_record = loading.to(no_record, unless="record_loaded", on="load")

    # Attach and the fetch check never change the phase (the spec's Attach and Fetch leave dphase).
    attach = _kept(*_LOADED, cond=ATTACH.guards) | _answered(*_LOADED)
    fetch = clean.to.itself(internal=True, cond=FETCH.guards, on="accept") | _answered(*_LOADED)
    # Begin: only a clean daemon takes a move (the ladder's conjuncts about the phase hold nowhere
    # else); refused or busy otherwise, in every phase.
    begin = clean.to(pending, cond=BEGIN.guards, on="accept") | _answered(*_LOADED)
    # Commit: the pending move's rows are stored; refused otherwise, and a pending move stays pending.
    commit = pending.to(clean, cond=COMMIT.guards, on="accept") | _answered(*_LOADED)
    # Abort: the mover's own session clears its move; otherwise nothing to abort, or refused.
    abort = pending.to(clean, cond=ABORT.guards, on="accept") | _answered(*_LOADED)
    # Detach: the mover leaving mid-move makes the daemon dirty; otherwise the attachment is
    # dropped, or a stale EOF ignored.
    detach = (
        pending.to(repairing, cond=DETACH.branch_guards(0), on="accept")
        | pending.to(dirty, cond=DETACH.guards, on="accept")
        | _answered(*_LOADED)
    )
    # The repair of a torn move: the operator's (dirty -> repairing), its end (clean at the base
    # version), its failure (dirty again, the reason kept).
    repair = dirty.to(repairing, cond=REPAIR.guards, on="accept") | _answered(*_LOADED)
    repair_done = repairing.to(clean, cond=REPAIR_DONE.guards, on="accept") | _answered(*_LOADED)
    repair_failed = repairing.to(dirty, cond=REPAIR_FAILED.guards, on="accept") | _answered(*_LOADED)
    # A warm standby: a park never changes the phase; a claim is granted only on a clean
    # daemon (a pending move's mover is attached and unparked: taken), answered in every phase.
    park = _kept(*_LOADED, cond=PARK.guards) | _answered(*_LOADED)
    claim = clean.to.itself(internal=True, cond=CLAIM.guards, on="accept") | _answered(*_LOADED)
    # A daemon started again from disk rejoins at the others' record: it reloads every layer as a
    # repair does (clean -> repairing; the repair's end makes it clean at that record).
    rejoin = clean.to(repairing, cond=REJOIN.guards, on="accept") | _answered(*_LOADED)

    # Told of every step taken (event, payload, answer, view after): the daemon adapter's trace.
    observer: Callable[[str, Request, Answer, DaemonView], None] | None = None

    def __init__(self, record: LayoutRecord | None = None, auto_repair: bool = True, *, loaded: bool = True) -> None:
        """A daemon's machine, loaded with ``record`` (None: no record), or still ``loading`` (``loaded=False``:
        ``load_weights`` takes the record once the weights are in memory).

        python-statemachine's own ``__init__`` registers every callback of the class anew for each
        instance; this package's runner reads the declarations once per class (``declared``), so a
        machine is only its model. ``tools.mirror.reference.ReferenceDaemonMachine`` is the same class
        run by python-statemachine's engine."""
        self.model = DaemonState()
        if loaded:
            self.load_weights(record, auto_repair)

    def load_weights(self, record: LayoutRecord | None, auto_repair: bool = True) -> None:
        """The weights are in memory: the record of their layout (None: the daemon keeps none).
        Once per machine: a second load has no transition and raises."""
        event = "loaded_with_record" if record is not None else "loaded_without_record"
        arguments = {"event": event, "record": record, "auto_repair": auto_repair}
        self.declared().fire_on(self, self.model, event, arguments)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(phase={self.phase!r})"

    @classmethod
    def declared(cls) -> Declared:
        """This class's declared transitions, read once (``layout_sm.declared``); its guards are
        the view's conjuncts."""
        return Declared.of(cls, DaemonView, "phase")

    # -- loading (python-statemachine's own event, once per machine) ----------------------

    def record_loaded(self, record: LayoutRecord | None) -> bool:
        return record is not None

    def load(self, record: LayoutRecord | None, auto_repair: bool) -> None:
        self.model.view = DaemonView(record, auto_repair=auto_repair)

    # -- taking a step -------------------------------------------------------------------

    def take(self, event: str, request: Request) -> DaemonStep:
        """Take ``event`` as python-statemachine would: the first of the phase's declared transitions
        whose guards hold runs its action, which changes the view and makes the answer; the phase
        the view is then in must be the transition's target. Every request method below is one
        call of it.

        Returns what the adapter does next (``DaemonStep``): the answer, the parked standbys to tell,
        and the reload a transition into ``repairing`` starts (a torn move's repair, or a rejoin)."""
        answer, entered = self._take(event, request)
        if not entered:
            return DaemonStep(answer, _notices(request, answer))
        plan = repair_plan(self._view)
        if isinstance(plan, RepairPlan):
            return DaemonStep(answer, _notices(request, answer), plan, answer_after_reload=event == "repair")
        # Cannot happen by the machine (layout_sm.repair); the daemon must not stay repairing with no
        # reload running: the repair fails at once, with the plan's refusal as the reason.
        failed, _ = self._take("repair_failed", RepairFailed(plan.reason, plan.message))
        return DaemonStep(failed if event == "repair" else answer, _notices(request, failed))

    def replay(self, event: str, request: Request) -> Answer:
        """One event, as a trace records it (a trace checker replays a daemon's trace line by line)."""
        return self._take(event, request)[0]

    def _take(self, event: str, request: Request) -> tuple[Answer, bool]:
        """The answer, and whether the step entered ``repairing`` (its reload is to run)."""
        view = self.model.view
        # Before the weights are loaded the phase is "loading", which declares no request: the runner raises.
        asked = self.model if view is None else view
        rule, answer = self.declared().take(self, asked, event, EventArguments(event, request))
        self.model.phase = rule.target
        if self.observer is not None:
            self.observer(event, request, answer, self.model.view)
        return answer, rule.target == REPAIRING and rule.source != REPAIRING

    def _reply(self, event: str, request: Request) -> Reply:
        answer = self.take(event, request).answer
        assert isinstance(answer, Reply), f"{event} answers with a reply"
        return answer

    def accept(self, event: Any, request: Request) -> Answer:
        """The accepting transition's action: the ladder's accepted step."""
        return self._apply(LADDERS[str(event)].accepting(self._view, request), request)

    def answer(self, event: Any, request: Request) -> Answer:
        """The answering self-loop's action: the step of the ladder's first failing conjunct."""
        failing = LADDERS[str(event)].first_failing(self._view, request)
        if failing is None:
            raise RuntimeError(
                f"{event} in phase {self.phase!r}: every conjunct of its ladder holds, but the machine declares "
                f"no transition accepting it from this phase; the declaration of {event} is inconsistent"
            )
        return self._apply(failing.outcome, request)

    def _apply(self, outcome: Outcome, request: Request) -> Answer:
        view = self._view
        answer = outcome.answer(view, request)
        if outcome.change is not None:
            self.model.view = outcome.change(view, request)
        return answer

    # -- reading and loading ------------------------------------------------------------

    @property
    def _view(self) -> DaemonView:
        view = self.model.view
        assert view is not None, "the daemon's weights are not loaded yet"
        return view

    @_view.setter
    def _view(self, view: DaemonView) -> None:
        self.model.view = view

    def view(self) -> DaemonView:
        return self._view

    def restore(self, view: DaemonView) -> None:
        """Put the machine in ``view``'s state (the explorer reuses one machine per daemon)."""
        self.model.view = view

    @property
    def phase(self) -> str:
        return self.model.phase

    # -- requests -----------------------------------------------------------------------

    def handle(self, request: LayoutRequest | Request, session: str | None = None) -> DaemonStep:
        """The adapter's one entry: take whatever reached the daemon (a parsed layout request; an attach
        with ``session``, the fresh token the adapter made; an attach connection's EOF; sglang's
        ``fetch_state`` with its claim; a reload's end) and say what to do next. A query reads the view
        and changes nothing."""
        if isinstance(request, QueryRequest):
            return DaemonStep(query_reply(self._view, request))
        if isinstance(request, AttachRequest):
            if session is None:
                raise ValueError("attach needs the fresh session token made by the adapter")
            request = Attach(request.engine_id, session, request.known_digest)
        event = _EVENTS.get(type(request))
        if event is None:
            raise TypeError(f"not a request of the daemon's machine: {type(request).__name__}")
        return self.take(event, request)

    def attach_engine(self, request: AttachRequest, session: str) -> Reply:
        return self._reply("attach", Attach(request.engine_id, session, request.known_digest))

    def fetch_check(self, claim: FetchLayoutField | None, gap: str | None = None) -> Reply:
        """The layout check of sglang's ``fetch_state``; sets the sticky non-following flag. ``gap``: the
        engine says part of its layout plugin is missing (``Fetch.gap``)."""
        return self._reply("fetch", Fetch(claim, gap))

    def begin_move(self, request: BeginRequest) -> Reply:
        return self._reply("begin", request)

    def commit_move(self, request: CommitRequest) -> Reply:
        return self._reply("commit", request)

    def abort_move(self, request: AbortRequest) -> Reply:
        return self._reply("abort", request)

    def detach_engine(self, engine_id: str, session: str) -> DetachEffect:
        """The attach connection of ``engine_id`` reached EOF (however the engine died)."""
        effect = self.take("detach", Detach(engine_id, session)).answer
        assert isinstance(effect, DetachEffect), "a detach answers with what it did"
        return effect

    def begin_repair(self) -> Reply:
        """The operator's ``expert-layout repair``: a dirty daemon turns repairing (the adapter then reloads)."""
        return self._reply("repair", RepairRequest())

    def park_engine(self, request: ParkRequest) -> Reply:
        """A warm standby parks its attachment; ``data["notified"]`` names the parked standbys to tell now."""
        return self._reply("park", request)

    def claim_primary(self, request: ClaimRequest) -> Reply:
        """A parked standby claims the primary role; granted with the record, or busy (taken), or refused."""
        return self._reply("claim", request)

    def rejoin_layout(self, request: RejoinRequest) -> Reply:
        """A daemon started again from disk rejoins at the others' record; the adapter then reloads
        every layer (``layout_sm.repair.repair_plan``) and ends it as a repair (``RepairDone``)."""
        return self._reply("rejoin", request)

    def query_state(self, include_map: bool = False) -> Reply:
        return self.handle(QueryRequest(include_map)).reply


__all__ = [
    "CLEAN",
    "DIRTY",
    "LOADING",
    "MAX_ATTACHMENTS",
    "NO_RECORD",
    "PENDING",
    "REPAIRING",
    "Attach",
    "DaemonMachine",
    "DaemonState",
    "DaemonStep",
    "DaemonView",
    "Detach",
    "DetachEffect",
    "DirtyInfo",
    "EventArguments",
    "Fetch",
    "Move",
    "RepairDone",
    "RepairFailed",
]
