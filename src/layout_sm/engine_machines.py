"""The engine's machines (docs/protocol.md §5 and §6): python-statemachine declarations and their model.

- ``StartupMachine`` (the spec's ``ephase``) and ``RebalanceMachine`` (the spec's ``reb[e].step``,
  and whether the engine rebalances at all) declare the spec's engine actions as events: states,
  transitions in the order of precedence, and the names of their guards and actions;
- ``EngineState`` is their model, the one place the session's state is kept (an
  ``layout_sm.engine.EngineView``, ``layout_sm.engine_state``): its methods are the guards (the
  spec's conjuncts, over the view and the event's arguments) and the actions (they replace the view
  and return the step's ``Step``), one module of rules per machine (``layout_sm.startup_rules``,
  ``layout_sm.rebalance_rules``, ``layout_sm.standby_rules``).

``layout_sm.session.EngineSession`` fires the events from the tables of ``layout_sm.declared``.
Every rank all-gathers what it saw, then takes the same transitions on the same list, so every
rank reaches the same outcome without another round of messages: no rank can be left waiting
in a collective that the others skipped.
"""

from __future__ import annotations

from statemachine import State, StateMachine

from layout_sm.rebalance_rules import RebalanceRules
from layout_sm.standby_rules import StandbyRules
from layout_sm.startup_rules import StartupRules


class EngineState(StartupRules, RebalanceRules, StandbyRules):
    """python-statemachine's model of the engine machines: the one place the session's protocol
    state is kept (``view``), with the spec's conjuncts as guards and the actions that change it,
    gathered from the rules of each machine. ``phase``, ``rebalance`` and ``role`` are the
    machines' state fields, read from the view and written into it when a transition enters its
    target."""

    __slots__ = ()


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
    # A fresh daemon's rank asks it to rejoin (spec: AskRejoin); granted, the rank waits as for a repair.
    rejoin = start.to.itself(internal=True, cond="to_rejoin", on="take_rejoin_reply")
    gather = start.to.itself(internal=True, cond="one_per_rank", on="take_findings")
    agree = (
        start.to(failed, cond="every_rank_found and unreadable", on="fail_unreadable")
        | start.to(failed, cond="every_rank_found and timed_out", on="fail_timed_out")
        | start.to(failed, cond="every_rank_found and dirty", on="fail_dirty")
        | start.to(failed, cond="every_rank_found and rejoin_refused", on="fail_rejoin_refused")
        | start.to(load, cond="every_rank_found and recorded_nowhere", on="keep_own_no_record")
        | start.to(failed, cond="every_rank_found and moved_beside_no_record", on="fail_moved_beside_no_record")
        | start.to(load, cond="every_rank_found and lacks_record", on="keep_own_mixed")
        | start.to.itself(internal=True, cond="every_rank_found and rejoin_wanted", on="mark_rejoin")
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
    spec's BeginChunk (``chunk``), Begin, Decide, Abort, the end of sglang's move (``move``), Commit,
    Committed (no collective: the check of the commits is owed) and Verify, the all-gather that ends a
    rebalance with a check owed (otherwise the next chunk's Decide makes it).
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
    owed_gathered = idle.to.itself(internal=True, on="take_owed")  # the rebalance's end: then verify
    decide = (
        beginning.to(moving, cond="every_rank_began and all_ok and owed_checks", on="proceed")
        | beginning.to(aborting, cond="every_rank_began and stops_for_good and any_ok", on="stop_after_aborts")
        | beginning.to(off, cond="every_rank_began and stops_for_good", on="stop")
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
    committed = committing.to(idle, cond="commit_answered", on="owe_check")
    verify = idle.to.itself(internal=True, cond="check_owed and owed_checks", on="keep_verified") | idle.to(
        off, cond="check_owed", on="refuse_unverified"
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
