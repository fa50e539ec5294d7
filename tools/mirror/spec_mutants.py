"""Spec mutants (``make spec-mutants``): each named rule of the spec broken by one text edit, judged by TLC.

Why: a property that no broken rule can violate proves little. Each mutant of ``CATALOG``
replaces one exact snippet of ``spec/LayoutProtocol.tla`` in a temporary copy of ``spec/``
(the committed files are never edited), and TLC runs on the copy:

1. safety on each of the mutant's models (``Spec``, the model's invariants and action
   properties): a violation kills the mutant; the same distinct and generated counts as the
   unmutated spec on every model mean the rule never fires there (its removal changes nothing);
2. the witnesses of ``check_spec.WITNESSES`` on those models: one no longer found kills it;
3. the whole model (``FairSpec``, liveness included): a violation kills it.

A mutant that survives must be listed as defence in depth (``defence``: why, and the test that
covers the rule in code); one that is killed but listed so is reported too (the list is stale).

    python -m tools.mirror.spec_mutants [--only NAME,...] [--doc results/spec-mutants.md] [--workers 1]

Exit 0 when every mutant is killed or listed as defence in depth, 1 otherwise, 2 when TLC is
missing (it says what, like ``make check-spec``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tools.mirror.check_spec import WITNESSES, find_jar, parse_stdout, run_witness, scrub

SPEC_FILE = "LayoutProtocol.tla"
ACTION_PROPERTIES = (  # checked with safety
    "DirtySticky", "VersionMonotonic", "BeginsAlone", "ClaimsAlone", "BusyOnlyByUnparked", "ClaimWaitsOutRepair",
    "NoticeOnlyWhenFree", "RejoinsOnlyBehind", "FailedCheckStops", "CheckFailsOnlyOnFault", "ClaimsFollowNotices",
)  # fmt: skip
# Liveness is checked on the smallest model only: with FairSpec, TLC needs minutes on MCSmall and
# tens of minutes on MCChunks and MCFull on 2 shared cores.
LIVENESS_MODELS = ("MCSmall",)
# The repair models are small (under a minute with FairSpec): a mutant of the repair is judged on its
# own models' liveness too.
# So are the standby models (MCStandby under a minute, MCTwoStandbys about two).
# And the rejoin's (MCRejoin, about two minutes).
SMALL_LIVENESS_MODELS = ("MCRepair", "MCRepairFails", "MCStandby", "MCTwoStandbys", "MCStandbyRepair", "MCRejoin")
BASELINE_CACHE = Path("build") / "spec-mutants-baseline.json"


@dataclass(frozen=True)
class SpecMutant:
    name: str
    rule: str  # the rule it breaks, in the spec's words
    old: str  # exact text of spec/LayoutProtocol.tla, found exactly once
    new: str
    models: tuple[str, ...] = ("MCSmall",)
    defence: str = ""  # why surviving is expected, and the test that covers the rule in code

    def apply(self, text: str) -> str:
        n = text.count(self.old)
        if n != 1:
            raise ValueError(
                f"spec mutant {self.name}: its text occurs {n} times in {SPEC_FILE} (must be exactly once); "
                f"update the catalog to the spec:\n{self.old}"
            )
        return text.replace(self.old, self.new)


def _m(
    name: str, rule: str, old: str, new: str, models: tuple[str, ...] = ("MCSmall",), defence: str = ""
) -> SpecMutant:
    return SpecMutant(name, rule, old, new, models, defence)


# Tests that cover, in code, rules the bounded models never exercise.
_T_BEGIN = "tests/layout_sm/test_begin_precedence.py::test_each_condition_alone_gives_its_reply"

CATALOG: tuple[SpecMutant, ...] = (
    # --- startup -------------------------------------------------------------------------------
    _m(
        "attach_not_recorded",
        "an attach records the engine's live attachment",
        "    /\\ datt' = [datt EXCEPT ![r] = @ \\cup {e}]\n    /\\ efind'",
        "    /\\ datt' = datt\n    /\\ efind'",
    ),
    _m(
        "attach_ignores_foreign_pending",
        "a rank that finds another engine's move pending waits",
        "IF MustWait(e, r)\n                                         THEN",
        'IF dphase[r] = "repairing"\n                                         THEN',
    ),
    _m(
        "poll_while_pending",
        "a poll ends the wait only once the move has ended",
        '    /\\ efind[e][r].found = "wait"\n    /\\ ~MustWait(e, r)\n',
        '    /\\ efind[e][r].found = "wait"\n    /\\ dphase[r] # "repairing"\n',
    ),
    _m(
        "poll_keeps_old_record",
        "a poll reads the record again (the move may have committed)",
        "    /\\ efind' = [efind EXCEPT ![e][r] = Snapshot(r)]\n    /\\ UNCHANGED <<dphase, dver, dmap, dpend, datt",
        "    /\\ efind' = [efind EXCEPT ![e][r].found = Snapshot(r).found]\n"
        "    /\\ UNCHANGED <<dphase, dver, dmap, dpend, datt",
    ),
    _m(
        "startup_ignores_dirty",
        "startup fails on a dirty daemon",
        'f.found \\in {"dirty", "timeout", "refused"}',
        'f.found \\in {"timeout", "refused"}',
    ),
    _m(
        "startup_ignores_timeout",
        "startup fails when a wait timed out",
        'f.found \\in {"dirty", "timeout", "refused"}',
        'f.found \\in {"dirty", "refused"}',
    ),
    _m(
        "startup_mixed_moved_ok",
        "startup fails when some daemons keep no record and a recording one has moved",
        "    \\/ (Recorded(e) # Found(e) /\\ \\E f \\in Recorded(e) : Moved(f))\n",
        "",
        ("MCFull",),
        defence="in MCFull a run where daemon 2 keeps no record never moves (nobody adopts, so nobody "
        "rebalances shared weights); the rule guards a daemon restarted with --enable-eplb off after a move: "
        "tests/layout_sm/test_engine.py::test_startup_fails_with_the_reason (mixed_after_move)",
    ),
    _m(
        "startup_records_disagree_ok",
        "startup fails when the daemons' records differ",
        "    \\/ \\E f, g \\in Recorded(e) : f.fver # g.fver \\/ f.fmap # g.fmap\n",
        "",
    ),
    _m(
        "startup_compares_maps_only",
        "startup compares versions as well as maps (digests)",
        "\\E f, g \\in Recorded(e) : f.fver # g.fver \\/ f.fmap # g.fmap",
        "\\E f, g \\in Recorded(e) : f.fmap # g.fmap",
    ),
    _m(
        "startup_compares_versions_only",
        "startup compares maps (digests), not only versions",
        "\\E f, g \\in Recorded(e) : f.fver # g.fver \\/ f.fmap # g.fmap",
        "\\E f, g \\in Recorded(e) : f.fver # g.fver",
        ("MCChunks",),
        defence="with a daemon restart only as the way to reset a record, two daemons at one version "
        "always hold one map in these models; the digest decides equality in code: "
        "tests/layout_sm/test_engine.py::test_startup_fails_with_the_reason (disagree) and "
        "tests/layout_sm/test_record.py::test_different_maps_have_different_digests",
    ),
    _m(
        "adopt_keeps_initial_map",
        "startup adopts the daemons' map",
        "IF Adopts(e) THEN f.fmap ELSE InitialMap",
        "InitialMap",
    ),
    _m(
        "adopt_keeps_version_zero",
        "startup adopts the daemons' version",
        "IF Adopts(e) THEN f.fver ELSE 0",
        "0",
    ),
    _m(
        "share_without_full_adoption",
        "shared rebalancing only when every daemon keeps a record",
        "    /\\ eshare' = [eshare EXCEPT ![e] = Adopts(e)]",
        "    /\\ eshare' = [eshare EXCEPT ![e] = TRUE]",
        ("MCFull",),
    ),
    # --- fetch_state -----------------------------------------------------------------------------
    _m(
        "fetch_ignores_claim",
        "fetch_state serves a plugin engine only when its claimed layout is the record's",
        "ELSE eroute[e] = dmap[r]",
        "ELSE TRUE",
        ("MCSmall", "MCChunks"),
        defence="an attached engine keeps every other engine from moving, so the record it adopted is "
        "still the daemon's when it fetches; the daemon's check covers a claim that went stale otherwise: "
        "tests/daemon_adapter/test_requests.py::test_fetch_state_layout_check (digest_mismatch)",
    ),
    _m(
        "fetch_older_after_move",
        "an older engine (no claim) is served only at version 0",
        "IF e \\in Older THEN dver[r] = 0 ELSE",
        "IF e \\in Older THEN TRUE ELSE",
        ("MCFull",),
    ),
    _m(
        "fetch_serves_pending",
        "fetch_state refuses while a move is pending",
        '    \\/ /\\ dphase[r] = "clean"\n       /\\ IF e',
        '    \\/ /\\ dphase[r] \\in {"clean", "pending"}\n       /\\ IF e',
        ("MCFull",),
    ),
    _m(
        "fetch_serves_dirty",
        "fetch_state refuses on a dirty daemon",
        '    \\/ /\\ dphase[r] = "clean"\n       /\\ IF e',
        '    \\/ /\\ dphase[r] \\in {"clean", "dirty"}\n       /\\ IF e',
        ("MCFull",),
    ),
    _m(
        "fetch_nonfollowing_not_set",
        "a fetch without a live attachment sets the sticky non-following flag",
        "/\\ dnf' = [dnf EXCEPT ![r] = @ \\/ FetchNonFollowing(e, r)]",
        "/\\ dnf' = dnf",
        ("MCFull",),
    ),
    _m(
        "fetch_nonfollowing_only_older",
        "a plugin engine that fetches without a live attachment is non-following too",
        'dphase[r] = "clean" /\\ (e \\in Older \\/ e \\notin datt[r])',
        'dphase[r] = "clean" /\\ e \\in Older',
        ("MCSmall",),
        defence="a plugin engine always attaches before it fetches and stays attached while alive; "
        "the daemon sets the flag for an unattached claim: "
        "tests/daemon_adapter/test_requests.py::test_fetch_state_layout_check "
        "(the right digest without a live attachment)",
    ),
    # --- rebalance: begin ------------------------------------------------------------------------
    _m(
        "begin_without_share",
        "an engine rebalances shared weights only while sharing is on",
        '    /\\ eshare[e]\n    /\\ reb[e].step = "idle"',
        '    /\\ reb[e].step = "idle"',
        ("MCSmall", "MCFull"),
        defence="the daemons refuse every begin the engine's own gate skips (no record, non-following seen, "
        "stale base version), so the gate only saves requests: "
        "tests/layout_sm/test_engine.py::test_rebalance_machine_turns_off_for_good",
    ),
    _m(
        "begin_unattached_ok",
        "begin needs a live attachment with this session",
        '    CASE e \\notin datt[r]                                   -> "refused"\n      [] dphase[r]',
        "    CASE dphase[r]",
        defence="the spec's running engines are always attached (Detach needs the engine gone); "
        f"{_T_BEGIN}[not_attached], "
        "tests/daemon_adapter/test_requests.py::test_session_spoofing_and_stale_sessions_are_refused",
    ),
    _m(
        "begin_own_pending_ok",
        "begin is refused when this engine already has a move pending",
        '      [] dphase[r] = "pending" /\\ dpend[r].mover = e        -> "refused"\n',
        "",
        defence="an engine begins only from idle, and its moves end before it is idle again "
        "(PendingHasMover) unless a commit fails, which never happens in these models; the one-collective "
        "chunk relies on this rule for a failed commit (its move stays pending, the next begin there is "
        f"refused): {_T_BEGIN}[own_move_pending], "
        "tests/layout_sm/test_session.py::test_a_failed_commit_stops_at_the_next_begin_and_its_move_stays_pending",
    ),
    _m(
        "begin_on_dirty_or_no_record",
        "begin is refused on a daemon without a record, dirty or repairing",
        '      [] dphase[r] \\in {"no_record", "dirty", "repairing"}  -> "refused"\n',
        "",
        ("MCSmall", "MCFull", "MCRepair"),
        defence="an engine that shares weights adopted a record on every daemon, and a daemon it is attached "
        "to cannot go dirty or repairing (only a gone mover's pending move does, and the engine's attachment "
        f"makes that begin busy): {_T_BEGIN}[no_record] and [dirty]; repairing: "
        "tests/layout_sm/test_daemon_machine.py::test_the_first_failing_conjunct_makes_the_answer_and_keeps_the_phase "
        "(begin, is_repairing)",
    ),
    _m(
        "begin_ignores_nonfollowing",
        "begin is refused once a non-following engine was served",
        '      [] dnf[r]                                             -> "refused"\n',
        "",
        ("MCFull",),
    ),
    _m(
        "begin_ignores_base_version",
        "begin is refused when its base version is not the record's",
        '      [] ever[e] # dver[r]                                  -> "refused"\n',
        "",
        ("MCSmall", "MCChunks"),
        defence="while an engine is attached nobody else commits, and its own commits are verified, so its "
        f"version is the record's: {_T_BEGIN}[stale_base_version], "
        "tests/daemon_adapter/test_requests.py::test_begin_precedence_permanent_before_transient",
    ),
    _m(
        "begin_ignores_foreign_pending",
        "begin is busy while another engine's move is pending",
        '      [] dphase[r] = "pending"                              -> "busy"\n',
        "",
        ("MCSmall", "MCChunks"),
        defence="a pending move's engine stays attached until its EOF, and then the daemon is dirty, so "
        "the next rule (another engine attached: busy) already answers; the daemon keeps the check "
        f"because an attachment and a pending move are separate records: {_T_BEGIN}[other_move_pending]",
    ),
    _m(
        "begin_ignores_other_attached",
        "begin is busy while another unparked engine is attached",
        '      [] Unparked(r) \\ {e} # {}                             -> "busy"\n',
        "",
    ),
    _m(
        "begin_ok_not_pending",
        "an ok begin makes the move pending",
        '      THEN /\\ dphase\' = [dphase EXCEPT ![r] = "pending"]\n',
        "      THEN /\\ dphase' = dphase\n",
    ),
    # --- rebalance: decide, abort, move, commit, verify --------------------------------------------
    _m(
        "decide_moves_on_partial_ok",
        "the engine moves only when every rank's begin was ok",
        'IF replies = {"ok"} /\\ checked THEN',
        'IF "ok" \\in replies /\\ checked THEN',
    ),
    _m(
        "decide_does_not_abort",
        "the ok ranks of a failed begin are aborted",
        'ELSE IF anyOk THEN [@ EXCEPT !.step = "abort", !.owed = "none"]',
        "ELSE IF anyOk THEN IdleReb",
    ),
    _m(
        "decide_keeps_share_on_refusal",
        "a refused begin turns shared rebalancing off for good",
        '/\\ eshare\' = [eshare EXCEPT ![e] = "refused" \\notin replies /\\ checked]',
        "/\\ eshare' = [eshare EXCEPT ![e] = checked]",
        ("MCSmall", "MCFull"),
        defence="a refusal is permanent: the daemons refuse every later begin for the same reason, so turning "
        "shared rebalancing off only saves requests: "
        "tests/layout_sm/test_engine.py::test_rebalance_machine_turns_off_for_good",
    ),
    _m(
        "abort_keeps_pending",
        "abort clears the move",
        "    /\\ dphase' = [dphase EXCEPT ![r] = \"clean\"]\n    /\\ dpend' = [dpend EXCEPT ![r] = NONE]\n"
        "    /\\ reb' = [reb EXCEPT ![e] =\n                 IF",
        "    /\\ UNCHANGED <<dphase, dpend>>\n    /\\ reb' = [reb EXCEPT ![e] =\n                 IF",
    ),
    _m(
        "abort_unanswered_begin",
        "a rank aborts only a begin answered ok: an abort names no begin, so a lost reply is not aborted",
        '    /\\ reb[e].step = "abort"\n    /\\ reb[e].replies[r] = "ok"\n',
        '    /\\ reb[e].step = "abort"\n    /\\ reb[e].replies[r] \\in {"ok", "refused"}\n',
    ),
    _m(
        "commit_before_moved",
        "a rank commits only after the device synchronize (every layer moved)",
        "    /\\ MovedEverywhere(e)\n",
        "",
    ),
    _m(
        "commit_keeps_version",
        "a commit increments the version",
        "              /\\ dver' = [dver EXCEPT ![r] = @ + 1]",
        "              /\\ dver' = dver",
    ),
    _m(
        "commit_keeps_map",
        "a commit stores the new rows",
        "              /\\ dmap' = [dmap EXCEPT ![r] = Target(e)]",
        "              /\\ dmap' = dmap",
    ),
    _m(
        "commit_ok_unattached",
        "commit needs this session's live attachment",
        '    /\\ e \\in datt[r]\n    /\\ dphase[r] = "pending"\n',
        '    /\\ dphase[r] = "pending"\n',
        defence="a live engine is always attached; "
        "tests/model_based/test_defensive_rules.py::test_another_engine_cannot_abort_or_commit_a_move (a real daemon)",
    ),
    _m(
        "commit_ok_other_layers",
        "commit needs the same layer list as the begin",
        "    /\\ dpend[r].layers = reb[e].chunk\n",
        "",
        ("MCSmall", "MCChunks"),
        defence="the spec's engine commits the chunk it began; the daemon checks a commit naming other "
        "layers: tests/model_based/test_defensive_rules.py::test_a_commit_must_name_the_layers_of_its_move",
    ),
    _m(
        "committed_check_always_good",
        "the check a chunk owes is that every daemon recorded the new version with the engine's map",
        'IF good THEN "good" ELSE "bad"',
        '"good"',
        ("MCSmall", "MCChunks"),
    ),
    _m(
        "every_check_fails",
        "a check fails only where a commit was refused or its reply lost",
        'IF good THEN "good" ELSE "bad"',
        '"bad"',
        ("MCSmall", "MCChunks"),
    ),
    _m(
        "decide_ignores_failed_check",
        "a failed check, gathered with the next begin, aborts that chunk and turns rebalancing off",
        '           checked == reb[e].owed # "bad"',
        "           checked == TRUE",
        ("MCSmall", "MCChunks"),
    ),
    _m(
        "verify_keeps_share_on_failed_check",
        "a failed check at the rebalance's end turns rebalancing off",
        '    /\\ eshare\' = [eshare EXCEPT ![e] = reb[e].owed = "good"]',
        "    /\\ eshare' = eshare",
        ("MCSmall", "MCChunks"),
    ),
    _m(
        "verify_keeps_check_owed",
        "the rebalance's end makes the check its last chunk owes",
        '    /\\ reb\' = [reb EXCEPT ![e].owed = "none"]',
        "    /\\ reb' = reb",
    ),
    _m(
        "committed_keeps_route",
        "after a move the engine routes with the moved layout",
        "    /\\ eroute' = [eroute EXCEPT ![e] = Target(e)]\n    /\\ ever'",
        "    /\\ eroute' = eroute\n    /\\ ever'",
    ),
    _m(
        "committed_keeps_version",
        "after a committed chunk the engine claims the next version",
        "/\\ ever' = [ever EXCEPT ![e] = @ + 1]\n",
        "/\\ ever' = ever\n",
        ("MCChunks",),
    ),
    # --- failures, EOF, restart ------------------------------------------------------------------
    _m(
        "detach_pending_not_dirty",
        "the EOF of a mover with a move pending makes the daemon dirty",
        '         THEN dphase\' = [dphase EXCEPT ![r] = IF Repairs THEN "repairing" ELSE "dirty"]\n'
        "         ELSE UNCHANGED dphase",
        "         THEN UNCHANGED dphase\n         ELSE UNCHANGED dphase",
    ),
    _m(
        "detach_repairs_when_off",
        "with auto repair off the daemon of a torn move stays dirty",
        'IF Repairs THEN "repairing" ELSE "dirty"]',
        '"repairing"]',
    ),
    # --- repair of a torn move (docs/protocol.md §4) ---------------------------------------------
    _m(
        "detach_never_repairs",
        "with auto repair on the repair starts as soon as the daemon turns dirty",
        'IF Repairs THEN "repairing" ELSE "dirty"]',
        '"dirty"]',
        ("MCRepair",),
    ),
    _m(
        "repair_keeps_torn_rows",
        "the repair reloads the torn move's layers at the record's (the base version's) rows",
        "IF l \\in dpend[r].layers THEN dmap[r][l] ELSE truth[r][l]",
        "IF l \\in dpend[r].layers THEN truth[r][l] ELSE truth[r][l]",
        ("MCRepair",),
    ),
    _m(
        "repair_restores_initial_rows",
        "the repair reloads the base version's rows, not the initial layout's",
        "IF l \\in dpend[r].layers THEN dmap[r][l] ELSE truth[r][l]",
        "IF l \\in dpend[r].layers THEN 0 ELSE truth[r][l]",
        ("MCRepair",),
    ),
    _m(
        "repair_bumps_version",
        "the repair returns to the base version (dver unchanged)",
        "    /\\ UNCHANGED <<dver, dmap, datt, dnf, dcopy, ephase, efind, eroute, ever, eserv, eshare, reb, moves, "
        "dpark>>",
        "    /\\ dver' = [dver EXCEPT ![r] = @ + 1] "
        "/\\ UNCHANGED <<dmap, datt, dnf, dcopy, ephase, efind, eroute, ever, eserv, eshare, reb, moves, dpark>>",
        ("MCRepair",),
    ),
    _m(
        "repair_not_fair",
        "a repair that has started runs to its end (weak fairness on RepairDone)",
        "    /\\ \\A r \\in Ranks : WF_vars(RepairDone(r))\n",
        "",
        ("MCRepair",),
    ),
    _m(
        "attach_during_repair_no_wait",
        "a rank that attaches while the daemon repairs waits",
        "IF MustWait(e, r)\n                                         THEN",
        "IF ForeignPending(e, r)\n                                         THEN",
        ("MCRepair",),
    ),
    _m(
        "poll_during_repair",
        "a poll ends the wait only once the repair has ended",
        "    /\\ ~MustWait(e, r)\n",
        "    /\\ ~ForeignPending(e, r)\n",
        ("MCRepair",),
    ),
    _m(
        "repair_failure_clean",
        "a failed repair leaves the daemon dirty",
        '    /\\ dphase[r] = "repairing"\n    /\\ dphase\' = [dphase EXCEPT ![r] = "dirty"]',
        '    /\\ dphase[r] = "repairing"\n    /\\ dphase\' = [dphase EXCEPT ![r] = "clean"]',
        ("MCRepairFails",),
    ),
    # --- warm standbys (docs/protocol.md §10) ----------------------------------------------------
    _m(
        "park_not_recorded",
        "a park makes the daemon keep the attachment as parked",
        "    /\\ dpark' = [dpark EXCEPT ![r] = @ \\cup {e}]\n    /\\ ephase' = [ephase EXCEPT ![e] = \"parked\"]",
        "    /\\ dpark' = dpark\n    /\\ ephase' = [ephase EXCEPT ![e] = \"parked\"]",
        ("MCStandby",),
    ),
    _m(
        "parked_standby_serves",
        "a parked standby runs no forward pass",
        "    /\\ dpark' = [dpark EXCEPT ![r] = @ \\cup {e}]\n    /\\ ephase' = [ephase EXCEPT ![e] = \"parked\"]",
        "    /\\ dpark' = [dpark EXCEPT ![r] = @ \\cup {e}]\n    /\\ ephase' = ephase",
        ("MCStandby",),
    ),
    _m(
        "begin_busy_by_parked",
        "a begin is busy only while another unparked engine is attached",
        '      [] Unparked(r) \\ {e} # {}                             -> "busy"',
        '      [] datt[r] \\ {e} # {}                                 -> "busy"',
        ("MCStandby",),
    ),
    _m(
        "detach_no_notice",
        "the last unparked attachment's EOF notifies the parked standbys",
        "    /\\ eclaim' = Notify(eclaim, r, datt'[r], dpark'[r], dphase'[r])",
        "    /\\ eclaim' = eclaim",
        ("MCStandby",),
    ),
    _m(
        "park_reply_no_notice",
        "a park's reply is the notice when no unparked engine is attached",
        "    /\\ eclaim' = Notify([eclaim EXCEPT ![e][r] = \"parked\"], r, datt[r], dpark'[r], dphase[r])",
        '    /\\ eclaim\' = [eclaim EXCEPT ![e][r] = "parked"]',
        ("MCStandby",),
    ),
    _m(
        "notice_while_unparked",
        "a notice is sent only when no unparked engine is attached",
        '        IF f \\in park /\\ c[f][r] = "parked" /\\ att \\ park = {}',
        '        IF f \\in park /\\ c[f][r] = "parked"',
        ("MCStandby",),
    ),
    _m(
        "claim_refused_while_repairing",
        "a repairing daemon answers a claim busy (the standby parks again), not refused (it would fail)",
        '      [] dphase[r] = "repairing"  -> "taken"\n',
        "",
        ("MCStandbyRepair",),
    ),
    _m(
        "notice_while_repairing",
        "a repairing daemon tells no parked standby that the primary role is free",
        '/\\ att \\ park = {} /\\ phase # "repairing"',
        "/\\ att \\ park = {}",
        ("MCStandbyRepair",),
    ),
    _m(
        "repair_done_no_notice",
        "the repair's end tells the parked standbys",
        '    /\\ eclaim\' = Notify(eclaim, r, datt[r], dpark[r], "clean")',
        "    /\\ eclaim' = eclaim",
        ("MCStandbyRepair",),
    ),
    _m(
        "claim_ignores_unparked",
        "a claim is granted only while no unparked engine is attached",
        '    CASE Unparked(r) # {}         -> "taken"',
        '    CASE FALSE                    -> "taken"',
        ("MCStandby", "MCTwoStandbys"),
    ),
    _m(
        "claim_ignores_dirty",
        "a claim is granted only on a clean daemon",
        '      [] dphase[r] # "clean"      -> "refused"',
        '      [] FALSE                    -> "refused"',
        ("MCStandby",),
    ),
    _m(
        "claim_before_every_notice",
        "the ranks claim only once every rank has its notice (the all-gather)",
        '    /\\ \\A q \\in Ranks : eclaim[e][q] \\in {"notified", "granted"}\n',
        "",
        ("MCStandby", "MCTwoStandbys"),
    ),
    _m(
        "claim_without_notice",
        "a parked standby claims only where a daemon told it the primary role is free",
        '    /\\ \\A q \\in Ranks : eclaim[e][q] \\in {"notified", "granted"}\n    /\\ eclaim[e][r] = "notified"\n',
        '    /\\ \\A q \\in Ranks : eclaim[e][q] \\in {"parked", "notified", "granted"}\n'
        '    /\\ eclaim[e][r] \\in {"parked", "notified"}\n',
        ("MCStandby",),
    ),
    _m(
        "claims_any_rank_order",
        "the ranks claim in rank order, each after the ranks before it were granted",
        '    /\\ \\A q \\in 1..(r - 1) : eclaim[e][q] = "granted"\n'
        "    /\\ eclaim' = [eclaim EXCEPT ![e][r] = ClaimReply(e, r)]",
        "    /\\ eclaim' = [eclaim EXCEPT ![e][r] = ClaimReply(e, r)]",
        ("MCTwoStandbys",),
    ),
    _m(
        "grant_keeps_parked",
        "a granted claim unparks the attachment",
        "         THEN /\\ dpark' = [dpark EXCEPT ![r] = @ \\ {e}]",
        "         THEN /\\ dpark' = dpark",
        ("MCStandby",),
    ),
    _m(
        "promote_on_some_grants",
        "a standby promotes only when every rank was granted",
        "         ELSE IF Granted(e)\n",
        '         ELSE IF \\E r \\in Ranks : eclaim[e][r] = "granted"\n',
        ("MCStandby",),
    ),
    _m(
        "promote_keeps_stale_route",
        "a promoted standby adopts the records' map",
        "              /\\ eroute' = [eroute EXCEPT ![e] = efind[e][1].fmap]",
        "              /\\ eroute' = eroute",
        ("MCStandby",),
    ),
    _m(
        "taken_keeps_grants",
        "a taken claim parks the standby again where it was granted",
        'IF eclaim[e][r] \\in {"granted", "taken"}',
        'IF eclaim[e][r] \\in {"taken"}',
        ("MCStandby", "MCTwoStandbys"),
    ),
    _m(
        "taken_rank_not_parked_again",
        "the taken rank parks again too (its park reply is the notice a claim may have missed)",
        'IF eclaim[e][r] \\in {"granted", "taken"}\n'
        '                                                 THEN "release" ELSE eclaim[e][r]]]',
        'CASE eclaim[e][r] = "granted" -> "release" [] eclaim[e][r] = "taken" -> "parked"\n'
        "                                                 [] OTHER -> eclaim[e][r]]]",
        ("MCStandby",),
    ),
    _m(
        "standby_steps_not_fair",
        "a standby's own steps (its startup, park, claims, promotion) run to their end (weak fairness on EngineSteps)",
        "    /\\ \\A e \\in Engines : WF_vars(EngineSteps(e))\n",
        "    /\\ \\A e \\in Engines \\ Standbys : WF_vars(EngineSteps(e))\n",
        ("MCStandby",),
    ),
    _m(
        "detach_live_engine",
        "a daemon notices EOF only of a gone engine",
        "    /\\ e \\in datt[r]\n    /\\ Gone(e)\n",
        "    /\\ e \\in datt[r]\n",
    ),
    _m(
        "restart_while_attached",
        "a dirty daemon is restarted only once nobody is attached",
        '    /\\ dphase[r] = "dirty"\n    /\\ datt[r] = {}\n',
        '    /\\ dphase[r] = "dirty"\n',
        defence="an engine still attached to a dirty daemon found it dirty (or waits on it) and its startup "
        "fails whatever the restart does; the rule is the operator's procedure (restart a dirty daemon once "
        "its engines are gone: README.md), and a restarted daemon process holds no attachment in code",
    ),
    _m(
        "restart_while_served",
        "a dirty daemon is restarted only once nobody serves from it",
        "    /\\ \\A e \\in Engines : r \\notin eserv[e]\n    /\\ \\E c \\in CopiesAtStart(r)",
        "    /\\ \\E c \\in CopiesAtStart(r)",
        defence="nobody serves from a daemon whose move is pending (OneMover), and only a pending move "
        "becomes dirty, so a dirty daemon has no live reader; the operator's restart is outside the code",
    ),
    _m(
        "start_keeps_weights",
        "a daemon that starts again (restarted, or lost) loads its memory at the record it starts with",
        "    /\\ truth' = [truth EXCEPT ![r] = StartMap(c)]",
        "    /\\ truth' = truth",
        ("MCSmall", "MCRejoin"),
    ),
    _m(
        "start_keeps_version",
        "a daemon that starts again is at the version of the record it starts with (its copy's, or 0)",
        "    /\\ dver' = [dver EXCEPT ![r] = StartVersion(c)]",
        "    /\\ dver' = dver",
        ("MCSmall", "MCRejoin"),
        defence="the version is a label: a restarted record keeps the initial map under any version, and "
        "startup compares digests as well as versions, so nothing wrong is served; in code a restarted "
        "daemon is a fresh process whose record starts at its copy's version or 0: "
        "tests/daemon_adapter/test_durable.py::test_a_commit_is_copied_and_the_daemon_killed_starts_again_from_it",
    ),
    # --- the durable copy ---------------------------------------------------------------------------
    _m(
        "start_ignores_copy",
        "a daemon that starts again starts from its whole durable copy",
        "CopiesAtStart(r) == IF Durable /\\ dcopy[r] # NONE THEN {dcopy[r], NONE} ELSE {NONE}",
        "CopiesAtStart(r) == {NONE}",
        ("MCDurable",),
    ),
    _m(
        "start_from_copy_at_version_0",
        "a daemon started from its copy is at the copy's version",
        "StartVersion(c) == IF c = NONE THEN 0 ELSE c.cver",
        "StartVersion(c) == 0",
        ("MCDurable",),
    ),
    _m(
        "copy_of_the_memory",
        "the copy is the committed record, never the memory mid-move",
        "Copy(r) == [cver |-> dver[r], cmap |-> dmap[r]]",
        "Copy(r) == [cver |-> dver[r], cmap |-> truth[r]]",
        ("MCDurable",),
    ),
    _m(
        "copy_while_repairing",
        "the writer writes a committed record (clean, or a move pending), never one being reloaded",
        '    /\\ dphase[r] \\in {"clean", "pending"}\n    /\\ dcopy[r] # Copy(r)',
        '    /\\ dphase[r] \\in {"clean", "pending", "repairing"}\n    /\\ dcopy[r] # Copy(r)',
        ("MCDurable",),
        defence="a copy of a rejoin's record written before its reload ends still names a map the daemon "
        "loads whole at its next start, so nothing wrong is served; in code the writer writes only what "
        "copy_due names: tests/layout_sm/test_durable.py::test_a_dirty_or_repairing_daemon_writes_nothing",
    ),
    # --- a lost daemon, and its rejoin ------------------------------------------------------------
    _m(
        "rejoin_reloads_some_layers",
        "a rejoin reloads every layer at the record's rows",
        "[mover |-> e, layers |-> Layers, base |-> t.fver]",
        "[mover |-> e, layers |-> {1}, base |-> t.fver]",
        ("MCRejoin",),
    ),
    _m(
        "rejoin_keeps_version_zero",
        "a rejoin takes the version of the record the others hold, with its map",
        "    /\\ dver' = [dver EXCEPT ![r] = t.fver]",
        "    /\\ dver' = dver",
        ("MCRejoin",),
    ),
    _m(
        "rejoin_skips_wait",
        "a rank waits out its daemon's rejoin before the ranks agree again",
        'efind\' = [efind EXCEPT ![e][r] = [t EXCEPT !.found = "wait"]]',
        'efind\' = [efind EXCEPT ![e][r] = [t EXCEPT !.found = "record"]]',
        ("MCRejoin",),
    ),
    _m(
        "rejoin_not_behind",
        "only a daemon behind the record it rejoins at rejoins: none is rewound",
        "    /\\ dver[r] < v\n    /\\ datt[r] \\subseteq {e}",
        "    /\\ datt[r] \\subseteq {e}",
        ("MCRejoin",),
        defence="the asker is attached to the daemon it found behind, and an attached engine keeps every other "
        "engine from moving that daemon (a begin there is busy) and dies if the daemon is lost, so the daemon "
        "is still behind when the ask arrives; in code: "
        "tests/layout_sm/test_rejoin.py::test_a_daemon_behind_rejoins_at_a_newer_version_and_none_is_rewound",
    ),
    _m(
        "rejoin_beside_no_record",
        "a rejoin is wanted only where every daemon keeps a record",
        "    /\\ Rejoins\n    /\\ Recorded(e) = Found(e)\n    /\\ \\E f \\in Found(e) : Behind(e, f)",
        "    /\\ Rejoins\n    /\\ \\E f \\in Found(e) : Behind(e, f)",
        ("MCRejoinTwoMoves",),
    ),
    _m(
        "rejoin_beside_attached",
        "a daemon rejoins only with no engine attached but the asker",
        "    /\\ datt[r] \\subseteq {e}\n    /\\ ~dnf[r]",
        "    /\\ ~dnf[r]",
        ("MCRejoin",),
        defence="an engine that serves from a fresh daemon beside moved ones cannot exist (its startup would have "
        "asked for the rejoin or failed), and one still starting maps nothing yet: its own ask then finds the "
        "daemon rejoining and is refused; in code: "
        "tests/layout_sm/test_rejoin.py::test_a_daemon_with_another_engine_attached_refuses_to_rejoin",
    ),
    _m(
        "startup_ignores_refused_rejoin",
        "startup fails when a rank's daemon refused to rejoin",
        'f.found \\in {"dirty", "timeout", "refused"}',
        'f.found \\in {"dirty", "timeout"}',
        ("MCRejoin",),
        defence="an engine whose rejoin was refused keeps its own initial layout without sharing, and the fetch "
        "check then refuses it on every daemon that holds the moved record; in code: "
        "tests/layout_sm/test_rejoin.py::test_a_refused_rejoin_fails_the_startup_with_the_reason",
    ),
)


@dataclass
class Verdict:
    mutant: SpecMutant
    status: str  # "killed", "defence in depth", "SURVIVED", "STALE DEFENCE", "error"
    how: str
    seconds: float = 0.0
    counts: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status in ("killed", "defence in depth")


_SECTION = re.compile(r"^(SPECIFICATION|PROPERTIES|PROPERTY)\b", re.M)


def safety_cfg(cfg: str) -> str:
    """The model's .cfg checking safety only: ``Spec``, its invariants, the action properties."""
    cfg = re.sub(r"^SPECIFICATION\s+\w+", "SPECIFICATION Spec", cfg, flags=re.M)
    m = re.search(r"^(PROPERTIES|PROPERTY)\b(.*?)(?=^[A-Z]+\b|\Z)", cfg, re.M | re.S)
    if m is None:
        return cfg
    kept = [p for p in m.group(2).split() if p in ACTION_PROPERTIES]
    block = "PROPERTIES\n" + "".join(f"    {p}\n" for p in kept) if kept else ""
    return cfg[: m.start()] + block + cfg[m.end() :]


def killed_by(text: str) -> str | None:
    """The property TLC reports violated, or None (a parse or run error is not a kill)."""
    m = re.search(
        r"^Error: (Invariant \w+ is violated|Action property \w+ is violated"
        r"|Temporal property \w+ was violated|Temporal properties (?:[\w, ]+ )?were violated)",
        text,
        re.M,
    )
    return None if m is None else m.group(1)


def _tlc(jar: Path, work: Path, model: str, cfg_name: str, workers: str) -> tuple[str, int]:
    cmd = ["java", "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC", "-workers", workers, "-deadlock"]
    cmd += ["-config", cfg_name, "-metadir", str(work / f"states-{cfg_name}"), "-cleanup", "-noGenerateSpecTE"]
    proc = subprocess.run([*cmd, f"{model}.tla"], cwd=work, capture_output=True, text=True)
    return scrub(proc.stdout + proc.stderr, work, jar), proc.returncode


def prepare(spec_dir: Path, work: Path, mutant: SpecMutant | None) -> None:
    """A copy of spec/ in ``work``, the mutant applied, and a safety-only .cfg per model."""
    for f in list(spec_dir.glob("*.tla")) + list(spec_dir.glob("*.cfg")):
        shutil.copy(f, work / f.name)
    if mutant is not None:
        (work / SPEC_FILE).write_text(mutant.apply((spec_dir / SPEC_FILE).read_text()))
    for cfg in spec_dir.glob("MC*.cfg"):
        (work / f"{cfg.stem}_safety.cfg").write_text(safety_cfg(cfg.read_text()))


def _spec_key(spec_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(list(spec_dir.glob("*.tla")) + list(spec_dir.glob("*.cfg"))):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def baseline(
    jar: Path, spec_dir: Path, models: set[str], workers: str, cache: Path | None = BASELINE_CACHE
) -> dict[str, tuple[int | None, int | None]]:
    """Distinct and generated states of each model's safety run on the unmutated spec.

    Kept in ``cache`` under the SHA-256 of spec/, so a run after no spec change starts at once.
    """
    key = _spec_key(spec_dir)
    known: dict[str, list[int]] = {}
    if cache is not None and cache.is_file():
        data = json.loads(cache.read_text())
        known = data.get(key, {})
    out: dict[str, tuple[int | None, int | None]] = {m: tuple(known[m]) for m in models if m in known}  # type: ignore[misc]
    todo = sorted(models - set(out))
    if todo:
        with tempfile.TemporaryDirectory(prefix="spec-mutants-base-") as tmp:
            work = Path(tmp)
            prepare(spec_dir, work, None)
            for model in todo:
                text, rc = _tlc(jar, work, model, f"{model}_safety.cfg", workers)
                run = parse_stdout(model, text, rc)
                if not run.ok:
                    raise RuntimeError(f"the unmutated spec does not pass safety on {model}: {run.result}")
                out[model] = (run.distinct, run.generated)
        if cache is not None:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({key: {m: list(v) for m, v in out.items()}}, indent=1) + "\n")
    return out


def judge(jar: Path, spec_dir: Path, mutant: SpecMutant, base: dict, workers: str) -> Verdict:
    start = time.monotonic()
    counts: dict[str, tuple[int | None, int | None]] = {}

    def verdict(status: str, how: str) -> Verdict:
        if status == "killed" and mutant.defence:
            status, how = "STALE DEFENCE", f"{how}; but the catalog lists it as defence in depth"
        if status == "survived":
            status = "defence in depth" if mutant.defence else "SURVIVED"
            how = f"{how}; {mutant.defence}" if mutant.defence else how
        return Verdict(mutant, status, how, time.monotonic() - start, counts)

    with tempfile.TemporaryDirectory(prefix=f"spec-mutant-{mutant.name}-") as tmp:
        work = Path(tmp)
        try:
            prepare(spec_dir, work, mutant)
        except ValueError as exc:
            return Verdict(mutant, "error", str(exc), 0.0)
        for model in mutant.models:  # 1. safety
            text, rc = _tlc(jar, work, model, f"{model}_safety.cfg", workers)
            run = parse_stdout(model, text, rc)
            counts[model] = (run.distinct, run.generated)
            kill = killed_by(text)
            if kill:
                return verdict("killed", f"{model}: {kill}")
            if not run.ok:
                return Verdict(mutant, "error", f"{model}: {run.result}", time.monotonic() - start, counts)
        # An edit of the fairness never changes the graph: only the liveness step can judge it.
        if "WF_" not in mutant.old and all(counts[m] == base.get(m) for m in mutant.models):
            where = ", ".join(f"{m} {counts[m][0]} states" for m in mutant.models)
            return verdict("survived", f"never fires: the same state graph ({where})")
        for w in WITNESSES:  # 2. witnesses on the mutant's models
            if w.model in mutant.models:
                wrun = run_witness(jar, work, w, None, workers=workers, quiet=True)
                if not wrun.found:
                    return verdict("killed", f"witness {w.name} no longer found ({wrun.result})")
        liveness = LIVENESS_MODELS + tuple(m for m in SMALL_LIVENESS_MODELS if m in mutant.models)
        for model in liveness:  # 3. the whole model, liveness included (the smallest models)
            text, rc = _tlc(jar, work, model, f"{model}.cfg", workers)
            kill = killed_by(text)
            if kill:
                return verdict("killed", f"{model} with FairSpec: {kill}")
            run = parse_stdout(model, text, rc)
            if not run.ok:
                return Verdict(mutant, "error", f"{model}: {run.result}", time.monotonic() - start, counts)
        where = ", ".join(f"{m} {counts[m][0]} states (spec: {base[m][0]})" for m in mutant.models)
        if "WF_" in mutant.old and all(counts[m] == base.get(m) for m in mutant.models):
            return verdict("survived", f"the same state graph ({where}) and no liveness violated")
        return verdict("survived", f"changes the graph ({where}) but violates nothing")


def table(verdicts: list[Verdict]) -> str:
    lines = [
        "| mutant | rule broken | models | verdict | how |",
        "| --- | --- | --- | --- | --- |",
    ]
    for v in verdicts:
        how = v.how.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| `{v.mutant.name}` | {v.mutant.rule} | {', '.join(v.mutant.models)} | {v.status} | {how} |")
    return "\n".join(lines) + "\n"


def write_doc(
    path: Path, verdicts: list[Verdict], total_s: float, partial: bool, pending: tuple[str, ...] = ()
) -> None:
    killed = sum(v.status == "killed" for v in verdicts)
    did = sum(v.status == "defence in depth" for v in verdicts)
    head = (
        "# Spec mutants\n\n"
        "`make spec-mutants` (`python -m tools.mirror.spec_mutants`): each named rule of "
        "`spec/LayoutProtocol.tla` broken by one text edit in a temporary copy of `spec/`, and TLC run on "
        "the copy: safety on the mutant's models (a violation kills; the same state counts as the spec "
        "mean the rule never fires there), then the witnesses of those models (one no longer found "
        "kills), then the whole model with `FairSpec` (a liveness violation kills). A survivor must be "
        "listed as defence in depth, with the test that covers the rule in code.\n\n"
        f"Last run{' (partial, --only)' if partial else ''}: {len(verdicts)} mutants, {killed} killed, "
        f"{did} defence in depth, {len(verdicts) - killed - did} other.\n\n"
    )
    tail = ""
    if pending:
        tail = (
            f"\nNot judged yet ({len(pending)}; the run was still going): "
            + ", ".join(f"`{n}`" for n in pending)
            + "\n"
        )
    path.write_text(head + table(verdicts) + tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec-dir", type=Path, default=Path("spec"))
    ap.add_argument("--only", default="", help="comma-separated mutant names")
    ap.add_argument("--doc", type=Path, default=None, help="write the table here (Markdown)")
    ap.add_argument("--workers", default="1", help="TLC's -workers (default 1)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants judged at once (each runs its own TLC)")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    known = {m.name: m for m in CATALOG}
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"spec-mutants: unknown mutant {', '.join(unknown)}; known: {', '.join(known)}")
        return 2
    mutants = [known[n] for n in names] if names else list(CATALOG)
    if shutil.which("java") is None:
        print("spec-mutants: Java is missing: TLC needs a Java 11+ runtime on PATH; no mutant was judged.")
        return 2
    jar, how = find_jar()
    if jar is None:
        print(f"spec-mutants: {how}\nspec-mutants: no mutant was judged ({len(mutants)} in the catalog).")
        return 2
    start = time.monotonic()
    base = baseline(jar, args.spec_dir, {m for mu in mutants for m in mu.models}, args.workers)
    print("spec-mutants: the spec's safety runs: " + ", ".join(f"{m} {d} distinct" for m, (d, _) in base.items()))
    with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = [pool.submit(judge, jar, args.spec_dir, mu, base, args.workers) for mu in mutants]
        verdicts = []
        for mu, fut in zip(mutants, futures, strict=True):
            v = fut.result()
            verdicts.append(v)
            print(f"{mu.name}: {v.status}: {v.how} ({v.seconds:.0f} s)", flush=True)
            if args.doc is not None:  # after each verdict: an interrupted run still leaves its table
                rest = tuple(m.name for m in mutants[len(verdicts) :])
                write_doc(args.doc, verdicts, time.monotonic() - start, bool(names), rest)
    total = time.monotonic() - start
    if args.doc is not None:
        write_doc(args.doc, verdicts, total, partial=bool(names))
    bad = [v.mutant.name for v in verdicts if not v.ok]
    print(f"spec-mutants: {len(verdicts) - len(bad)} of {len(verdicts)} killed or defence in depth, {total:.0f} s")
    if bad:
        print(f"spec-mutants: not accounted for: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
