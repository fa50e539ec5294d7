"""The engine's machines (docs/protocol.md §5 and §6): python-statemachine declarations and their model.

- ``StartupMachine`` (the spec's ``ephase``) and ``RebalanceMachine`` (the spec's ``reb[e].step``,
  and whether the engine rebalances at all) declare the spec's engine actions as events: states,
  transitions in the order of precedence, and the names of their guards and actions;
- ``EngineState`` is their model, the one place the session's state is kept (an
  ``layout_sm.engine.EngineView``): its methods are the guards (the spec's conjuncts, over the
  view and the event's arguments) and the actions (they replace the view and return the step's
  ``Step``).

``layout_sm.session.EngineSession`` fires the events from the tables of ``layout_sm.declared``.
Every rank all-gathers what it saw, then takes the same transitions on the same list, so every
rank reaches the same outcome without another round of messages: no rank can be left waiting
in a collective that the others skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from statemachine import State, StateMachine

from layout_sm.engine import (
    EngineLayout,
    EngineView,
    Go,
    RankAnswer,
    RankFinding,
    RecordStamp,
    Severity,
    StartupOutcome,
    Step,
    fetch_refusal,
    needs_wait,
    unwritten_slots_warning,
)
from layout_sm.reasons import REPAIR_OR_RESTART, RESTART_DAEMONS, Reason, Reply, Status
from layout_sm.record import DigestCache, LayoutRecord

# Startup refusals whose texts are long enough to read better whole (``str.format`` templates).
_MIXED_AFTER_MOVE = (
    "ranks {without} have daemons without a record but the daemons of ranks {moved} hold a layout other than "
    "the engine's initial one (versions {versions}); the weights cannot be trusted; " + RESTART_DAEMONS
)
_SHAPE_MISMATCH = (
    "the daemons' map is {daemons.num_layers} layers x {daemons.num_physical} physical slots of "
    "{daemons.num_logical} experts, the engine's is {engine.num_layers} x {engine.num_physical} of "
    "{engine.num_logical}; start the engine with the same --ep-num-redundant-experts as the daemons"
)


def _put(values: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*values[:i], value, *values[i + 1 :])


def _evolve(view: EngineView, changes: dict[str, Any]) -> EngineView:
    """``dataclasses.replace`` without re-running ``__init__``: a step changes the view a few
    times, and the view has no field to check or derive."""
    new = object.__new__(EngineView)
    fields = new.__dict__
    fields.update(view.__dict__)
    fields.update(changes)
    return new


def _reason_of(reply: object) -> Reason:
    """The reason code of a daemon's reply (``unreadable`` for a reply without one: sglang's own)."""
    try:
        return Reply.from_wire(reply).reason
    except ValueError:
        return Reason.UNREADABLE


def _ranks_where(findings: Sequence[RankFinding], kind: str) -> list[RankFinding]:
    return [f for f in findings if f.kind == kind]


def _ranks_true(flags: Sequence[bool]) -> frozenset[int]:
    return frozenset(rank for rank, flag in enumerate(flags) if flag)


def _listing(findings: Sequence[RankFinding]) -> str:
    return "; ".join(f"rank {f.rank}: {f.detail}" for f in findings)


class _ViewField:
    """A machine's state field (``model.<name>`` for python-statemachine) kept in the engine's view:
    read from it, and written into it only when the value changes."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, state: EngineState | None, owner: type | None = None) -> Any:
        return self if state is None else getattr(state.view, self.name)

    def __set__(self, state: EngineState, value: str) -> None:
        if value != getattr(state.view, self.name):
            state.view = _evolve(state.view, {self.name: value})


class EngineState:
    """python-statemachine's model of both engine machines: the one place the session's protocol
    state is kept (``view``), with the spec's conjuncts as guards and the actions that change it.

    ``phase`` and ``rebalance`` are the machines' state fields, read from the view and written
    into it when a transition enters its target. Guards read the view, the engine's own layout
    and the event's arguments; actions replace the view and return the step's ``Step``.
    """

    __slots__ = ("digests", "layout", "view")

    def __init__(self, view: EngineView, layout: EngineLayout | None) -> None:
        self.view = view
        self.layout = layout  # None only for an engine that never attached
        # The moved map's digest hashes again only the rows that changed: not state, a cache.
        self.digests = DigestCache()

    phase = _ViewField()
    rebalance = _ViewField()

    @property
    def role(self) -> str:
        return self.view.role

    @role.setter
    def role(self, value: str) -> None:
        if value != self.view.role:
            self.view = _evolve(self.view, {"role": value})

    def _set(self, **changes: Any) -> None:
        self.view = _evolve(self.view, changes)

    # -- startup guards: the spec's Attach, Poll, Timeout, Agree, Fetch ----------------------

    def not_found(self, rank: int) -> bool:
        """Attach: ``efind[e][r].found = "nothing"``."""
        return self.view.findings[rank] is None

    def waits(self, rank: int) -> bool:
        """Poll, Timeout: ``efind[e][r].found = "wait"`` (another engine's move is pending)."""
        finding = self.view.findings[rank]
        return finding is not None and needs_wait(finding)

    def move_ended(self, finding: RankFinding) -> bool:
        """Poll: ``~ForeignPending(e, r)``, as the poll's reply shows it."""
        return not needs_wait(finding)

    def one_per_rank(self, findings: Sequence[RankFinding]) -> bool:
        return len(findings) == self.view.num_ranks

    def every_rank_found(self) -> bool:
        """Agree: ``\\A r : efind[e][r].found \\notin {"nothing", "wait"}``."""
        return all(f is not None and not needs_wait(f) for f in self.view.findings)

    def _found(self) -> list[RankFinding]:
        return sorted((f for f in self.view.findings if f is not None), key=lambda f: f.rank)

    def unreadable(self) -> bool:
        """A rank could not read its daemon (no spec counterpart: the spec's daemons always answer)."""
        return any(f.kind == "unreadable" for f in self._found())

    def timed_out(self) -> bool:
        """StartupFails: a finding is "timeout"."""
        return any(f.kind == "timeout" for f in self._found())

    def dirty(self) -> bool:
        """StartupFails: a finding is "dirty"."""
        return any(f.kind == "dirty" for f in self._found())

    def recorded_nowhere(self) -> bool:
        """``Recorded(e) = {}``: no daemon keeps a record."""
        return not _ranks_where(self._found(), "record")

    def moved_beside_no_record(self) -> bool:
        """StartupFails: ``Recorded(e) # Found(e) /\\ \\E f \\in Recorded(e) : Moved(f)``."""
        return self.lacks_record() and bool(self._moved())

    def _moved(self) -> list[RankFinding]:
        assert self.layout is not None
        initial = self.layout.initial_digest
        return [f for f in _ranks_where(self._found(), "record") if f.version != 0 or f.digest != initial]

    def lacks_record(self) -> bool:
        """``~Adopts(e)``: some daemon keeps no record."""
        return bool(_ranks_where(self._found(), "no_record"))

    def records_differ(self) -> bool:
        """StartupFails: ``\\E f, g \\in Recorded(e) : f.fver # g.fver \\/ f.fmap # g.fmap``. Version and
        digest both: equal maps at different versions mean a daemon was restarted under the others,
        and its next begin would be refused as stale."""
        return len({(f.version, f.digest) for f in _ranks_where(self._found(), "record")}) > 1

    def _agreed(self) -> LayoutRecord | RecordStamp:
        """The first record found; a record with its map before a stamp (all agree, or startup fails)."""
        records = [f.record for f in _ranks_where(self._found(), "record") if f.record is not None]
        return next((r for r in records if isinstance(r, LayoutRecord)), records[0])

    def shape_differs(self) -> bool:
        """The daemons' map is not of the engine's shape (no spec counterpart: one shape there)."""
        assert self.layout is not None
        first, engine = self._agreed(), self.layout
        return first.shape != (engine.num_layers, engine.num_physical) or first.num_logical != engine.num_logical

    def record_is_initial(self) -> bool:
        """The agreed record is the engine's own initial layout: nothing to adopt."""
        assert self.layout is not None
        return self._agreed().digest == self.layout.initial_digest

    def routes_statically(self) -> bool:
        """The engine routes by the static layout, so it cannot follow a moved map."""
        assert self.layout is not None
        return not self.layout.routes_by_metadata

    def fetch_refused(self, reply: object) -> bool:
        """Fetch: ``~FetchServes(e, r)``, as the daemon's ``layout_refused`` reply says."""
        return isinstance(reply, Mapping) and reply.get("status") == Status.LAYOUT_REFUSED.value

    def fetch_served(self, reply: object) -> bool:
        return isinstance(reply, Mapping) and reply.get("status") == Status.OK.value

    def last_to_serve(self, rank: int) -> bool:
        """Fetch: ``eserv'[e] = Ranks``."""
        return len(self.view.served | {rank}) == self.view.num_ranks

    def every_rank_loaded(self, loaded: Sequence[bool]) -> bool:
        """Fetch, for the ranks together: ``eserv'[e] = Ranks`` once the gathered load results are taken."""
        return len(self.view.served | _ranks_true(loaded)) == self.view.num_ranks

    # -- startup actions -----------------------------------------------------------------

    def take_finding(self, rank: int, finding: RankFinding, token: str | None) -> Step:
        v = self.view
        self._set(tokens=_put(v.tokens, rank, token), findings=_put(v.findings, rank, finding))
        return self._next(finding)

    def take_poll(self, rank: int, finding: RankFinding) -> Step:
        self._set(findings=_put(self.view.findings, rank, finding))
        return self._next(finding)

    def still_waiting(self, finding: RankFinding) -> Step:
        """The spec's Poll is not enabled yet: the rank keeps the finding it had."""
        return self._next(finding)

    @staticmethod
    def _next(finding: RankFinding) -> Step:
        if needs_wait(finding):
            return Step.pause(Reason.MOVE_PENDING, f"rank {finding.rank} waits: {finding.detail}")
        return Step.move(Reason.ATTACHED, f"rank {finding.rank} found {finding.kind}")

    def time_out(self, rank: int, waited_s: float) -> Step:
        finding = self.view.findings[rank]
        assert finding is not None
        timed = finding.timed_out(waited_s)
        self._set(findings=_put(self.view.findings, rank, timed))
        return Step.move(Reason.WAIT_TIMEOUT, f"rank {rank}: {timed.detail}", Severity.WARNING)

    def take_findings(self, findings: Sequence[RankFinding]) -> None:
        """What was gathered wins: a rank whose own steps broke off (an error mid-wait) gathered
        an ``unreadable`` finding, and every rank must decide on the same list. A finding the
        rank made itself stays where it is the same as gathered: it carries its record's map."""
        mine = self.view.findings
        self._set(
            findings=tuple(
                own if own is not None and own.same_as(gathered) else gathered
                for own, gathered in zip(mine, findings, strict=True)
            )
        )

    def _fail(self, reason: Reason, message: str) -> Step:
        text = f"expert-layout startup check failed: {message}"
        self._set(outcome=StartupOutcome("fail", reason, text), shares=False)
        return Step.stop(reason, text, Severity.ERROR)

    def _fail_where(self, kind: str, reason: Reason, what: str, advice: str = "") -> Step:
        bad = _ranks_where(self._found(), kind)
        return self._fail(reason, f"{len(bad)} rank(s) {what} ({_listing(bad)}){advice}")

    def fail_unreadable(self) -> Step:
        return self._fail_where("unreadable", Reason.UNREADABLE, "could not read its daemon's layout")

    def fail_timed_out(self) -> Step:
        return self._fail_where("timeout", Reason.WAIT_TIMEOUT, "timed out waiting for another engine's move")

    def fail_dirty(self) -> Step:
        return self._fail_where("dirty", Reason.DIRTY, "found its daemon dirty", f"; {REPAIR_OR_RESTART}")

    def fail_moved_beside_no_record(self) -> Step:
        moved = self._moved()
        text = _MIXED_AFTER_MOVE.format(
            without=self._ranks_without_record(), moved=[f.rank for f in moved], versions=[f.version for f in moved]
        )
        return self._fail(Reason.MIXED_AFTER_MOVE, text)

    def fail_records_differ(self) -> Step:
        listing = ", ".join(f"rank {f.rank}: version {f.version}" for f in _ranks_where(self._found(), "record"))
        return self._fail(Reason.DISAGREE, f"the daemons hold different layouts ({listing}); {RESTART_DAEMONS}")

    def fail_shape(self) -> Step:
        assert self.layout is not None
        return self._fail(Reason.SHAPE_MISMATCH, _SHAPE_MISMATCH.format(daemons=self._agreed(), engine=self.layout))

    def fail_routes_statically(self) -> Step:
        return self._fail(
            Reason.NOT_ROUTING_BY_METADATA,
            f"the daemons' experts were moved (version {self._agreed().version}) but this engine routes by the "
            f"static layout; start it with --enable-eplb (or --init-expert-location)",
        )

    def _route(self, outcome: StartupOutcome) -> Step:
        assert self.layout is not None
        record = outcome.record
        # A stamp (a record that came without its map) is the engine's own initial layout: the
        # daemon leaves the map out only for the digest the engine said it holds.
        assert isinstance(record, LayoutRecord) or outcome.kind != "adopt", "a rank adopts a map it found itself"
        self._set(
            outcome=outcome,
            shares=outcome.shared_rebalance,
            rows=record.rows if isinstance(record, LayoutRecord) else None,
            version=0 if record is None else record.version,
            digest=self.layout.initial_digest if record is None else record.digest,
        )
        if outcome.warning:
            return Step.move(outcome.reason, f"{outcome.message}; WARNING: {outcome.warning}", Severity.WARNING)
        return Step.move(outcome.reason, outcome.message)

    def _ranks_without_record(self) -> list[int]:
        return [f.rank for f in _ranks_where(self._found(), "no_record")]

    def _keep_without_record(self, reason: Reason, found: str) -> Step:
        assert self.layout is not None
        warning = unwritten_slots_warning(_ranks_where(self._found(), "no_record"), self.layout)
        message = f"{found}; starting with the engine's own initial layout; rebalancing of shared weights stays off"
        return self._route(StartupOutcome("keep_own", reason, message, warning=warning))

    def keep_own_no_record(self) -> Step:
        return self._keep_without_record(Reason.NO_RECORD, "no daemon keeps an expert-layout record")

    def keep_own_mixed(self) -> Step:
        without = self._ranks_without_record()
        found = f"ranks {without} have daemons without a record and the others are at the initial layout"
        return self._keep_without_record(Reason.MIXED_INITIAL, found)

    def keep_own_initial(self) -> Step:
        first = self._agreed()
        message = f"daemons at version {first.version} hold the engine's initial layout"
        return self._route(StartupOutcome("keep_own", Reason.INITIAL_LAYOUT, message, first, shared_rebalance=True))

    def adopt(self) -> Step:
        first = self._agreed()
        message = f"adopting the daemons' layout version {first.version}"
        return self._route(StartupOutcome("adopt", Reason.ADOPT, message, first, shared_rebalance=True))

    def refuse_fetch(self, reply: Mapping[str, Any]) -> Step:
        self._set(shares=False)
        return Step.stop(_reason_of(reply), f"fetch_state refused {fetch_refusal(reply)}", Severity.ERROR)

    def serve(self, rank: int) -> Step:
        self._set(served=self.view.served | {rank})
        return Step.move(Reason.SERVED_FOLLOWING, f"rank {rank} loaded from its daemon")

    def take_loads(self, loaded: Sequence[bool]) -> Step:
        """The ranks' gathered load results: each rank's own ``fetch`` took its daemon's reply, and the
        other ranks learn it from the all-gather (a rank served by its daemon counts as served here)."""
        served = self.view.served | _ranks_true(loaded)
        self._set(served=served)
        missing = sorted(set(range(self.view.num_ranks)) - served)
        if missing:
            return Step.pause(Reason.SERVED_FOLLOWING, f"ranks {missing} have not loaded from their daemons")
        return Step.move(Reason.SERVED_FOLLOWING, "every rank loaded from its daemon")

    def pass_fetch(self, reply: object) -> Step:
        """Not the layout's to judge (an error sglang's loader handles, or a fetch outside loading)."""
        return Step.move(_reason_of(reply), "fetch_state answered without a layout refusal")

    # -- rebalance guards: how the engine rebalances, then the spec's BeginChunk ... Verify ---

    def source_unknown(self, sources: Sequence[str | None]) -> bool:
        """Some rank cannot say where its weights came from: they may be the daemons' shared ones."""
        return any(s not in ("daemon", "disk") for s in sources)

    def from_disk_everywhere(self, sources: Sequence[str | None]) -> bool:
        return all(s == "disk" for s in sources)

    def from_disk_somewhere(self, sources: Sequence[str | None]) -> bool:
        return any(s == "disk" for s in sources)

    def elastic(self, elastic_ep: bool) -> bool:
        return elastic_ep

    def never_attached(self) -> bool:
        return self.view.outcome is None

    def startup_shares(self) -> bool:
        """Agree: ``eshare' = Adopts(e)``."""
        outcome = self.view.outcome
        return outcome is not None and outcome.shared_rebalance

    def hooks_missing(self, missing: str | None) -> bool:
        """sglang did not apply every hook of the plugin (``engine_adapter.install_check``): some moves of
        shared experts would go without a begin and a commit (no spec counterpart: the spec's engines
        run every step)."""
        return missing is not None

    def no_begin_yet(self, rank: int) -> bool:
        """Begin: ``reb[e].replies[r] = "none"``."""
        return self.view.begins[rank] is None

    def every_rank_began(self) -> bool:
        """Decide: ``\\A r : reb[e].replies[r] # "none"``."""
        return all(a is not None for a in self.view.begins)

    def all_ok(self) -> bool:
        """Decide: ``replies = {"ok"}``."""
        return all(a is not None and a.ok for a in self.view.begins)

    def any_ok(self) -> bool:
        """Decide: ``"ok" \\in replies``: some daemon holds a move of this chunk to abort."""
        return any(a is not None and a.ok for a in self.view.begins)

    def any_refused(self) -> bool:
        """Decide: ``eshare' = "refused" \\notin replies`` (no readable reply counts as refused)."""
        return any(a is not None and a.refused for a in self.view.begins)

    def began_here(self, rank: int) -> bool:
        """Abort: ``reb[e].replies[r] = "ok"`` (and not aborted yet)."""
        answer = self.view.begins[rank]
        return answer is not None and answer.ok and rank not in self.view.aborted

    def last_to_abort(self, rank: int) -> bool:
        """Abort: ``\\A q \\in Ranks \\ {r} : reb[e].replies[q] # "ok"``."""
        return not any(self.began_here(q) for q in range(self.view.num_ranks) if q != rank)

    def still_shares(self) -> bool:
        """``eshare[e]``: the chunk paused (busy), it was not refused."""
        return self.view.shares

    def to_commit(self, rank: int) -> bool:
        """Commit: ``reb[e].replies[r] = "ok"`` (begun, not committed yet)."""
        v = self.view
        answer = v.begins[rank]
        return answer is not None and answer.ok and v.commits[rank] is None

    def every_rank_committed(self) -> bool:
        """Verify: ``\\A r : reb[e].replies[r] \\in {"committed", "commit_refused"}``."""
        return all(a is not None for a in self.view.commits)

    def good(self) -> bool:
        """Verify: every daemon committed, at ``ever[e] + 1``, the engine's own map (its digest)."""
        v = self.view
        want = v.version + 1
        return all(a is not None and a.ok and a.version == want and a.digest == v.moved_digest for a in v.commits)

    # -- rebalance actions ---------------------------------------------------------------

    def _mode(self, step: Step, shares: bool) -> Step:
        self._set(mode=step, shares=shares, off=step if step.go is Go.STOP else None)
        return step

    def off_unknown_source(self, sources: Sequence[str | None]) -> Step:
        ranks = [rank for rank, s in enumerate(sources) if s not in ("daemon", "disk")]
        return self._mode(
            Step.stop(
                Reason.UNKNOWN_SOURCE,
                f"ranks {ranks} cannot tell whether their weights came from disk or from the weight cache "
                "daemons (shared with other engines); rebalancing stays off, so that no shared weights move",
            ),
            False,
        )

    def go_local(self) -> Step:
        return self._mode(Step.move(Reason.LOCAL, "weights from disk on every rank: rebalancing as sglang does"), False)

    def off_mixed_sources(self) -> Step:
        return self._mode(
            Step.stop(
                Reason.MIXED_SOURCES,
                "some ranks loaded weights from disk and others from the weight cache daemons; rebalancing of "
                "shared weights stays off",
            ),
            False,
        )

    def off_elastic(self) -> Step:
        return self._mode(
            Step.stop(Reason.ELASTIC_EP, "elastic EP is on; rebalancing of shared weights stays off"), False
        )

    def off_not_attached(self) -> Step:
        return self._mode(
            Step.stop(
                Reason.NOT_ATTACHED,
                "the engine did not attach to its daemons; rebalancing of shared weights stays off",
            ),
            False,
        )

    def off_by_startup(self) -> Step:
        outcome = self.view.outcome
        assert outcome is not None
        return self._mode(
            Step.stop(outcome.reason, f"rebalancing of shared weights stays off: {outcome.message}"), False
        )

    def go_shared(self) -> Step:
        return self._mode(Step.move(Reason.SHARED, "rebalancing through the daemons' chunk protocol"), True)

    def off_hooks_missing(self, missing: str) -> Step:
        return self._mode(
            Step.stop(
                Reason.PLUGIN_INCOMPLETE,
                f"{missing}; rebalancing stays off, so that no shared experts move without the protocol",
                Severity.ERROR,
            ),
            False,
        )

    def repeat_off(self) -> Step:
        """A rebalance of an engine whose rebalancing is off: the step that turned it off, again."""
        assert self.view.off is not None
        return self.view.off

    def repeat_mode(self) -> Step:
        """A rebalance begins: how the engine rebalances, known since ``start``."""
        assert self.view.mode is not None
        return self.view.mode

    def wait_for_promotion(self) -> Step:
        return Step.pause(Reason.PARKED, "a warm standby moves no experts until it is promoted")

    def take_chunk(self, layers: Sequence[int]) -> None:
        nothing = (None,) * self.view.num_ranks
        self._set(chunk=tuple(layers), begins=nothing, aborted=frozenset(), commits=nothing)

    def take_begin(self, rank: int, answer: RankAnswer) -> None:
        self._set(begins=_put(self.view.begins, rank, answer))

    def _answers(self, answers: Sequence[RankAnswer | None], keep: Callable[[RankAnswer], bool]) -> str:
        return "; ".join(f"rank {rank}: {a.text}" for rank, a in enumerate(answers) if a is not None and keep(a))

    def proceed(self) -> Step:
        return Step.move(Reason.BEGUN, "every daemon accepted the move")

    def _refused(self) -> Step:
        detail = self._answers(self.view.begins, lambda a: a.refused)
        step = Step.stop(
            Reason.BEGIN_REFUSED,
            f"a daemon refused the move for good ({detail}); rebalancing of shared weights is off",
        )
        self._set(shares=False, off=step)
        return step

    def stop_after_aborts(self) -> Step:
        return self._refused()

    def stop(self) -> Step:
        return self._ending_chunk(self._refused())

    def _busy(self) -> Step:
        detail = self._answers(self.view.begins, lambda a: a.status is Status.BUSY)
        return Step.pause(Reason.BEGIN_BUSY, f"rebalance paused, the next interval retries ({detail})")

    def pause_after_aborts(self) -> Step:
        return self._busy()

    def pause(self) -> Step:
        return self._ending_chunk(self._busy())

    def _ending_chunk(self, step: Step) -> Step:
        """``step``, once the chunk has ended (no rank's begin to abort)."""
        self._end_chunk()
        return step

    def take_abort(self, rank: int) -> None:
        self._set(aborted=self.view.aborted | {rank})

    def end_aborts(self) -> None:
        self._end_chunk()

    def take_moved(self, rows: Sequence[Sequence[int]]) -> None:
        moved_rows, digest = self.digests.absorb(rows)
        self._set(moved_rows=moved_rows, moved_digest=digest)

    def take_commit(self, rank: int, answer: RankAnswer) -> None:
        self._set(commits=_put(self.view.commits, rank, answer))

    def _route_moved(self, version: int, off: Step | None) -> None:
        v = self.view
        self._set(rows=v.moved_rows, version=version, digest=v.moved_digest, off=off, shares=off is None)
        self._end_chunk()

    def keep_verified(self) -> Step:
        version = self.view.version + 1
        self._route_moved(version, None)
        return Step.move(Reason.COMMITTED, f"every daemon recorded version {version}")

    def refuse_unverified(self) -> Step:
        v = self.view
        problems = []
        for rank, answer in enumerate(v.commits):
            assert answer is not None
            if not answer.ok:
                problems.append(f"rank {rank}: commit not recorded ({answer.text})")
            elif answer.digest != v.moved_digest:
                problems.append(f"rank {rank}: daemon's digest differs from the engine's map")
        versions = sorted({a.version for a in v.commits if a is not None and a.ok}, key=str)
        if not problems and len(versions) != 1:
            problems.append(f"daemons report different versions {versions}")
        elif not problems:
            problems.append(f"daemons report version {versions[0]}, expected {v.version + 1}")
        step = Step.stop(
            Reason.COMMIT_UNVERIFIED,
            "expert move committed inconsistently: "
            + "; ".join(problems)
            + f". The engine keeps serving but rebalances no more; {RESTART_DAEMONS} before starting another "
            "engine on them.",
            Severity.ERROR,
        )
        self._route_moved(v.version, step)  # the engine routes with the moved map either way
        return step

    def _end_chunk(self) -> None:
        nothing = (None,) * self.view.num_ranks
        self._set(
            chunk=(),
            begins=nothing,
            aborted=frozenset(),
            moved_rows=None,
            moved_digest=None,
            commits=nothing,
        )

    # -- a warm standby: the spec's Park, Notify, Claim, Promote ----------------------------------

    def acts_as_primary(self) -> bool:
        """BeginChunk: ``Primary(e)``, an engine started as a primary or a promoted standby."""
        return self.view.role in ("primary", "promoted")

    def warmed_up(self) -> bool:
        """Park from the warmup: the engine serves (``ephase[e] = "run"``: it loaded on every rank)."""
        return self.view.phase == "run"

    def to_park(self, rank: int) -> bool:
        """Park: ``eclaim[e][r] \\in {"none", "release"}``, and the ranks before it parked (rank order)."""
        claims = self.view.claims
        return claims[rank] in ("none", "release") and all(c not in ("none", "release") for c in claims[:rank])

    def parked_here(self, rank: int) -> bool:
        """Notify: the notice reaches a rank whose role there is ``"parked"`` (else it changes nothing)."""
        return self.view.claims[rank] == "parked"

    def all_notified(self) -> bool:
        """Claim: ``\\A q \\in Ranks : eclaim[e][q] \\in {"notified", "granted"}``, before any rank claimed:
        every rank has its notice, so the ranks claim in rank order."""
        return all(c == "notified" for c in self.view.claims)

    def is_parked(self) -> bool:
        """``ephase[e] = "parked"``: a standby that runs no forward pass (parked, or claiming)."""
        return self.view.role == "parked"

    def is_promoted(self) -> bool:
        """``Primary(e)`` for a standby: its claim was granted on every rank and it took over."""
        return self.view.role == "promoted"

    def next_to_park(self) -> int | None:
        """The rank that parks next (Park: the engine serves, rank order), or None when none has a park to send."""
        if not self.warmed_up():
            return None
        return next((rank for rank in range(self.view.num_ranks) if self.to_park(rank)), None)

    def next_to_claim(self) -> int | None:
        """The rank that claims next (Claim), or None when the round of claims has ended (every rank
        granted, or a claim taken or refused: the ranks after it do not claim)."""
        return next((rank for rank in range(self.view.num_ranks) if self.may_claim(rank)), None)

    def may_claim(self, rank: int) -> bool:
        """Claim: every rank has its notice (the all-gather), and the ranks before it were granted."""
        claims = self.view.claims
        return (
            all(c in ("notified", "granted") for c in claims)
            and claims[rank] == "notified"
            and all(c == "granted" for c in claims[:rank])
        )

    def all_granted(self) -> bool:
        """``Granted(e)``: the claim was granted on every rank's daemon."""
        return all(c == "granted" for c in self.view.claims)

    def claims_ended(self) -> bool:
        """``ClaimsEnded(e)``: every rank granted, or a claim taken or refused (the ranks claim in order)."""
        return self.all_granted() or any(c in ("taken", "dirty") for c in self.view.claims)

    def claim_refused(self) -> bool:
        """``PromotionFails``: a daemon refused the claim (dirty, repairing, no record)."""
        return "dirty" in self.view.claims

    def take_standby_role(self) -> Step:
        """The engine starts as a warm standby (``SGLANG_EXPERT_LAYOUT_ROLE=standby``): parked nowhere yet."""
        self._set(claims=("none",) * self.view.num_ranks)
        return Step.move(Reason.PARKED, "a warm standby: it starts as any engine, then parks after its warmup")

    def take_park(self, rank: int, notified: bool) -> Step:
        self._set(claims=_put(self.view.claims, rank, "notified" if notified else "parked"))
        if notified:
            return Step.move(Reason.PARKED, f"rank {rank} parked; no unparked engine is attached: claim")
        return Step.pause(Reason.PARKED, f"rank {rank} parked; a primary is attached")

    def take_notice(self, rank: int) -> Step:
        self._set(claims=_put(self.view.claims, rank, "notified"))
        return Step.move(Reason.PARKED, f"rank {rank}: no unparked engine is attached any more: claim")

    def claim_now(self) -> Step:
        return Step.move(Reason.PARKED, "every daemon told this standby its primary is gone: claim in rank order")

    def wait_for_notices(self) -> Step:
        return Step.pause(
            Reason.PARKED, "not every daemon has told this standby its primary is gone (a primary is still attached)"
        )

    def ignore_notice(self, rank: int) -> Step:
        return Step.pause(Reason.PARKED, f"rank {rank}: a notice that changes nothing (not parked there, or told)")

    def take_claim(self, rank: int, reply: object) -> Step:
        """A claim's reply: granted (the record, kept as the rank's finding), taken (busy) or refused."""
        parsed = Reply.from_wire(reply) if isinstance(reply, Mapping) and "status" in reply else None
        if parsed is not None and parsed.ok:
            try:
                record = LayoutRecord.from_wire(parsed.data.get("record"))
            except (ValueError, TypeError) as error:
                self._set(claims=_put(self.view.claims, rank, "dirty"))
                return Step.stop(Reason.UNREADABLE, f"rank {rank}: the granted record is invalid: {error}")
            finding = RankFinding(rank, "record", record)
            self._set(claims=_put(self.view.claims, rank, "granted"), findings=_put(self.view.findings, rank, finding))
            return Step.move(Reason.PROMOTED, f"rank {rank}: primary at version {record.version}")
        if parsed is not None and parsed.status is Status.BUSY:
            self._set(claims=_put(self.view.claims, rank, "taken"))
            return Step.pause(parsed.reason, f"rank {rank}: {parsed.message}")
        self._set(claims=_put(self.view.claims, rank, "dirty"))
        why = str(parsed) if parsed is not None else f"no usable reply ({reply!r})"
        return Step.stop(_reason_of(reply), f"rank {rank}: claim refused: {why}", Severity.ERROR)

    def fail_promotion(self) -> Step:
        refused = [r for r, c in enumerate(self.view.claims) if c == "dirty"]
        if refused:
            return self._fail(Reason.DIRTY, f"the standby cannot take over: the daemons of ranks {refused} refused "
                              f"the claim (see each rank's claim reply); {REPAIR_OR_RESTART}")  # fmt: skip
        return self.fail_records_differ()

    def take_promotion(self) -> Step:
        first = self._agreed()
        message = f"promoted: the primary now, adopting the daemons' layout version {first.version}"
        step = self._route(StartupOutcome("adopt", Reason.ADOPT, message, first, shared_rebalance=True))
        return Step.move(Reason.PROMOTED, step.message)

    def release_claims(self) -> Step:
        claims = tuple("release" if c in ("granted", "taken") else c for c in self.view.claims)
        self._set(claims=claims)
        return Step.pause(Reason.PRIMARY_ATTACHED, "a claim was taken: park again on every rank that claimed")


# -- the machines: declarations only (states, transitions, the names of guards and actions) -----


class StartupMachine(StateMachine):
    """The engine's startup (docs/protocol.md §5); its states are the spec's ``ephase``.

    Per-rank steps (attach, poll, timeout) keep the phase; agreement takes the first transition
    whose guards hold, in the order written: that order is the precedence of the failures. Each
    rank's ``fetch`` is its own daemon's reply; ``loads`` takes the ranks' gathered load results.
    """

    start = State(initial=True)
    load = State()
    run = State()
    failed = State(final=True)

    attach = start.to.itself(internal=True, cond="not_found", on="take_finding")
    poll = start.to.itself(internal=True, cond="waits and move_ended", on="take_poll") | start.to.itself(
        internal=True, cond="waits", on="still_waiting"
    )
    timeout = start.to.itself(internal=True, cond="waits", on="time_out")
    gather = start.to.itself(internal=True, cond="one_per_rank", on="take_findings")
    agree = (
        start.to(failed, cond="every_rank_found and unreadable", on="fail_unreadable")
        | start.to(failed, cond="every_rank_found and timed_out", on="fail_timed_out")
        | start.to(failed, cond="every_rank_found and dirty", on="fail_dirty")
        | start.to(load, cond="every_rank_found and recorded_nowhere", on="keep_own_no_record")
        | start.to(failed, cond="every_rank_found and moved_beside_no_record", on="fail_moved_beside_no_record")
        | start.to(load, cond="every_rank_found and lacks_record", on="keep_own_mixed")
        | start.to(failed, cond="every_rank_found and records_differ", on="fail_records_differ")
        | start.to(failed, cond="every_rank_found and shape_differs", on="fail_shape")
        | start.to(load, cond="every_rank_found and record_is_initial", on="keep_own_initial")
        | start.to(failed, cond="every_rank_found and routes_statically", on="fail_routes_statically")
        | start.to(load, cond="every_rank_found", on="adopt")
    )
    fetch = (
        load.to(failed, cond="fetch_refused", on="refuse_fetch")
        | load.to(run, cond="fetch_served and last_to_serve", on="serve")
        | load.to.itself(internal=True, cond="fetch_served", on="serve")
        | load.to.itself(internal=True, on="pass_fetch")
        | start.to(failed, cond="fetch_refused", on="refuse_fetch")
        | start.to.itself(internal=True, on="pass_fetch")
        | run.to(failed, cond="fetch_refused", on="refuse_fetch")
        | run.to.itself(internal=True, on="pass_fetch")
    )
    loads = (
        load.to(run, cond="every_rank_loaded", on="take_loads")
        | load.to.itself(internal=True, on="take_loads")
        | run.to.itself(internal=True, on="take_loads")
    )


class RebalanceMachine(StateMachine):
    """The engine's rebalancing (docs/protocol.md §6), one chunk at a time; ``off`` is for good.

    ``start`` picks how the engine rebalances, in the order written (an unknown weight source
    first: it fails safe); ``install_checked`` turns it off when sglang did not apply every hook of
    the plugin. Each rebalance of sglang's EPLB is a ``rebalance_round``: the off step again, the
    mode, or a pause while a warm standby is not the primary (BeginChunk's ``Primary(e)``). Then the
    spec's BeginChunk (``chunk``), Begin, Decide, Abort, the end of sglang's move (``move``), Commit
    and Verify.
    """

    starting = State(initial=True)
    # ``local`` and ``off`` are for good, yet not final: a final state takes no event, and each rebalance
    # of sglang's EPLB is one (``rebalance_round``), a self-loop there.
    local = State()  # weights from disk: sglang's own rebalance, no protocol, for good
    idle = State()  # shared weights, between chunks
    beginning = State()
    aborting = State()  # the chunk does not go on: the ranks whose begin was ok abort it
    moving = State()
    committing = State()
    off = State()

    start = (
        starting.to(off, cond="source_unknown", on="off_unknown_source")
        | starting.to(local, cond="from_disk_everywhere", on="go_local")
        | starting.to(off, cond="from_disk_somewhere", on="off_mixed_sources")
        | starting.to(off, cond="elastic", on="off_elastic")
        | starting.to(off, cond="never_attached", on="off_not_attached")
        | starting.to(off, unless="startup_shares", on="off_by_startup")
        | starting.to(idle, on="go_shared")
    )
    install_checked = (
        starting.to(off, cond="hooks_missing", on="off_hooks_missing")
        | idle.to(off, cond="hooks_missing", on="off_hooks_missing")
        | local.to(off, cond="hooks_missing", on="off_hooks_missing")
        | starting.to.itself(internal=True)
        | idle.to.itself(internal=True)
        | local.to.itself(internal=True)
        | off.to.itself(internal=True)
    )
    rebalance_round = (
        off.to.itself(internal=True, on="repeat_off")
        | local.to.itself(internal=True, cond="acts_as_primary", on="repeat_mode")
        | idle.to.itself(internal=True, cond="acts_as_primary", on="repeat_mode")
        | local.to.itself(internal=True, on="wait_for_promotion")
        | idle.to.itself(internal=True, on="wait_for_promotion")
    )
    chunk = idle.to(beginning, cond="acts_as_primary", on="take_chunk")
    begin = beginning.to.itself(internal=True, cond="no_begin_yet", on="take_begin")
    decide = (
        beginning.to(moving, cond="every_rank_began and all_ok", on="proceed")
        | beginning.to(aborting, cond="every_rank_began and any_refused and any_ok", on="stop_after_aborts")
        | beginning.to(off, cond="every_rank_began and any_refused", on="stop")
        | beginning.to(aborting, cond="every_rank_began and any_ok", on="pause_after_aborts")
        | beginning.to(idle, cond="every_rank_began", on="pause")
    )
    abort = (
        aborting.to.itself(internal=True, cond="began_here and not last_to_abort", on="take_abort")
        | aborting.to(idle, cond="began_here and still_shares", on="end_aborts")
        | aborting.to(off, cond="began_here", on="end_aborts")
    )
    move = moving.to(committing, on="take_moved")
    commit = committing.to.itself(internal=True, cond="to_commit", on="take_commit")
    verify = committing.to(idle, cond="every_rank_committed and good", on="keep_verified") | committing.to(
        off, cond="every_rank_committed", on="refuse_unverified"
    )


class StandbyMachine(StateMachine):
    """A warm standby's role (spec: Park, Notify, Claim, Promote); ``primary`` for an engine
    started as one, which takes none of these events but ``standby``, the role given at its start.

    After its warmup the standby parks rank by rank (``park``: the reply may be the notice); a
    daemon's ``notice`` on a parked rank; ``notices``, on the gathered notices, says whether every
    rank has one; then the ranks ``claim`` in rank order; ``promote`` on the gathered claims: fail
    (a refusal, or records that differ), promoted (every rank granted: route with the records' map),
    or park again (a claim taken).
    """

    primary = State(initial=True)
    warming = State()
    parked = State()
    promoted = State()
    failed = State()  # the process exits; not final: a final state takes no event, and promoted has no path there

    standby = primary.to(warming, on="take_standby_role")
    park = warming.to(parked, cond="warmed_up and to_park", on="take_park") | parked.to.itself(
        internal=True, cond="to_park", on="take_park"
    )
    notice = (
        parked.to.itself(internal=True, cond="parked_here", on="take_notice")
        | parked.to.itself(internal=True, on="ignore_notice")
        | warming.to.itself(internal=True, on="ignore_notice")
        | promoted.to.itself(internal=True, on="ignore_notice")
        | failed.to.itself(internal=True, on="ignore_notice")
    )
    notices = parked.to.itself(internal=True, cond="all_notified", on="claim_now") | parked.to.itself(
        internal=True, on="wait_for_notices"
    )
    claim = parked.to.itself(internal=True, cond="may_claim", on="take_claim")
    promote = (
        parked.to(failed, cond="claims_ended and claim_refused", on="fail_promotion")
        | parked.to(failed, cond="claims_ended and all_granted and records_differ", on="fail_promotion")
        | parked.to(promoted, cond="claims_ended and all_granted", on="take_promotion")
        | parked.to.itself(internal=True, cond="claims_ended", on="release_claims")
    )


__all__ = ["EngineState", "RebalanceMachine", "StandbyMachine", "StartupMachine"]
