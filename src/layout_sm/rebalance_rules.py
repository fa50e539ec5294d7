"""The rebalance machine's guards and actions (docs/protocol.md §6): how the engine rebalances,
then the spec's BeginChunk ... Committed, Verify."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from layout_sm.engine import (
    Go,
    RankAnswer,
    Severity,
    Step,
)
from layout_sm.engine_state import EngineModel, _put
from layout_sm.reasons import RESTART_DAEMONS, Reason, Status


class RebalanceRules(EngineModel):
    """The rebalance machine's guards and actions (docs/protocol.md §6)."""

    __slots__ = ()

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
        """Decide: ``"refused" \\in replies`` (no readable reply counts as refused)."""
        return any(a is not None and a.refused for a in self.view.begins)

    def owed_checks(self) -> bool:
        """Decide and Verify: ``reb[e].owed # "bad"``: nothing owed, or every daemon recorded the
        engine's claim for the last chunk: the version it routes with and the digest of its whole map."""
        v = self.view
        return all(a is not None and a.ok and a.version == v.version and a.digest == v.digest for a in v.owed)

    def stops_for_good(self) -> bool:
        """Decide: ``eshare' = "refused" \\notin replies /\\ checked``: a refusal, or a failed check."""
        return self.any_refused() or not self.owed_checks()

    def check_owed(self) -> bool:
        """Verify: ``reb[e].owed # "none"``."""
        return bool(self.view.owed)

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

    def commit_answered(self) -> bool:
        """Committed: ``\\A r : reb[e].replies[r] \\in {"committed", "commit_refused"}``. A rank's process
        knows its own answer (the others' come with the next all-gather); the mirror's one session,
        every rank's (it takes Committed only then, as the spec does)."""
        return any(a is not None for a in self.view.commits)

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
        return self._mode(
            Step.proceed(Reason.LOCAL, "weights from disk on every rank: rebalancing as sglang does"), False
        )

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
        return self._mode(Step.proceed(Reason.SHARED, "rebalancing through the daemons' chunk protocol"), True)

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

    def take_begin(self, rank: int, answer: RankAnswer, owed: RankAnswer | None) -> None:
        """Rank ``rank``'s begin reply, and its answer to the last chunk's commit when a check is owed:
        the two travel in the same all-gather."""
        if self.view.owed:
            self._set(begins=_put(self.view.begins, rank, answer), owed=_put(self.view.owed, rank, owed))
        else:
            self._set(begins=_put(self.view.begins, rank, answer))

    def _answers(self, answers: Sequence[RankAnswer | None], keep: Callable[[RankAnswer], bool]) -> str:
        return "; ".join(f"rank {rank}: {a.text}" for rank, a in enumerate(answers) if a is not None and keep(a))

    def take_owed(self, answers: Sequence[RankAnswer | None]) -> None:
        """Every rank's answer to the last chunk's commit, all-gathered at the end of the rebalance;
        nothing is taken while no check is owed."""
        if self.view.owed:
            self._set(owed=tuple(RankAnswer.of(a) for a in answers))

    def proceed(self) -> Step:
        self._set(owed=())
        return Step.proceed(Reason.BEGUN, "every daemon accepted the move")

    def _refused(self) -> Step:
        if self.owed_checks():
            detail = self._answers(self.view.begins, lambda a: a.refused)
            then = ""
            if any(a is not None and a.status is None for a in self.view.begins):
                # A begin without a reply may have been taken: it is not aborted (an abort names no begin).
                then = (
                    ". A daemon whose begin went unanswered may hold the move pending while this engine lives (no "
                    "layer of it moved); once it stops, that daemon is repaired (by itself with auto repair, else "
                    "by `expert-layout repair`) and the next engine starts on it: do not restart the daemons."
                )
            step = Step.stop(
                Reason.BEGIN_REFUSED,
                f"a daemon refused the move for good ({detail}); rebalancing of shared weights is off{then}",
            )
        else:
            step = self._unverified()
        self._set(shares=False, off=step, owed=())
        return step

    def stop_after_aborts(self) -> Step:
        return self._refused()

    def stop(self) -> Step:
        return self._ending_chunk(self._refused())

    def _busy(self) -> Step:
        detail = self._answers(self.view.begins, lambda a: a.status is Status.BUSY)
        self._set(owed=())
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

    def owe_check(self) -> Step:
        """Committed: route with the moved map and claim the next version, the commit answers kept
        as the check owed to the next all-gather. Either way the engine routes with the moved map:
        sglang moved its experts."""
        v = self.view
        version = v.version + 1
        self._set(rows=v.moved_rows, version=version, digest=v.moved_digest, owed=v.commits)
        self._end_chunk()
        return Step.proceed(
            Reason.COMMITTED, f"committed at version {version}; the next all-gather checks every daemon"
        )

    def keep_verified(self) -> Step:
        self._set(owed=())
        return Step.proceed(Reason.COMMITTED, f"every daemon recorded version {self.view.version}")

    def refuse_unverified(self) -> Step:
        step = self._unverified()
        self._set(off=step, shares=False, owed=())
        return step

    def _unverified(self) -> Step:
        """Why the owed check failed: the commits that were not recorded, or the daemons whose record
        differs from the engine's claim (its version, the digest of its whole map), and what happens next."""
        v = self.view
        unrecorded, differ = [], []
        for rank, answer in enumerate(v.owed):
            if answer is None or not answer.ok:
                unrecorded.append(f"rank {rank}: commit not recorded ({'no reply' if answer is None else answer.text})")
            elif answer.digest != v.digest:
                differ.append(f"rank {rank}: daemon's digest differs from the engine's map")
        versions = sorted({a.version for a in v.owed if a is not None and a.ok}, key=str)
        if not unrecorded and not differ and len(versions) != 1:
            differ.append(f"daemons report different versions {versions}")
        elif not unrecorded and not differ:
            differ.append(f"daemons report version {versions[0]}, expected {v.version}")
        if differ:
            # A record the engine did not make: the daemons' records cannot be trusted.
            then = f"; {RESTART_DAEMONS} before starting another engine on them."
        else:
            # A refused commit, or a lost reply: the protocol brings the daemons back by itself.
            then = (
                ". A daemon that did not record the commit keeps the move pending while this engine lives; once it "
                "stops, that daemon is repaired at the version before (by itself with auto repair, else by "
                "`expert-layout repair`), and the next engine's startup has it rejoin at the newest version: do not "
                "restart the daemons."
            )
        return Step.stop(
            Reason.COMMIT_UNVERIFIED,
            "expert move committed inconsistently: "
            + "; ".join(unrecorded + differ)
            + ". The engine keeps serving with the experts each daemon's memory holds, and rebalances no more"
            + then,
            Severity.ERROR,
        )

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
