"""The startup machine's guards and actions (docs/protocol.md §5): the spec's Attach, Poll, Timeout, Agree, Fetch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from layout_sm.engine import (
    RankFinding,
    RecordStamp,
    Severity,
    StartupOutcome,
    Step,
    fetch_refusal,
    needs_wait,
    unwritten_slots_warning,
)
from layout_sm.engine_state import EngineModel, _listing, _put, _ranks_true, _ranks_where, _reason_of
from layout_sm.reasons import REPAIR_OR_RESTART, RESTART_DAEMONS, Reason, Status
from layout_sm.record import LayoutRecord

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


class StartupRules(EngineModel):
    """The startup machine's guards and actions (docs/protocol.md §5)."""

    __slots__ = ()

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
        """Agree: ``\\A r : efind[e][r].found \\notin {"nothing", "wait", "rejoin"}``."""
        return all(f is not None and not needs_wait(f) and f.kind != "rejoin" for f in self.view.findings)

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

    def rejoin_refused(self) -> bool:
        """StartupFails: a finding is "refused" (a daemon did not rejoin)."""
        return any(f.kind == "rejoin_refused" for f in self._found())

    def _newest(self) -> list[RankFinding]:
        """The records at the newest version found (``NewestVersion(e)``)."""
        recorded = _ranks_where(self._found(), "record")
        newest = max((f.version for f in recorded), default=0)
        return [f for f in recorded if f.version == newest]

    def _behind(self) -> list[RankFinding]:
        """``Behind(e, f)``: the records older than the newest one found."""
        newest = self._newest()
        return [f for f in _ranks_where(self._found(), "record") if newest and f.version < newest[0].version]

    def rejoin_wanted(self) -> bool:
        """``RejoinWanted(e)``: every daemon keeps a record, some are behind the newest version, and
        the daemons at the newest version hold one record (version and digest)."""
        assert self.layout is not None
        found = self._found()
        return (
            self.layout.rejoins
            and len(found) == self.view.num_ranks
            and all(f.kind == "record" for f in found)
            and bool(self._behind())
            and len({(f.version, f.digest) for f in self._newest()}) == 1
        )

    def to_rejoin(self, rank: int) -> bool:
        """AskRejoin: ``efind[e][r].found = "rejoin"``."""
        finding = self.view.findings[rank]
        return finding is not None and finding.kind == "rejoin"

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
        return Step.proceed(Reason.ATTACHED, f"rank {finding.rank} found {finding.kind}")

    def time_out(self, rank: int, waited_s: float) -> Step:
        finding = self.view.findings[rank]
        assert finding is not None
        timed = finding.timed_out(waited_s)
        self._set(findings=_put(self.view.findings, rank, timed))
        return Step.proceed(Reason.WAIT_TIMEOUT, f"rank {rank}: {timed.detail}", Severity.WARNING)

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

    def fail_rejoin_refused(self) -> Step:
        # Each daemon's refusal names the way back (another engine starting: start this one again once it
        # is up; a daemon that moved: restart the set ...): quoted, never a blanket restart of the daemons.
        return self._fail_where("rejoin_refused", Reason.REJOIN_REFUSED, "asked its daemon to rejoin and was refused")

    def mark_rejoin(self) -> Step:
        """The agreement's rejoin branch: the ranks behind are to rejoin at the newest record (its map
        when some rank holds it, else its stamp: ``EngineSession.rejoin_request`` takes the rows)."""
        newest = self._newest()
        target = next((f.record for f in newest if isinstance(f.record, LayoutRecord)), newest[0].record)
        assert target is not None
        behind = {f.rank: f.version for f in self._behind()}
        self._set(
            findings=tuple(
                f.to_rejoin(target, sorted(behind)) if f is not None and f.rank in behind else f
                for f in self.view.findings
            )
        )
        return Step.pause(
            Reason.REJOIN,
            f"ranks {sorted(behind)} found their daemons behind, at versions {sorted(set(behind.values()))} (started "
            f"again from disk, or repaired at the version before a commit they did not record), beside daemons at "
            f"version {target.version}: they rejoin at version {target.version}, then the ranks agree again",
        )

    def take_rejoin_reply(self, rank: int, reply: object) -> Step:
        finding = self.view.findings[rank]
        assert finding is not None
        answered = finding.rejoin_answered(reply)
        self._set(findings=_put(self.view.findings, rank, answered))
        if answered.kind == "rejoin_refused":
            return Step.proceed(Reason.REJOIN_REFUSED, f"rank {rank}: {answered.detail}", Severity.ERROR)
        return self._next(answered)

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
            return Step.proceed(outcome.reason, f"{outcome.message}; WARNING: {outcome.warning}", Severity.WARNING)
        return Step.proceed(outcome.reason, outcome.message)

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
        return Step.proceed(Reason.SERVED_FOLLOWING, f"rank {rank} loaded from its daemon")

    def take_loads(self, loaded: Sequence[bool]) -> Step:
        """The ranks' gathered load results: each rank's own ``fetch`` took its daemon's reply, and the
        other ranks learn it from the all-gather (a rank served by its daemon counts as served here)."""
        served = self.view.served | _ranks_true(loaded)
        self._set(served=served)
        missing = sorted(set(range(self.view.num_ranks)) - served)
        if missing:
            return Step.pause(Reason.SERVED_FOLLOWING, f"ranks {missing} have not loaded from their daemons")
        return Step.proceed(Reason.SERVED_FOLLOWING, "every rank loaded from its daemon")

    def pass_fetch(self, reply: object) -> Step:
        """Not the layout's to judge (an error sglang's loader handles, or a fetch outside loading)."""
        return Step.proceed(_reason_of(reply), "fetch_state answered without a layout refusal")
