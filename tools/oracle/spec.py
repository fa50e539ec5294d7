"""spec/LayoutProtocol.tla in Python, line by line: Init, every action of Next, every helper operator.

Why: the mirror (``tools.mirror.system``) takes every decision from ``layout_sm``, the code under
test. This transcription takes none from it: each function below is one TLA+ operator, conjunct by
conjunct, over the spec's own 18 variables, and its docstring names the operator. Exploring it
breadth first gives the graph TLC dumps (``dump``), so ``tools.mirror.compare`` can hold the
mirror's graph against the spec's wherever the tests run, and ``tools.oracle.traces`` searches it
for a behaviour that takes a run's logged steps.

The transcription follows the spec's order (startup, rebalance, standbys, failures, rejoin); to port
a change of the spec, change the operator of the same name.

State (``State``): the variables in declaration order. A function over ``Ranks`` is a tuple indexed
by ``r - 1``, one over ``Layers`` by ``l - 1`` (the layer is ``ll`` in the code: ruff refuses ``l``),
one over ``Engines`` by the engine's position in the model's ``Engines`` (``Spec.ix``). Engines are
their names (the model values) wherever the spec holds them as values (``datt``, ``dpark``, a pending
move's mover); ranks and layers are the spec's, from 1. ``NONE`` is ``None``. Records are named
tuples with the spec's field names.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tools.mirror.dot import escape, fingerprint
from tools.mirror.model import Model, label, load_model, render_projection
from tools.mirror.values import ModelValue, Record, function_value, tlc_intern_order

Map = tuple[int, ...]  # [Layers -> {0, 1}]: each layer's row, one of the two permutations


class Finding(NamedTuple):
    """An element of ``Findings``."""

    found: str
    fver: int
    fmap: Map


class Pend(NamedTuple):
    """An element of ``PendingMoves`` (``dpend[r]`` when not ``NONE``)."""

    mover: str
    layers: frozenset[int]
    base: int


class Reb(NamedTuple):
    """An element of ``Rebalances``."""

    step: str
    chunk: frozenset[int]
    replies: tuple[str, ...]
    owed: str


class Copy(NamedTuple):
    """An element of ``[cver : 0..MaxMoves, cmap : [Layers -> {0, 1}]]`` (``dcopy[r]`` when not ``NONE``)."""

    cver: int
    cmap: Map


class State(NamedTuple):
    """The spec's ``vars``, in declaration order."""

    dphase: tuple[str, ...]
    dver: tuple[int, ...]
    dmap: tuple[Map, ...]
    dpend: tuple[Pend | None, ...]
    datt: tuple[frozenset[str], ...]
    dnf: tuple[bool, ...]
    truth: tuple[Map, ...]
    ephase: tuple[str, ...]
    efind: tuple[tuple[Finding, ...], ...]
    eroute: tuple[Map, ...]
    ever: tuple[int, ...]
    eserv: tuple[frozenset[int], ...]
    eshare: tuple[bool, ...]
    reb: tuple[Reb, ...]
    moves: int
    dpark: tuple[frozenset[str], ...]
    eclaim: tuple[tuple[str, ...], ...]
    dcopy: tuple[Copy | None, ...]


def ex(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    """``[t EXCEPT ![i] = v]`` on a tuple (``i`` is the Python index)."""
    return (*t[:i], v, *t[i + 1 :])


class Spec:
    """The spec's operators over one model's constants."""

    def __init__(self, m: Model, engines_are_strings: bool = False) -> None:
        """``engines_are_strings``: the engines are TLA+ strings, not model values (a trace check's
        generated module names them so); only the printing of states differs."""
        self.m = m
        self.engine_value: Callable[[str], Any] = str if engines_are_strings else ModelValue
        self.Engines: tuple[str, ...] = m.engines
        self.ix = {e: i for i, e in enumerate(m.engines)}
        self.Ranks = range(1, m.num_ranks + 1)
        self.Layers = range(1, m.num_layers + 1)
        self.Older = m.older
        self.Newer = frozenset(e for e in m.engines if e not in m.older)
        self.Standbys = m.standbys
        self.Chunks = tuple(sorted(m.chunks, key=lambda c: (len(c), sorted(c))))
        self.CanRepair = m.repairs or m.operator_repairs
        # InitialMap, NoFinding, IdleReb, NoClaims
        self.InitialMap: Map = (0,) * m.num_layers
        self.NoFinding = Finding("nothing", 0, self.InitialMap)
        self.IdleReb = Reb("idle", frozenset(), ("none",) * m.num_ranks, "none")
        self.NoClaims: tuple[str, ...] = ("none",) * m.num_ranks
        self.LayersSet = frozenset(self.Layers)
        self.ASSUME()

    def ASSUME(self) -> None:
        """The spec's ``ASSUME``: TLC refuses a model that breaks it, so does the oracle."""
        m = self.m
        ok = (
            m.num_ranks >= 1
            and m.num_layers >= 1
            and self.Older <= set(self.Engines)
            and m.may_lack_record <= set(self.Ranks)
            and all(c and c <= self.LayersSet for c in self.Chunks)
            and m.max_moves >= 0
            and self.Standbys <= self.Newer
            and (not m.rejoins or self.CanRepair)
            and (not m.durable or m.rejoins)
        )
        if not ok:
            raise ValueError(f"{m.name}: the constants break the spec's ASSUME")

    # -- helpers (the spec's operators before Init) -------------------------------------------

    def Gone(self, s: State, e: str) -> bool:
        """``Gone(e)``."""
        return s.ephase[self.ix[e]] in ("failed", "dead")

    def Forget(self, s: State, e: str, phase: str) -> dict[str, Any]:
        """``Forget(e, phase)``: the engine variables it sets (the caller keeps the rest)."""
        i = self.ix[e]
        return {
            "ephase": ex(s.ephase, i, phase),
            "efind": ex(s.efind, i, (self.NoFinding,) * len(self.Ranks)),
            "eroute": ex(s.eroute, i, self.InitialMap),
            "ever": ex(s.ever, i, 0),
            "eserv": ex(s.eserv, i, frozenset()),
            "eshare": ex(s.eshare, i, False),
            "reb": ex(s.reb, i, self.IdleReb),
            "eclaim": ex(s.eclaim, i, self.NoClaims),
        }

    def Target(self, s: State, e: str) -> Map:
        """``Target(e)``."""
        i = self.ix[e]
        chunk, route = s.reb[i].chunk, s.eroute[i]
        return tuple(1 - route[ll - 1] if ll in chunk else route[ll - 1] for ll in self.Layers)

    def Snapshot(self, s: State, r: int) -> Finding:
        """``Snapshot(r)``."""
        if s.dphase[r - 1] == "no_record":
            return Finding("no_record", 0, self.InitialMap)
        if s.dphase[r - 1] == "dirty":
            return Finding("dirty", 0, self.InitialMap)
        return Finding("record", s.dver[r - 1], s.dmap[r - 1])

    def ForeignPending(self, s: State, e: str, r: int) -> bool:
        """``ForeignPending(e, r)``."""
        p = s.dpend[r - 1]
        return s.dphase[r - 1] == "pending" and p is not None and p.mover != e

    def MustWait(self, s: State, e: str, r: int) -> bool:
        """``MustWait(e, r)``."""
        return self.ForeignPending(s, e, r) or s.dphase[r - 1] == "repairing"

    def _set_efind(self, s: State, e: str, r: int, f: Finding) -> tuple[tuple[Finding, ...], ...]:
        """``[efind EXCEPT ![e][r] = f]``."""
        i = self.ix[e]
        return ex(s.efind, i, ex(s.efind[i], r - 1, f))

    # -- Init ---------------------------------------------------------------------------------

    def Init(self) -> list[State]:
        """``Init``: one state per ``S \\in SUBSET MayLackRecord``."""
        lack = sorted(self.m.may_lack_record)
        R, E = len(self.Ranks), len(self.Engines)
        out = []
        for mask in range(1 << len(lack)):
            S = {lack[k] for k in range(len(lack)) if mask >> k & 1}
            out.append(
                State(
                    dphase=tuple("no_record" if r in S else "clean" for r in self.Ranks),
                    dver=(0,) * R,
                    dmap=(self.InitialMap,) * R,
                    dpend=(None,) * R,
                    datt=(frozenset(),) * R,
                    dnf=(False,) * R,
                    truth=(self.InitialMap,) * R,
                    ephase=tuple("load" if e in self.Older else "start" for e in self.Engines),
                    efind=((self.NoFinding,) * R,) * E,
                    eroute=(self.InitialMap,) * E,
                    ever=(0,) * E,
                    eserv=(frozenset(),) * E,
                    eshare=(False,) * E,
                    reb=(self.IdleReb,) * E,
                    moves=0,
                    dpark=(frozenset(),) * R,
                    eclaim=(self.NoClaims,) * E,
                    dcopy=(None,) * R,
                )
            )
        return out

    # -- startup --------------------------------------------------------------------------------

    def Attach(self, s: State, e: str, r: int) -> State | None:
        """``Attach(e, r)``."""
        i = self.ix[e]
        if not (
            e in self.Newer
            and s.ephase[i] == "start"
            and s.efind[i][r - 1].found == "nothing"
            and all(s.efind[i][q - 1].found != "nothing" for q in range(1, r))
        ):
            return None
        snap = self.Snapshot(s, r)
        return s._replace(
            datt=ex(s.datt, r - 1, s.datt[r - 1] | {e}),
            efind=self._set_efind(s, e, r, snap._replace(found="wait") if self.MustWait(s, e, r) else snap),
        )

    def Poll(self, s: State, e: str, r: int) -> State | None:
        """``Poll(e, r)``."""
        i = self.ix[e]
        if not (s.ephase[i] == "start" and s.efind[i][r - 1].found == "wait" and not self.MustWait(s, e, r)):
            return None
        return s._replace(efind=self._set_efind(s, e, r, self.Snapshot(s, r)))

    def Timeout(self, s: State, e: str, r: int) -> State | None:
        """``Timeout(e, r)``."""
        i = self.ix[e]
        if not (s.ephase[i] == "start" and s.efind[i][r - 1].found == "wait"):
            return None
        return s._replace(efind=self._set_efind(s, e, r, s.efind[i][r - 1]._replace(found="timeout")))

    def Found(self, s: State, e: str) -> frozenset[Finding]:
        """``Found(e)``."""
        return frozenset(s.efind[self.ix[e]])

    def Recorded(self, s: State, e: str) -> frozenset[Finding]:
        """``Recorded(e)``."""
        return frozenset(f for f in self.Found(s, e) if f.found == "record")

    def Moved(self, f: Finding) -> bool:
        """``Moved(f)``."""
        return f.fver != 0 or f.fmap != self.InitialMap

    def StartupFails(self, s: State, e: str) -> bool:
        """``StartupFails(e)``."""
        found, recorded = self.Found(s, e), self.Recorded(s, e)
        return (
            any(f.found in ("dirty", "timeout", "refused") for f in found)
            or (recorded != found and any(self.Moved(f) for f in recorded))
            or any(f.fver != g.fver or f.fmap != g.fmap for f in recorded for g in recorded)
        )

    def Adopts(self, s: State, e: str) -> bool:
        """``Adopts(e)``."""
        return self.Recorded(s, e) == self.Found(s, e)

    def NewestVersion(self, s: State, e: str) -> int:
        """``NewestVersion(e)``: the greatest version found."""
        return max(f.fver for f in self.Found(s, e))

    def Behind(self, s: State, e: str, f: Finding) -> bool:
        """``Behind(e, f)``."""
        return f.found == "record" and f.fver < self.NewestVersion(s, e)

    def RejoinWanted(self, s: State, e: str) -> bool:
        """``RejoinWanted(e)``."""
        found = self.Found(s, e)
        newest = self.NewestVersion(s, e)
        return (
            self.m.rejoins
            and self.Recorded(s, e) == found
            and any(self.Behind(s, e, f) for f in found)
            and all(f.fmap == g.fmap for f in found for g in found if f.fver == newest and g.fver == newest)
        )

    def RejoinTarget(self, s: State, e: str) -> Finding:
        """``RejoinTarget(e)``: ``CHOOSE`` over a set with one finding at the newest version (RejoinWanted
        holds)."""
        newest = self.NewestVersion(s, e)
        return min(f for f in self.Found(s, e) if f.fver == newest)

    def Agree(self, s: State, e: str) -> State | None:
        """``Agree(e)``."""
        i = self.ix[e]
        if not (s.ephase[i] == "start" and all(f.found not in ("nothing", "wait", "rejoin") for f in s.efind[i])):
            return None
        if self.RejoinWanted(s, e):
            t = self.RejoinTarget(s, e)._replace(found="rejoin")
            return s._replace(efind=ex(s.efind, i, tuple(t if self.Behind(s, e, f) else f for f in s.efind[i])))
        if self.StartupFails(s, e):
            return s._replace(**self.Forget(s, e, "failed"))
        f = s.efind[i][0]
        adopts = self.Adopts(s, e)
        return s._replace(
            ephase=ex(s.ephase, i, "load"),
            eroute=ex(s.eroute, i, f.fmap if adopts else self.InitialMap),
            ever=ex(s.ever, i, f.fver if adopts else 0),
            eshare=ex(s.eshare, i, adopts),
        )

    def FetchServes(self, s: State, e: str, r: int) -> bool:
        """``FetchServes(e, r)``."""
        return s.dphase[r - 1] == "no_record" or (
            s.dphase[r - 1] == "clean"
            and (s.dver[r - 1] == 0 if e in self.Older else s.eroute[self.ix[e]] == s.dmap[r - 1])
        )

    def FetchNonFollowing(self, s: State, e: str, r: int) -> bool:
        """``FetchNonFollowing(e, r)``."""
        return s.dphase[r - 1] == "clean" and (e in self.Older or e not in s.datt[r - 1])

    def Fetch(self, s: State, e: str, r: int) -> State | None:
        """``Fetch(e, r)``."""
        i = self.ix[e]
        if not (s.ephase[i] == "load" and r not in s.eserv[i] and all(q in s.eserv[i] for q in range(1, r))):
            return None
        if self.FetchServes(s, e, r):
            serv = s.eserv[i] | {r}
            return s._replace(
                eserv=ex(s.eserv, i, serv),
                ephase=ex(s.ephase, i, "run" if serv == frozenset(self.Ranks) else "load"),
                dnf=ex(s.dnf, r - 1, s.dnf[r - 1] or self.FetchNonFollowing(s, e, r)),
            )
        return s._replace(**self.Forget(s, e, "failed"))

    # -- rebalance --------------------------------------------------------------------------------

    def Primary(self, s: State, e: str) -> bool:
        """``Primary(e)``."""
        return e not in self.Standbys or all(c == "granted" for c in s.eclaim[self.ix[e]])

    def Unparked(self, s: State, r: int) -> frozenset[str]:
        """``Unparked(r)``."""
        return s.datt[r - 1] - s.dpark[r - 1]

    def BeginChunk(self, s: State, e: str, c: frozenset[int]) -> State | None:
        """``BeginChunk(e, c)``."""
        i = self.ix[e]
        if not (
            s.ephase[i] == "run"
            and self.Primary(s, e)
            and s.eshare[i]
            and s.reb[i].step == "idle"
            and s.moves < self.m.max_moves
            and c in self.Chunks
        ):
            return None
        return s._replace(reb=ex(s.reb, i, s.reb[i]._replace(step="begin", chunk=c)), moves=s.moves + 1)

    def BeginReply(self, s: State, e: str, r: int) -> str:
        """``BeginReply(e, r)``: the CASE's arms in order."""
        ph, p = s.dphase[r - 1], s.dpend[r - 1]
        if e not in s.datt[r - 1]:
            return "refused"
        if ph == "pending" and p is not None and p.mover == e:
            return "refused"
        if ph in ("no_record", "dirty", "repairing"):
            return "refused"
        if s.dnf[r - 1]:
            return "refused"
        if s.ever[self.ix[e]] != s.dver[r - 1]:
            return "refused"
        if ph == "pending":
            return "busy"
        if self.Unparked(s, r) - {e}:
            return "busy"
        return "ok"

    def BeginDue(self, s: State, e: str, r: int) -> bool:
        """``BeginDue(e, r)``."""
        i = self.ix[e]
        b = s.reb[i]
        return (
            s.ephase[i] == "run"
            and b.step == "begin"
            and b.replies[r - 1] == "none"
            and all(b.replies[q - 1] != "none" for q in range(1, r))
        )

    def _begin(self, s: State, e: str, r: int, word: str, takes: bool) -> State:
        """Rank ``r``'s reply becomes ``word``; where ``takes``, daemon r takes the move (``TakeBegin``)."""
        i = self.ix[e]
        b = s.reb[i]
        t = s._replace(reb=ex(s.reb, i, b._replace(replies=ex(b.replies, r - 1, word))))
        if takes:
            t = t._replace(
                dphase=ex(s.dphase, r - 1, "pending"),
                dpend=ex(s.dpend, r - 1, Pend(e, b.chunk, s.dver[r - 1])),
            )
        return t

    def Begin(self, s: State, e: str, r: int) -> State | None:
        """``Begin(e, r)``."""
        if not self.BeginDue(s, e, r):
            return None
        reply = self.BeginReply(s, e, r)
        return self._begin(s, e, r, reply, reply == "ok")

    def BeginUnanswered(self, s: State, e: str, r: int) -> State | None:
        """``BeginUnanswered(e, r)``."""
        if not (self.m.reply_faults and self.BeginDue(s, e, r)):
            return None
        return self._begin(s, e, r, "refused", self.BeginReply(s, e, r) == "ok")

    def BeginUnreached(self, s: State, e: str, r: int) -> State | None:
        """``BeginUnreached(e, r)``."""
        if not (self.m.reply_faults and self.BeginDue(s, e, r) and self.BeginReply(s, e, r) == "ok"):
            return None
        return self._begin(s, e, r, "refused", False)

    def Decide(self, s: State, e: str) -> State | None:
        """``Decide(e)``."""
        i = self.ix[e]
        b = s.reb[i]
        if not (s.ephase[i] == "run" and b.step == "begin" and all(w != "none" for w in b.replies)):
            return None
        replies = frozenset(b.replies)
        anyOk = "ok" in replies
        checked = b.owed != "bad"
        if replies == {"ok"} and checked:
            nb = b._replace(step="move", owed="none")
        elif anyOk:
            nb = b._replace(step="abort", owed="none")
        else:
            nb = self.IdleReb
        return s._replace(reb=ex(s.reb, i, nb), eshare=ex(s.eshare, i, "refused" not in replies and checked))

    def Abort(self, s: State, e: str, r: int) -> State | None:
        """``Abort(e, r)``."""
        i = self.ix[e]
        b = s.reb[i]
        if not (
            s.ephase[i] == "run"
            and b.step == "abort"
            and b.replies[r - 1] == "ok"
            and all(b.replies[q - 1] != "ok" for q in range(1, r))
        ):
            return None
        if all(b.replies[q - 1] != "ok" for q in self.Ranks if q != r):
            nb = self.IdleReb
        else:
            nb = b._replace(replies=ex(b.replies, r - 1, "aborted"))
        return s._replace(
            dphase=ex(s.dphase, r - 1, "clean"),
            dpend=ex(s.dpend, r - 1, None),
            reb=ex(s.reb, i, nb),
        )

    def MoveLayer(self, s: State, e: str, r: int, ll: int) -> State | None:
        """``MoveLayer(e, r, l)``."""
        i = self.ix[e]
        b = s.reb[i]
        if not (s.ephase[i] == "run" and b.step == "move" and ll in b.chunk):
            return None
        target, truth = self.Target(s, e), s.truth[r - 1]
        if truth[ll - 1] == target[ll - 1]:
            return None
        if not all(truth[k - 1] == target[k - 1] for k in b.chunk if k < ll):
            return None
        return s._replace(truth=ex(s.truth, r - 1, ex(truth, ll - 1, target[ll - 1])))

    def MovedEverywhere(self, s: State, e: str) -> bool:
        """``MovedEverywhere(e)``."""
        target = self.Target(s, e)
        chunk = s.reb[self.ix[e]].chunk
        return all(s.truth[r - 1][ll - 1] == target[ll - 1] for r in self.Ranks for ll in chunk)

    def CommitOk(self, s: State, e: str, r: int) -> bool:
        """``CommitOk(e, r)``."""
        p = s.dpend[r - 1]
        return (
            e in s.datt[r - 1]
            and s.dphase[r - 1] == "pending"
            and p is not None
            and p.mover == e
            and p.layers == s.reb[self.ix[e]].chunk
        )

    def CommitReady(self, s: State, e: str, r: int) -> bool:
        """``CommitReady(e, r)``."""
        i = self.ix[e]
        b = s.reb[i]
        return (
            s.ephase[i] == "run"
            and b.step in ("move", "commit")
            and self.MovedEverywhere(s, e)
            and b.replies[r - 1] == "ok"
            and all(b.replies[q - 1] != "ok" for q in range(1, r))
        )

    def _answered(self, s: State, e: str, r: int, word: str) -> tuple[Reb, ...]:
        """``reb' = [reb EXCEPT ![e].step = "commit", ![e].replies[r] = word]``."""
        i = self.ix[e]
        b = s.reb[i]
        return ex(s.reb, i, b._replace(step="commit", replies=ex(b.replies, r - 1, word)))

    def _recorded(self, s: State, e: str, r: int) -> dict[str, Any]:
        """The daemon records the move: the next version, the engine's whole map."""
        return {
            "dphase": ex(s.dphase, r - 1, "clean"),
            "dver": ex(s.dver, r - 1, s.dver[r - 1] + 1),
            "dmap": ex(s.dmap, r - 1, self.Target(s, e)),
            "dpend": ex(s.dpend, r - 1, None),
        }

    def Commit(self, s: State, e: str, r: int) -> State | None:
        """``Commit(e, r)``."""
        if not self.CommitReady(s, e, r):
            return None
        if self.CommitOk(s, e, r):
            return s._replace(**self._recorded(s, e, r), reb=self._answered(s, e, r, "committed"))
        return s._replace(reb=self._answered(s, e, r, "commit_refused"))

    def CommitRefused(self, s: State, e: str, r: int) -> State | None:
        """``CommitRefused(e, r)``."""
        if not (self.m.reply_faults and self.CommitReady(s, e, r) and self.CommitOk(s, e, r)):
            return None
        return s._replace(reb=self._answered(s, e, r, "commit_refused"))

    def CommitUnanswered(self, s: State, e: str, r: int) -> State | None:
        """``CommitUnanswered(e, r)``."""
        if not (self.m.reply_faults and self.CommitReady(s, e, r) and self.CommitOk(s, e, r)):
            return None
        return s._replace(**self._recorded(s, e, r), reb=self._answered(s, e, r, "commit_refused"))

    def Committed(self, s: State, e: str) -> State | None:
        """``Committed(e)``."""
        i = self.ix[e]
        b = s.reb[i]
        if not (
            s.ephase[i] == "run" and b.step == "commit" and all(w in ("committed", "commit_refused") for w in b.replies)
        ):
            return None
        target = self.Target(s, e)
        good = all(w == "committed" for w in b.replies) and all(
            s.dver[r - 1] == s.ever[i] + 1 and s.dmap[r - 1] == target for r in self.Ranks
        )
        return s._replace(
            reb=ex(s.reb, i, self.IdleReb._replace(owed="good" if good else "bad")),
            eroute=ex(s.eroute, i, target),
            ever=ex(s.ever, i, s.ever[i] + 1),
        )

    def Verify(self, s: State, e: str) -> State | None:
        """``Verify(e)``."""
        i = self.ix[e]
        b = s.reb[i]
        if not (s.ephase[i] == "run" and b.step == "idle" and b.owed != "none"):
            return None
        return s._replace(eshare=ex(s.eshare, i, b.owed == "good"), reb=ex(s.reb, i, b._replace(owed="none")))

    # -- warm standbys ------------------------------------------------------------------------------

    def Notify(
        self, c: tuple[tuple[str, ...], ...], r: int, att: frozenset[str], park: frozenset[str], phase: str
    ) -> tuple[tuple[str, ...], ...]:
        """``Notify(c, r, att, park, phase)``."""
        free = not (att - park) and phase != "repairing"
        return tuple(
            ex(c[i], r - 1, "notified") if f in park and c[i][r - 1] == "parked" and free else c[i]
            for i, f in enumerate(self.Engines)
        )

    def Park(self, s: State, e: str, r: int) -> State | None:
        """``Park(e, r)``."""
        i = self.ix[e]
        if not (
            e in self.Standbys
            and s.ephase[i] in ("run", "parked")
            and s.eclaim[i][r - 1] in ("none", "release")
            and all(s.eclaim[i][q - 1] not in ("none", "release") for q in range(1, r))
        ):
            return None
        dpark = ex(s.dpark, r - 1, s.dpark[r - 1] | {e})
        claims = ex(s.eclaim, i, ex(s.eclaim[i], r - 1, "parked"))
        return s._replace(
            dpark=dpark,
            ephase=ex(s.ephase, i, "parked"),
            eclaim=self.Notify(claims, r, s.datt[r - 1], dpark[r - 1], s.dphase[r - 1]),
        )

    def ClaimReply(self, s: State, e: str, r: int) -> str:
        """``ClaimReply(e, r)``: the CASE's arms in order."""
        if self.Unparked(s, r):
            return "taken"
        if s.dphase[r - 1] == "repairing":
            return "taken"
        if s.dphase[r - 1] != "clean":
            return "refused"
        return "granted"

    def Claim(self, s: State, e: str, r: int) -> State | None:
        """``Claim(e, r)``."""
        i = self.ix[e]
        c = s.eclaim[i]
        if not (
            s.ephase[i] == "parked"
            and all(x in ("notified", "granted") for x in c)
            and c[r - 1] == "notified"
            and all(c[q - 1] == "granted" for q in range(1, r))
        ):
            return None
        reply = self.ClaimReply(s, e, r)
        t = s._replace(eclaim=ex(s.eclaim, i, ex(c, r - 1, reply)))
        if reply == "granted":
            t = t._replace(
                dpark=ex(s.dpark, r - 1, s.dpark[r - 1] - {e}),
                efind=self._set_efind(s, e, r, self.Snapshot(s, r)),
            )
        return t

    def Granted(self, s: State, e: str) -> bool:
        """``Granted(e)``."""
        return all(c == "granted" for c in s.eclaim[self.ix[e]])

    def ClaimsEnded(self, s: State, e: str) -> bool:
        """``ClaimsEnded(e)``."""
        return self.Granted(s, e) or any(c in ("taken", "refused") for c in s.eclaim[self.ix[e]])

    def PromotionFails(self, s: State, e: str) -> bool:
        """``PromotionFails(e)``."""
        return any(c == "refused" for c in s.eclaim[self.ix[e]]) or (self.Granted(s, e) and self.StartupFails(s, e))

    def Promote(self, s: State, e: str) -> State | None:
        """``Promote(e)``."""
        i = self.ix[e]
        if not (s.ephase[i] == "parked" and self.ClaimsEnded(s, e)):
            return None
        if self.PromotionFails(s, e):
            return s._replace(**self.Forget(s, e, "failed"))
        if self.Granted(s, e):
            f = s.efind[i][0]
            return s._replace(
                ephase=ex(s.ephase, i, "run"),
                eroute=ex(s.eroute, i, f.fmap),
                ever=ex(s.ever, i, f.fver),
                eshare=ex(s.eshare, i, True),
            )
        released = tuple("release" if c in ("granted", "taken") else c for c in s.eclaim[i])
        return s._replace(eclaim=ex(s.eclaim, i, released))

    # -- failures and the daemons' side ---------------------------------------------------------

    def Crash(self, s: State, e: str) -> State | None:
        """``Crash(e)``."""
        if self.Gone(s, e):
            return None
        return s._replace(**self.Forget(s, e, "dead"))

    def Detach(self, s: State, r: int, e: str) -> State | None:
        """``Detach(r, e)``."""
        if not (e in s.datt[r - 1] and self.Gone(s, e)):
            return None
        datt = ex(s.datt, r - 1, s.datt[r - 1] - {e})
        dpark = ex(s.dpark, r - 1, s.dpark[r - 1] - {e})
        p = s.dpend[r - 1]
        dphase = s.dphase
        if s.dphase[r - 1] == "pending" and p is not None and p.mover == e:
            dphase = ex(s.dphase, r - 1, "repairing" if self.m.repairs else "dirty")
        return s._replace(
            datt=datt,
            dpark=dpark,
            dphase=dphase,
            eclaim=self.Notify(s.eclaim, r, datt[r - 1], dpark[r - 1], dphase[r - 1]),
        )

    def Restart(self, s: State, r: int) -> State | None:
        """``Restart(r)``: one state per ``c \\in CopiesAtStart(r)``."""
        if not (
            self.m.daemon_restarts
            and s.dphase[r - 1] == "dirty"
            and not s.datt[r - 1]
            and all(r not in serv for serv in s.eserv)
        ):
            return None
        return [self.StartFrom(s, r, c)._replace(dphase=ex(s.dphase, r - 1, "clean")) for c in self.CopiesAtStart(s, r)]

    def CopiesAtStart(self, s: State, r: int) -> list[Copy | None]:
        """``CopiesAtStart(r)``, the copy first."""
        c = s.dcopy[r - 1]
        return [c, None] if self.m.durable and c is not None else [None]

    def StartFrom(self, s: State, r: int, c: Copy | None) -> State:
        """``StartFrom(r, c)``: the variables it sets (the caller sets the rest)."""
        ver, cmap = (0, self.InitialMap) if c is None else (c.cver, c.cmap)
        return s._replace(
            dver=ex(s.dver, r - 1, ver),
            dmap=ex(s.dmap, r - 1, cmap),
            truth=ex(s.truth, r - 1, cmap),
            dcopy=ex(s.dcopy, r - 1, c),
            dpend=ex(s.dpend, r - 1, None),
            dnf=ex(s.dnf, r - 1, False),
        )

    def Persist(self, s: State, r: int) -> State | None:
        """``Persist(r)``."""
        copy = Copy(s.dver[r - 1], s.dmap[r - 1])
        if not (self.m.durable and s.dphase[r - 1] in ("clean", "pending") and s.dcopy[r - 1] != copy):
            return None
        return s._replace(dcopy=ex(s.dcopy, r - 1, copy))

    def RepairedTruth(self, s: State, r: int) -> Map:
        """``RepairedTruth(r)``."""
        p = s.dpend[r - 1]
        assert p is not None, "a repairing daemon keeps its torn move"
        return tuple(s.dmap[r - 1][ll - 1] if ll in p.layers else s.truth[r - 1][ll - 1] for ll in self.Layers)

    def RepairDone(self, s: State, r: int) -> State | None:
        """``RepairDone(r)``."""
        if not (self.CanRepair and s.dphase[r - 1] == "repairing"):
            return None
        return s._replace(
            truth=ex(s.truth, r - 1, self.RepairedTruth(s, r)),
            dphase=ex(s.dphase, r - 1, "clean"),
            dpend=ex(s.dpend, r - 1, None),
            eclaim=self.Notify(s.eclaim, r, s.datt[r - 1], s.dpark[r - 1], "clean"),
        )

    def RepairFails(self, s: State, r: int) -> State | None:
        """``RepairFails(r)``."""
        if not (self.CanRepair and self.m.repair_may_fail and s.dphase[r - 1] == "repairing"):
            return None
        return s._replace(
            dphase=ex(s.dphase, r - 1, "dirty"),
            eclaim=self.Notify(s.eclaim, r, s.datt[r - 1], s.dpark[r - 1], "dirty"),
        )

    def RepairAgain(self, s: State, r: int) -> State | None:
        """``RepairAgain(r)``."""
        if not (self.m.operator_repairs and s.dphase[r - 1] == "dirty"):
            return None
        return s._replace(dphase=ex(s.dphase, r - 1, "repairing"))

    # -- a daemon lost, and its rejoin -----------------------------------------------------------

    def Lose(self, s: State, r: int) -> list[State] | None:
        """``Lose(r)``: one state per ``c \\in CopiesAtStart(r)``."""
        if not self.m.rejoins:
            return None
        lost = {
            i for i, e in enumerate(self.Engines) if not self.Gone(s, e) and (e in s.datt[r - 1] or r in s.eserv[i])
        }

        def each(values: tuple[Any, ...], gone: Any) -> tuple[Any, ...]:
            return tuple(gone if i in lost else v for i, v in enumerate(values))

        return [
            self.StartFrom(s, r, c)._replace(
                ephase=each(s.ephase, "dead"),
                efind=each(s.efind, (self.NoFinding,) * len(self.Ranks)),
                eroute=each(s.eroute, self.InitialMap),
                ever=each(s.ever, 0),
                eserv=each(s.eserv, frozenset()),
                eshare=each(s.eshare, False),
                reb=each(s.reb, self.IdleReb),
                eclaim=each(s.eclaim, self.NoClaims),
                dphase=ex(s.dphase, r - 1, "no_record" if s.dphase[r - 1] == "no_record" else "clean"),
                datt=ex(s.datt, r - 1, frozenset()),
                dpark=ex(s.dpark, r - 1, frozenset()),
            )
            for c in self.CopiesAtStart(s, r)
        ]

    def RejoinAllowed(self, s: State, e: str, r: int, v: int) -> bool:
        """``RejoinAllowed(e, r, v)``."""
        return s.dphase[r - 1] == "clean" and s.dver[r - 1] < v and s.datt[r - 1] <= {e} and not s.dnf[r - 1]

    def AskRejoin(self, s: State, e: str, r: int) -> State | None:
        """``AskRejoin(e, r)``."""
        i = self.ix[e]
        if not (
            s.ephase[i] == "start"
            and s.efind[i][r - 1].found == "rejoin"
            and all(s.efind[i][q - 1].found != "rejoin" for q in range(1, r))
        ):
            return None
        t = s.efind[i][r - 1]
        if self.RejoinAllowed(s, e, r, t.fver):
            return s._replace(
                dphase=ex(s.dphase, r - 1, "repairing"),
                dver=ex(s.dver, r - 1, t.fver),
                dmap=ex(s.dmap, r - 1, t.fmap),
                dpend=ex(s.dpend, r - 1, Pend(e, self.LayersSet, t.fver)),
                efind=self._set_efind(s, e, r, t._replace(found="wait")),
            )
        return s._replace(efind=self._set_efind(s, e, r, self.NoFinding._replace(found="refused")))

    # -- Next -------------------------------------------------------------------------------------

    def instances(self) -> list[tuple[str, Callable[..., State | None], tuple[Any, ...]]]:
        """``Next``'s disjuncts, each action with every value of its bound variables, in Next's order."""
        E, R, L = self.Engines, self.Ranks, self.Layers
        out: list[tuple[str, Callable[..., State | None], tuple[Any, ...]]] = []

        def add(name: str, domains: list[tuple[Any, ...]]) -> None:
            fn = getattr(self, name)
            combos: list[tuple[Any, ...]] = [()]
            for d in domains:
                combos = [(*c, x) for c in combos for x in d]
            out.extend((name, fn, c) for c in combos)

        er = [tuple(E), tuple(R)]
        add("Attach", er)
        add("Poll", er)
        add("Timeout", er)
        add("Agree", [tuple(E)])
        add("Fetch", er)
        add("BeginChunk", [tuple(E), self.Chunks])
        add("Begin", er)
        add("BeginUnanswered", er)
        add("BeginUnreached", er)
        add("Decide", [tuple(E)])
        add("Abort", er)
        add("MoveLayer", [tuple(E), tuple(R), tuple(L)])
        add("Commit", er)
        add("CommitRefused", er)
        add("CommitUnanswered", er)
        add("Committed", [tuple(E)])
        add("Verify", [tuple(E)])
        add("Crash", [tuple(E)])
        add("Detach", [tuple(R), tuple(E)])
        add("Restart", [tuple(R)])
        add("RepairDone", [tuple(R)])
        add("RepairFails", [tuple(R)])
        add("RepairAgain", [tuple(R)])
        add("Park", er)
        add("Claim", er)
        add("Promote", [tuple(E)])
        add("Lose", [tuple(R)])
        add("AskRejoin", er)
        add("Persist", [tuple(R)])
        return out

    def Next(self, s: State) -> Iterator[tuple[str, tuple[Any, ...], State]]:
        """Every step of ``Next`` from ``s``: (action, its parameters, the next state); a step that
        changes nothing (losing a daemon that holds nothing) is a step too, as in TLC's graph."""
        for name, fn, args in self._instances:
            out = fn(s, *args)
            # A daemon's start (Lose, Restart) is a step per copy it may start from.
            for t in out if isinstance(out, list) else (out,):
                if t is not None:
                    yield name, args, t

    @property
    def _instances(self) -> list[tuple[str, Callable[..., State | None], tuple[Any, ...]]]:
        if "_inst" not in self.__dict__:
            self.__dict__["_inst"] = self.instances()
        return self.__dict__["_inst"]

    # -- the variables as tools.mirror.values values, to print as TLC does ------------------------

    def project(self, s: State) -> tuple[Any, ...]:
        """The 18 variables as TLA+ values (``tools.mirror.values``), in declaration order."""
        engines = tuple(self.engine_value(e) for e in self.Engines)

        def fn(values: tuple[Any, ...]) -> Any:
            # Over strings it is a record, as TLC prints it (a trace check's engines).
            return function_value(tuple(zip(engines, values, strict=True)))

        def mvs(names: frozenset[str]) -> frozenset[ModelValue]:
            return frozenset(self.engine_value(e) for e in names)

        def pend(p: Pend | None) -> Any:
            if p is None:
                return ModelValue("NONE")
            return Record(mover=self.engine_value(p.mover), layers=p.layers, base=p.base)

        def finding(f: Finding) -> Record:
            return Record(found=f.found, fver=f.fver, fmap=f.fmap)

        def reb(b: Reb) -> Record:
            return Record(step=b.step, chunk=b.chunk, replies=b.replies, owed=b.owed)

        def copy(c: Copy | None) -> Any:
            return ModelValue("NONE") if c is None else Record(cver=c.cver, cmap=c.cmap)

        return (
            s.dphase, s.dver, s.dmap, tuple(pend(p) for p in s.dpend), tuple(mvs(a) for a in s.datt), s.dnf,
            s.truth, fn(s.ephase), fn(tuple(tuple(finding(f) for f in fs) for fs in s.efind)), fn(s.eroute),
            fn(s.ever), fn(s.eserv), fn(s.eshare), fn(tuple(reb(b) for b in s.reb)), s.moves,
            tuple(mvs(p) for p in s.dpark), fn(s.eclaim), tuple(copy(c) for c in s.dcopy),
        )  # fmt: skip

    def render(self, s: State) -> str:
        """The state as TLC prints it (``/\\ var = value`` lines)."""
        return render_projection(self.project(s))


def explore(m: Model, on_edge: Callable[[State, str, State], None] | None = None) -> tuple[int, int, int]:
    """Breadth-first search of the model's whole graph: (distinct states, edges, depth)."""
    spec = Spec(m)
    depth: dict[State, int] = {}
    queue: deque[State] = deque()
    for s in spec.Init():
        if s not in depth:
            depth[s] = 1
            queue.append(s)
    edges = 0
    while queue:
        s = queue.popleft()
        for name, args, t in spec.Next(s):
            edges += 1
            if t not in depth:
                depth[t] = depth[s] + 1
                queue.append(t)
            if on_edge is not None:
                on_edge(s, label(name, args), t)
    return len(depth), edges, max(depth.values(), default=0)


def dump(spec_dir: str | Path, model_name: str, out: str | Path) -> tuple[int, int]:
    """Explore the model breadth first and write its graph in TLC's DOT format: (states, edges)."""
    m = load_model(spec_dir, model_name)
    tlc_intern_order([*m.engines, "NONE"])  # model values in .cfg order: TLC's intern order
    spec = Spec(m)
    ids: dict[State, int] = {}
    edges = 0
    with Path(out).open("w", encoding="utf-8") as f:
        f.write("strict digraph DiskGraph {\nsubgraph cluster_graph {\n")
        for s in spec.Init():
            if s not in ids:
                text = spec.render(s)
                ids[s] = fingerprint(text)
                f.write(f'{ids[s]} [label="{escape(text)}",style = filled]\n')
        queue: deque[State] = deque(ids)
        while queue:
            s = queue.popleft()
            for name, args, t in spec.Next(s):
                edges += 1
                new = t not in ids
                if new:
                    text = spec.render(t)
                    ids[t] = fingerprint(text)
                    queue.append(t)
                f.write(
                    f'{ids[s]} -> {ids[t]} [label="{escape(label(name, args))}",color="black",fontcolor="black"];\n'
                )
                if new:
                    f.write(f'{ids[t]} [label="{escape(text)}",tooltip="{escape(text)}"];\n')
        f.write("}\n}")
    return len(ids), edges
