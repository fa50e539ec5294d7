"""spec/TraceLayoutProtocol.tla in Python: is a run's traces a behaviour of the spec?

Why: ``tools.trace_check`` replays the traces on ``layout_sm``, the code under test judging itself, and
TLC (``tools.mirror.trace_tla``) is not everywhere. This search is the trace spec's ``TraceNext`` over
``tools.oracle.spec``'s transcription, with no ``layout_sm`` in it: breadth first from ``TraceInit``,
with a visited set over (spec state, ``pos``, ``epos``), for a state where every log was taken (where
TLC finds ``TraceAccepted`` violated: the verdict "a behaviour"). The logs are the ones TLC reads
(``tools.mirror.trace_logs``: ``Log[r]``, a daemon's steps; ``ELog[k]``, an engine's decisions).

When there is none, the report takes a reached state that took the most logged steps (the first
reached, breadth first) and names each log's next step there: none is a spec step from any reached
state with those positions (else a state with one more taken would be reached). Of those the first
wrong line is the earliest written (``t_ns``): the others may only wait on it.

Each function below transcribes the operator of the same name: ``Matches``, ``Logged``, ``LateRequest``,
``RankLost``, ``NoRankLost``, ``Decided``, ``Unlogged``, ``TraceInit``, ``TraceNext`` (the logged record
``l`` is ``rec`` in the code: ruff refuses ``l``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tools.mirror.trace_logs import Run, Source, model, runs
from tools.mirror.values import ModelValue, Record, tlc_text
from tools.oracle.spec import Pend, Spec, State, ex


class Step(NamedTuple):
    """A record of ``Log[r]`` (``Logged``'s ``l``): the event, its engine and candidates, the answer,
    then the daemon's variables after it."""

    ev: str
    eng: str
    cands: frozenset[str]
    ans: str
    ph: str
    ver: int
    pend: Pend | None
    att: frozenset[str]
    park: frozenset[str]
    nf: bool


class Decision(NamedTuple):
    """A record of ``ELog[k].steps`` (``Decided``'s ``l``)."""

    ev: str
    ph: str
    ver: int
    share: bool
    step: str


def _step(rec: Record) -> Step:
    pend = rec["pend"]
    return Step(
        ev=rec["ev"],
        eng=rec["eng"],
        cands=frozenset(rec["cands"]),
        ans=rec["ans"],
        ph=rec["ph"],
        ver=rec["ver"],
        pend=None if isinstance(pend, ModelValue) else Pend(pend["mover"], frozenset(pend["layers"]), pend["base"]),
        att=frozenset(rec["att"]),
        park=frozenset(rec["park"]),
        nf=rec["nf"],
    )


def _decision(rec: Record) -> Decision:
    return Decision(ev=rec["ev"], ph=rec["ph"], ver=rec["ver"], share=rec["share"], step=rec["step"])


TraceState = tuple[State, tuple[int, ...], tuple[int, ...]]  # vars, pos, epos


@dataclass
class Due:
    """A logged step no spec step takes where the search got furthest."""

    who: str  # "rank 2" or "engine <id>"
    index: int  # its position in its log, from 1
    source: Source
    text: str  # the record, as TLC prints it

    def line(self) -> str:
        return f"{self.source.path}:{self.source.line}: {self.who}'s step {self.index}: {self.text}"


@dataclass
class OracleVerdict:
    """The oracle's verdict on one run (a folder of traces)."""

    folder: Path
    steps: int  # logged steps, every log's
    accepted: bool
    distinct: int  # distinct states of the search (spec state, pos, epos)
    seconds: float
    taken: int = 0  # the most logged steps a reached state took
    due: list[Due] = field(default_factory=list)  # each log's next step there (on a rejection)
    furthest: str = ""  # that state, its daemons' and engines' variables

    @property
    def first(self) -> Due | None:
        """The first wrong line: of the steps due, the earliest written."""
        return min(self.due, key=lambda d: d.source.t_ns, default=None)

    def report(self) -> str:
        head = (
            f"{self.folder}: {'a behaviour' if self.accepted else 'NOT a behaviour'} of the spec "
            f"({self.steps} logged steps, {self.distinct} distinct states, {self.seconds:.2f} s)"
        )
        if self.accepted:
            return head
        first = self.first
        lines = [
            head,
            f"  no behaviour takes more than {self.taken} of the {self.steps} logged steps; from every state that "
            "took these, none takes the step each log has next:",
            *(f"    {d.line()}" for d in self.due),
        ]
        if first is not None:
            lines.append(f"  the first wrong line: {first.source.path}:{first.source.line} ({first.who})")
        lines.append(f"  a state reached there:\n    {self.furthest}")
        return "\n".join(lines)


class TraceSearch:
    """``TraceNext`` over one run's logs and constants."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.spec = Spec(model(run), engines_are_strings=True)
        self.Log: list[list[Step]] = [[_step(rec) for rec in log.records] for log in run.logs]
        self.ELog: list[tuple[str, list[Decision]]] = [
            (log.engine, [_decision(rec) for rec in log.records]) for log in run.engine_logs
        ]
        self.Traced = frozenset(eng for eng, _ in self.ELog)
        sp = self.spec
        E, R = sp.Engines, sp.Ranks
        # Unlogged's disjuncts, each with every value of its bound variables.
        self._unlogged: list[tuple[Any, tuple[Any, ...]]] = []
        for e in E:
            for r in R:
                self._unlogged += [(sp.Poll, (e, r)), (sp.Timeout, (e, r)), (self.RankLost, (e, r))]
        for e in E:
            self._unlogged += [(sp.Crash, (e,)), (self._no_rank_lost(sp.Committed), (e,))]
        for e in E:
            if e not in self.Traced:
                self._unlogged += [(sp.Agree, (e,)), (sp.Promote, (e,))]
                self._unlogged += [(self._no_rank_lost(sp.Decide), (e,)), (self._no_rank_lost(sp.Verify), (e,))]
        for e in E:
            self._unlogged += [(sp.BeginChunk, (e, c)) for c in sp.Chunks]
        for e in E:
            self._unlogged += [(sp.MoveLayer, (e, r, ll)) for r in R for ll in sp.Layers]

    # -- the trace spec's operators ----------------------------------------------------------------

    def Matches(self, t: State, r: int, rec: Step) -> bool:
        """``Matches(r, l)``: daemon r's logged variables equal the spec's after the step."""
        i = r - 1
        return (
            t.dphase[i] == rec.ph
            and t.dver[i] == rec.ver
            and t.dpend[i] == rec.pend
            and t.datt[i] == rec.att
            and t.dpark[i] == rec.park
            and t.dnf[i] == rec.nf
        )

    def Logged(self, s: State, r: int, rec: Step) -> Iterator[State]:
        """``Logged(r, l)``: the spec's action of the logged event on daemon r (every next state)."""
        sp, known = self.spec, self.spec.ix
        ev, e = rec.ev, rec.eng
        if ev in ("attach", "begin", "abort", "commit", "detach", "park", "claim", "rejoin") and e not in known:
            return  # an engine the model lacks: every action of it is disabled
        t: State | None = None
        if ev == "attach":
            t = sp.Attach(s, e, r)
        elif ev == "fetch":
            for c in sorted(rec.cands):
                if c in known:
                    u = sp.Fetch(s, c, r)
                    if u is not None and (r in u.eserv[known[c]]) == (rec.ans == "served"):
                        yield u
            return
        elif ev == "begin":
            t = sp.Begin(s, e, r)
            if t is not None and t.reb[known[e]].replies[r - 1] != rec.ans:
                t = None
        elif ev == "abort":
            t = sp.Abort(s, e, r)
        elif ev == "commit":
            t = sp.Commit(s, e, r)
            if t is not None and t.reb[known[e]].replies[r - 1] != rec.ans:
                t = None
        elif ev == "detach":
            t = sp.Detach(s, r, e)
        elif ev == "park":
            t = sp.Park(s, e, r)
        elif ev == "claim":
            t = sp.Claim(s, e, r)
            if t is not None and t.eclaim[known[e]][r - 1] != rec.ans:
                t = None
        elif ev == "rejoin":
            t = sp.AskRejoin(s, e, r)
            want = "wait" if rec.ans == "granted" else "refused"
            if t is not None and t.efind[known[e]][r - 1].found != want:
                t = None
        elif ev == "repair":
            t = sp.RepairAgain(s, r)
        elif ev == "repair_done":
            t = sp.RepairDone(s, r)
        elif ev == "repair_failed":
            t = sp.RepairFails(s, r)
        elif ev == "restart":
            for u in (sp.Lose(s, r), sp.Restart(s, r)):
                if u is not None:
                    yield u
            return
        else:
            # TLC stops on a CASE that no arm matches: so does the oracle.
            raise ValueError(f"Logged: no arm of the CASE for the event {ev!r}")
        if t is not None:
            yield t

    def LateRequest(self, s: State, rec: Step) -> bool:
        """``LateRequest(l)``: a request of an engine the spec has ended (the step changes nothing)."""
        return rec.ev in ("fetch", "begin", "commit", "claim") and any(
            c in self.spec.ix and self.spec.Gone(s, c) for c in rec.cands
        )

    def RankLost(self, s: State, e: str, q: int) -> State | None:
        """``RankLost(e, q)``."""
        sp = self.spec
        i = sp.ix[e]
        b = s.reb[i]
        if s.ephase[i] != "run":
            return None
        if not (
            (b.step == "begin" and b.replies[q - 1] == "none")
            or (b.step in ("move", "commit") and sp.MovedEverywhere(s, e) and b.replies[q - 1] == "ok")
        ):
            return None
        return s._replace(reb=ex(s.reb, i, b._replace(replies=ex(b.replies, q - 1, "lost"))))

    def NoRankLost(self, s: State, e: str) -> bool:
        """``NoRankLost(e)``."""
        return all(w != "lost" for w in s.reb[self.spec.ix[e]].replies)

    def _no_rank_lost(self, action: Any) -> Any:
        """``action(e) /\\ NoRankLost(e)``."""

        def step(s: State, e: str) -> State | None:
            return action(s, e) if self.NoRankLost(s, e) else None

        return step

    def Decided(self, s: State, e: str, rec: Decision) -> State | None:
        """``Decided(e, l)``: the engine's logged decision."""
        sp = self.spec
        if e not in sp.ix:
            return None
        i = sp.ix[e]
        if rec.ev == "agree":
            t = sp.Agree(s, e)
            if t is None or t.ephase[i] != rec.ph:
                return None
            if rec.ph == "load" and not (t.ever[i] == rec.ver and t.eshare[i] == rec.share):
                return None
            return t
        if rec.ev == "decide":
            if not self.NoRankLost(s, e):
                return None
            t = sp.Decide(s, e)
            return t if t is not None and t.reb[i].step == rec.step and t.eshare[i] == rec.share else None
        if rec.ev == "verify":
            if not self.NoRankLost(s, e):
                return None
            t = sp.Verify(s, e)
            return t if t is not None and t.eshare[i] == rec.share else None
        if rec.ev == "promote":
            t = sp.Promote(s, e)
            if t is None or t.ephase[i] != rec.ph:
                return None
            return None if rec.ph == "run" and t.ever[i] != rec.ver else t
        if rec.ev == "rebalance_end":
            ok = not sp.Gone(s, e) and s.reb[i].step in ("idle", "abort") and s.reb[i].owed == "none"
            return s if ok else None
        raise ValueError(f"Decided: no arm of the CASE for the decision {rec.ev!r}")

    def Unlogged(self, s: State) -> Iterator[State]:
        """``Unlogged``: every step of the protocol that is not a logged one."""
        for action, args in self._unlogged:
            t = action(s, *args)
            if t is not None:
                yield t

    def TraceInit(self) -> list[TraceState]:
        """``TraceInit``."""
        pos = (0,) * len(self.Log)
        epos = (0,) * len(self.ELog)
        return [(s, pos, epos) for s in self.spec.Init()]

    def TraceNext(self, st: TraceState) -> Iterator[TraceState]:
        """``TraceNext``: a daemon's next logged step, an engine's next decision, or an unlogged step."""
        s, pos, epos = st
        for k, log in enumerate(self.Log):
            if pos[k] < len(log):
                r, rec = k + 1, log[pos[k]]
                nxt = ex(pos, k, pos[k] + 1)
                for t in self.Logged(s, r, rec):
                    if self.Matches(t, r, rec):
                        yield t, nxt, epos
                if self.LateRequest(s, rec) and self.Matches(s, r, rec):
                    yield s, nxt, epos
        for k, (eng, steps) in enumerate(self.ELog):
            if epos[k] < len(steps):
                t = self.Decided(s, eng, steps[epos[k]])
                if t is not None:
                    yield t, pos, ex(epos, k, epos[k] + 1)
        for t in self.Unlogged(s):
            yield t, pos, epos

    def accepted(self, st: TraceState) -> bool:
        """``~TraceAccepted``: every log was taken."""
        _, pos, epos = st
        return all(p == len(log) for p, log in zip(pos, self.Log, strict=True)) and all(
            p == len(steps) for p, (_, steps) in zip(epos, self.ELog, strict=True)
        )

    # -- the search --------------------------------------------------------------------------------

    def search(self) -> OracleVerdict:
        started = time.monotonic()
        steps = sum(len(log) for log in self.Log) + sum(len(steps) for _, steps in self.ELog)
        seen: set[TraceState] = set()
        queue: deque[TraceState] = deque()
        best: tuple[int, TraceState | None] = (-1, None)
        # As TLC: each new state is checked when found, so the search stops at the first accepted one.
        found = self.TraceInit()
        while found or queue:
            for nxt in found:
                if nxt in seen:
                    continue
                seen.add(nxt)
                taken = sum(nxt[1]) + sum(nxt[2])
                if self.accepted(nxt):
                    return OracleVerdict(self.run.folder, steps, True, len(seen), time.monotonic() - started, taken)
                if taken > best[0]:
                    best = (taken, nxt)
                queue.append(nxt)
            found = list(self.TraceNext(queue.popleft())) if queue else []
        verdict = OracleVerdict(self.run.folder, steps, False, len(seen), time.monotonic() - started, best[0])
        if best[1] is not None:
            verdict.due = self._due(best[1])
            verdict.furthest = self._shown(best[1])
        return verdict

    def _due(self, st: TraceState) -> list[Due]:
        _, pos, epos = st
        due = [
            Due(f"rank {log.rank}", n + 1, log.sources[n], tlc_text(log.records[n]))
            for log, n in zip(self.run.logs, pos, strict=True)
            if n < len(log.records)
        ]
        due += [
            Due(f"engine {log.engine}", n + 1, log.sources[n], tlc_text(log.records[n]))
            for log, n in zip(self.run.engine_logs, epos, strict=True)
            if n < len(log.records)
        ]
        return due

    def _shown(self, st: TraceState) -> str:
        s, pos, epos = st
        shown = ["pos", "epos", "dphase", "dver", "dpend", "datt", "dpark", "dnf", "ephase", "ever", "eshare", "reb"]
        values = dict(zip(State._fields, self.spec.project(s), strict=True))
        values |= {"pos": pos, "epos": epos}
        return "\n    ".join(f"{name} = {tlc_text(values[name])}" for name in shown)


def check_run(run: Run) -> OracleVerdict:
    """The oracle's verdict on one run's logs."""
    return TraceSearch(run).search()


def check_paths(paths: Sequence[Path]) -> list[OracleVerdict]:
    """The oracle's verdict on every run under ``paths`` (one per folder of daemon traces, as TLC's)."""
    return [check_run(run) for run in runs([Path(p) for p in paths])]
