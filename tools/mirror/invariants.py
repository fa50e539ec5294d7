"""The spec's invariants and action properties, in Python, over the spec's variables.

Why: the explorer must check the same properties TLC checks, on the mirror's states. Each
function is named after its TLA+ operator in spec/LayoutProtocol.tla and reads the spec's
variables (``tools.mirror.system.System.project`` values, through ``Vars``), not the
machines' internals, so the formulas can be read side by side with the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tools.mirror.system import VARIABLES, Model
from tools.mirror.values import Fn, ModelValue, Record

NONE = ModelValue("NONE")


class Vars:
    """The spec's variables of one state; engine-indexed functions become dicts by engine id."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        for name, v in zip(VARIABLES, values, strict=True):
            if isinstance(v, Fn):
                v = {k.name: x for k, x in v.items()}
            setattr(self, name, v)


def TypeOK(m: Model, s: Vars) -> bool:
    bits = {0, 1}
    ranks = range(m.num_ranks)
    ok = all(s.dphase[r] in ("no_record", "clean", "pending", "dirty", "repairing") for r in ranks)
    ok &= all(0 <= s.dver[r] <= m.max_moves for r in ranks)
    ok &= all(len(s.dmap[r]) == m.num_layers and set(s.dmap[r]) <= bits for r in ranks)
    ok &= all(s.dpend[r] == NONE or isinstance(s.dpend[r], Record) for r in ranks)
    ok &= all({e.name for e in s.datt[r]} <= set(m.newer) for r in ranks)
    ok &= all(set(s.truth[r]) <= bits for r in ranks)
    ok &= all(s.ephase[e] in ("start", "load", "run", "parked", "failed", "dead") for e in m.engines)
    ok &= all(s.dpark[r] <= s.datt[r] and {e.name for e in s.dpark[r]} <= m.standbys for r in ranks)
    ok &= all(0 <= s.ever[e] <= m.max_moves for e in m.engines)
    ok &= all(s.eserv[e] <= set(m.ranks) for e in m.engines)
    ok &= 0 <= s.moves <= m.max_moves
    return bool(ok)


def _moving(s: Vars, e: str) -> bool:
    return s.reb[e]["step"] in ("move", "commit")


def SafeRouting(m: Model, s: Vars) -> bool:
    return all(
        s.eroute[e] == s.truth[r - 1]
        for e in m.engines
        for r in m.ranks
        if r in s.eserv[e] and not _moving(s, e) and s.ephase[e] != "parked"
    )


def CleanRecordIsTruth(m: Model, s: Vars) -> bool:
    return all(s.dmap[r] == s.truth[r] for r in range(m.num_ranks) if s.dphase[r] == "clean")


def OneMover(m: Model, s: Vars) -> bool:
    for r in m.ranks:
        if s.dphase[r - 1] != "pending":
            continue
        pend = s.dpend[r - 1]
        if pend == NONE:
            return False
        parked = {p.name for p in s.dpark[r - 1]}
        if any(r in s.eserv[e] and e not in parked for e in m.engines if e != pend["mover"].name):
            return False
    return True


def AgreedVersions(m: Model, s: Vars) -> bool:
    for e in m.newer:
        if not s.eserv[e] or s.ephase[e] == "parked":
            continue
        recs = [f for f in s.efind[e] if f["found"] == "record"]
        if any(f["fver"] != recs[0]["fver"] or f["fmap"] != recs[0]["fmap"] for f in recs):
            return False
    return True


def _gone(s: Vars, e: str) -> bool:
    return s.ephase[e] in ("failed", "dead")


def PendingHasMover(m: Model, s: Vars) -> bool:
    for r in m.ranks:
        if s.dphase[r - 1] != "pending":
            continue
        pend = s.dpend[r - 1]
        mover = pend["mover"].name
        if _gone(s, mover):
            continue
        reb = s.reb[mover]
        same_chunk = reb["step"] != "idle" and reb["chunk"] == pend["layers"]
        if same_chunk and reb["replies"][r - 1] == "ok":
            continue
        if same_chunk and reb["step"] == "commit" and reb["replies"][r - 1] == "commit_refused":
            continue
        if s.ever[mover] == pend["base"] + 1 and (reb["owed"] == "bad" or not s.eshare[mover]):
            continue
        if same_chunk and reb["step"] in ("begin", "abort") and reb["replies"][r - 1] == "refused":
            continue  # the begin's reply was lost, before the all-gather stops the rebalance
        if s.ever[mover] == pend["base"] and reb["step"] == "idle" and not s.eshare[mover]:
            continue
        return False
    return True


def LoadsOnCleanFindings(m: Model, s: Vars) -> bool:
    return all(
        f["found"] in ("record", "no_record") for e in m.newer if s.ephase[e] in ("load", "run") for f in s.efind[e]
    )


def SharesOnlyAdopted(m: Model, s: Vars) -> bool:
    return all(f["found"] == "record" for e in m.newer if s.eshare[e] for f in s.efind[e])


_PARKED_CLAIMS = ("parked", "notified", "taken", "refused")


def OneRole(m: Model, s: Vars) -> bool:
    for e in m.engines:
        if _gone(s, e):
            continue
        claims = s.eclaim[e]
        for r in m.ranks:
            parked = ModelValue(e) in s.dpark[r - 1]
            if claims[r - 1] in _PARKED_CLAIMS and not parked:
                return False
            if claims[r - 1] in ("none", "granted") and parked:
                return False
        if s.ephase[e] != "parked" and any(c not in ("none", "granted") for c in claims):
            return False
        if s.ephase[e] == "run" and not (all(c == "none" for c in claims) or all(c == "granted" for c in claims)):
            return False
    return True


def OnePromoted(m: Model, s: Vars) -> bool:
    live = [e for e in m.standbys if not _gone(s, e)]
    return all(sum(s.eclaim[e][r - 1] == "granted" for e in live) <= 1 for r in m.ranks)


def RepairingServesNothing(m: Model, s: Vars) -> bool:
    return all(
        ModelValue(e) in s.dpark[r - 1]
        for r in m.ranks
        if s.dphase[r - 1] == "repairing"
        for e in m.engines
        if r in s.eserv[e]
    )


def RebalancesOnTheRecords(m: Model, s: Vars) -> bool:
    for e in m.newer:
        primary = e not in m.standbys or all(c == "granted" for c in s.eclaim[e])
        reb = s.reb[e]
        between_chunks = s.ephase[e] == "run" and s.eshare[e] and primary and reb["step"] == "idle"
        if (
            between_chunks
            and reb["owed"] != "bad"
            and any(s.dver[r] != s.ever[e] or s.dmap[r] != s.eroute[e] for r in range(m.num_ranks))
        ):
            return False
    return True


def OneMapPerVersion(m: Model, s: Vars) -> bool:
    kept = [r for r in range(m.num_ranks) if s.dphase[r] != "no_record"]
    return all(s.dmap[r] == s.dmap[q] for r in kept for q in kept if s.dver[r] == s.dver[q])


def CopiesRecorded(m: Model, s: Vars) -> bool:
    for r in range(m.num_ranks):
        c = s.dcopy[r]
        if c == NONE:
            continue
        if s.dphase[r] == "no_record" or c["cver"] > s.dver[r]:
            return False
        for q in range(m.num_ranks):
            if s.dphase[q] != "no_record" and s.dver[q] == c["cver"] and s.dmap[q] != c["cmap"]:
                return False
            d = s.dcopy[q]
            if d != NONE and d["cver"] == c["cver"] and d["cmap"] != c["cmap"]:
                return False
    return True


INVARIANTS: dict[str, Callable[[Model, Vars], bool]] = {
    "TypeOK": TypeOK,
    "SafeRouting": SafeRouting,
    "CleanRecordIsTruth": CleanRecordIsTruth,
    "OneMover": OneMover,
    "AgreedVersions": AgreedVersions,
    "PendingHasMover": PendingHasMover,
    "LoadsOnCleanFindings": LoadsOnCleanFindings,
    "SharesOnlyAdopted": SharesOnlyAdopted,
    "OneRole": OneRole,
    "OnePromoted": OnePromoted,
    "RebalancesOnTheRecords": RebalancesOnTheRecords,
    "RepairingServesNothing": RepairingServesNothing,
    "OneMapPerVersion": OneMapPerVersion,
    "CopiesRecorded": CopiesRecorded,
}


# What the action properties read of a state: (dphase, dver, ever, gone engines, unparked attachments,
# eserv, movers, parked attachments, each engine's eclaim, each engine's begin replies, dmap, dnf,
# every attachment, each engine's reb, eshare and ephase)
StepView = tuple[Any, ...]


def DirtySticky(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return all(
        t[0][r - 1] == "dirty" or action in (f"Restart({r})", f"RepairAgain({r})", f"Lose({r})")
        for r in m.ranks
        if s[0][r - 1] == "dirty"
    )


def VersionMonotonic(m: Model, s: StepView, t: StepView, action: str) -> bool:
    daemons = all(t[1][r - 1] >= s[1][r - 1] or action in (f"Restart({r})", f"Lose({r})") for r in m.ranks)
    return daemons and all(gone or b >= a for a, b, gone in zip(s[2], t[2], t[3], strict=True))


def BeginsAlone(m: Model, s: StepView, t: StepView, action: str) -> bool:
    for r in m.ranks:
        if s[0][r - 1] != "pending" and t[0][r - 1] == "pending":
            mover = t[6][r - 1]
            if s[4][r - 1] != frozenset({mover}):
                return False
            if any(r in serv and e != mover and e not in s[7][r - 1] for e, serv in zip(m.engines, s[5], strict=True)):
                return False
    return True


def ClaimsAlone(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[8][i][r - 1] != "granted" and t[8][i][r - 1] == "granted" and (s[4][r - 1] or s[0][r - 1] != "clean")
        for i in range(len(m.engines))
        for r in m.ranks
    )


def BusyOnlyByUnparked(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[9][i][r - 1] == "none" and t[9][i][r - 1] == "busy" and s[0][r - 1] != "pending" and not (s[4][r - 1] - {e})
        for i, e in enumerate(m.engines)
        for r in m.ranks
    )


def ClaimWaitsOutRepair(m: Model, s: StepView, t: StepView, action: str) -> bool:
    for i in range(len(m.engines)):
        for r in m.ranks:
            before, after = s[8][i][r - 1], t[8][i][r - 1]
            if before != "refused" and after == "refused" and s[0][r - 1] != "dirty":
                return False
            if before == "parked" and after == "notified" and t[0][r - 1] == "repairing":
                return False
    return True


def NoticeOnlyWhenFree(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[8][i][r - 1] != "notified" and t[8][i][r - 1] == "notified" and (t[4][r - 1] or t[0][r - 1] == "repairing")
        for i in range(len(m.engines))
        for r in m.ranks
    )


def RejoinsOnlyBehind(m: Model, s: StepView, t: StepView, action: str) -> bool:
    for r in m.ranks:
        if not (s[0][r - 1] == "clean" and t[0][r - 1] == "repairing"):
            continue
        target = (t[1][r - 1], t[10][r - 1])
        others = [q for q in m.ranks if q != r]
        if (
            s[1][r - 1] >= target[0]
            or len(s[12][r - 1]) > 1
            or s[11][r - 1]
            or any(r in serv for serv in s[5])
            or target not in [(s[1][q - 1], s[10][q - 1]) for q in others]
            or any(s[0][q - 1] == "no_record" for q in others)
            or any((s[1][q - 1], s[10][q - 1]) != target and s[1][q - 1] >= target[0] for q in others)
        ):
            return False
    return True


def FailedCheckStops(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[13][i]["owed"] == "bad"
        and t[13][i]["owed"] == "none"
        and t[15][i] == "run"
        and (t[14][i] or t[13][i]["step"] not in ("idle", "abort"))
        for i in range(len(m.engines))
    )


def CheckFailsOnlyOnFault(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[13][i]["owed"] != "bad" and t[13][i]["owed"] == "bad" and "commit_refused" not in s[13][i]["replies"]
        for i in range(len(m.engines))
    )


def ClaimsFollowNotices(m: Model, s: StepView, t: StepView, action: str) -> bool:
    return not any(
        s[8][i][r] != t[8][i][r] and t[8][i][r] in ("granted", "taken", "refused") and s[8][i][r] != "notified"
        for i in range(len(m.engines))
        for r in range(m.num_ranks)
    )


ACTION_PROPERTIES: dict[str, Callable[[Model, StepView, StepView, str], bool]] = {
    "DirtySticky": DirtySticky,
    "VersionMonotonic": VersionMonotonic,
    "BeginsAlone": BeginsAlone,
    "ClaimsAlone": ClaimsAlone,
    "BusyOnlyByUnparked": BusyOnlyByUnparked,
    "ClaimWaitsOutRepair": ClaimWaitsOutRepair,
    "NoticeOnlyWhenFree": NoticeOnlyWhenFree,
    "RejoinsOnlyBehind": RejoinsOnlyBehind,
    "FailedCheckStops": FailedCheckStops,
    "CheckFailsOnlyOnFault": CheckFailsOnlyOnFault,
    "ClaimsFollowNotices": ClaimsFollowNotices,
}

# Liveness is TLC's to check (the explorer builds no fair-cycle search); named for the report.
LIVENESS = (
    "DeadMoverEndsDirty",
    "WaitEnds",
    "StartsAlone",
    "FindingsAgreedServes",
    "PendingEnds",
    "LiveMoveFreesDaemon",
    "CheckEnds",
    "RepairEnds",
    "TornMoveRepaired",
    "StandbyTakesOver",
    "PartialGrantEnds",
    "ParkedStandbysDoNotBlock",
    "RejoinServes",
    "ChunkCommits",
    "FullRestartServesNewestCopy",
)
