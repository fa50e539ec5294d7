"""A warm standby's guards and actions (docs/protocol.md §10): the spec's Park, Notify, Claim, Promote."""

from __future__ import annotations

from collections.abc import Mapping

from layout_sm.engine import (
    RankFinding,
    Severity,
    StartupOutcome,
    Step,
)
from layout_sm.engine_state import EngineModel, _put, _reason_of
from layout_sm.reasons import REPAIR_OR_RESTART, Reason, Reply, Status
from layout_sm.record import LayoutRecord


class StandbyRules(EngineModel):
    """A warm standby's guards and actions (docs/protocol.md §10)."""

    __slots__ = ()

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
        return self.all_granted() or any(c in ("taken", "refused") for c in self.view.claims)

    def claim_refused(self) -> bool:
        """``PromotionFails``: a daemon refused the claim (dirty, repairing, no record)."""
        return "refused" in self.view.claims

    def take_standby_role(self) -> Step:
        """The engine starts as a warm standby (``SGLANG_EXPERT_LAYOUT_ROLE=standby``): parked nowhere yet."""
        self._set(claims=("none",) * self.view.num_ranks)
        return Step.proceed(Reason.PARKED, "a warm standby: it starts as any engine, then parks after its warmup")

    def take_park(self, rank: int, notified: bool) -> Step:
        self._set(claims=_put(self.view.claims, rank, "notified" if notified else "parked"))
        if notified:
            return Step.proceed(Reason.PARKED, f"rank {rank} parked; no unparked engine is attached: claim")
        return Step.pause(Reason.PARKED, f"rank {rank} parked; a primary is attached")

    def take_notice(self, rank: int) -> Step:
        self._set(claims=_put(self.view.claims, rank, "notified"))
        return Step.proceed(Reason.PARKED, f"rank {rank}: no unparked engine is attached any more: claim")

    def claim_now(self) -> Step:
        return Step.proceed(Reason.PARKED, "every daemon told this standby its primary is gone: claim in rank order")

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
                self._set(claims=_put(self.view.claims, rank, "refused"))
                return Step.stop(Reason.UNREADABLE, f"rank {rank}: the granted record is invalid: {error}")
            finding = RankFinding(rank, "record", record)
            self._set(claims=_put(self.view.claims, rank, "granted"), findings=_put(self.view.findings, rank, finding))
            return Step.proceed(Reason.PROMOTED, f"rank {rank}: primary at version {record.version}")
        if parsed is not None and parsed.status is Status.BUSY:
            self._set(claims=_put(self.view.claims, rank, "taken"))
            return Step.pause(parsed.reason, f"rank {rank}: {parsed.message}")
        self._set(claims=_put(self.view.claims, rank, "refused"))
        why = str(parsed) if parsed is not None else f"no usable reply ({reply!r})"
        return Step.stop(_reason_of(reply), f"rank {rank}: claim refused: {why}", Severity.ERROR)

    def fail_promotion(self) -> Step:
        refused = [r for r, c in enumerate(self.view.claims) if c == "refused"]
        if refused:
            return self._fail(Reason.DIRTY, f"the standby cannot take over: the daemons of ranks {refused} refused "
                              f"the claim (see each rank's claim reply); {REPAIR_OR_RESTART}")  # fmt: skip
        return self.fail_records_differ()

    def take_promotion(self) -> Step:
        first = self._agreed()
        message = f"promoted: the primary now, adopting the daemons' layout version {first.version}"
        step = self._route(StartupOutcome("adopt", Reason.ADOPT, message, first, shared_rebalance=True))
        return Step.proceed(Reason.PROMOTED, step.message)

    def release_claims(self) -> Step:
        claims = tuple("release" if c in ("granted", "taken") else c for c in self.view.claims)
        self._set(claims=claims)
        return Step.pause(Reason.PRIMARY_ATTACHED, "a claim was taken: park again on every rank that claimed")
