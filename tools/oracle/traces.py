"""spec/TraceLayoutProtocol.tla in Python: is a run's traces a behaviour of the spec?

Why: ``tools.trace_check`` replays the traces on ``layout_sm``, the code under test judging itself, and
TLC (``tools.mirror.trace_tla``) is not everywhere. This search is the trace spec's ``TraceNext`` over
``tools.oracle.spec``'s transcription, with no ``layout_sm`` in it: breadth first from ``TraceInit``,
with a visited set over (spec state, ``pos``, ``epos``), for a state where every log was taken (where
TLC finds ``TraceAccepted`` violated: the verdict "a behaviour"). The logs are the ones TLC reads
(``tools.mirror.trace_logs``: ``Log[r]``, a daemon's steps; ``ELog[k]``, an engine's decisions).

When there is none, the report names each log's first step that no reached state took, with its file
and line, and says whether the spec's action of it is enabled in some state that took the steps before
it (with another outcome, shown field by field) or in none (it waits on another step). The first wrong
line is the earliest written (``t_ns``) of the enabled ones: the others wait, on it or on the spec's
rank order. A state that took the most logged steps is shown too, as TLC's report shows one.

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

# Logged's arms: the events whose answer is a conjunct, and the spec's action of each event.
_ANSWERED = ("fetch", "begin", "commit", "claim", "rejoin")
_ACTIONS = {
    "attach": "Attach",
    "begin": "Begin",
    "abort": "Abort",
    "commit": "Commit",
    "detach": "Detach",
    "park": "Park",
    "claim": "Claim",
    "rejoin": "AskRejoin",
}
_DAEMON_ACTIONS = {
    "repair": "RepairAgain",
    "repair_done": "RepairDone",
    "repair_failed": "RepairFails",
    "persist": "Persist",
}


@dataclass
class Due:
    """A logged step no spec step takes where the search got furthest."""

    who: str  # "rank 2" or "engine <id>"
    index: int  # its position in its log, from 1
    source: Source
    text: str  # the record, as TLC prints it
    enabled: bool = False  # the spec's action is enabled after the steps before it, with another outcome
    why: str = ""  # how the spec's step differs from the log, or that none is enabled

    def line(self) -> str:
        return f"{self.source.path}:{self.source.line}: {self.who}'s step {self.index}: {self.text}\n      {self.why}"


@dataclass
class OracleVerdict:
    """The oracle's verdict on one run (a folder of traces)."""

    folder: Path
    steps: int  # logged steps, every log's
    accepted: bool
    distinct: int  # distinct states of the search (spec state, pos, epos)
    seconds: float
    taken: int = 0  # the most logged steps a reached state took
    due: list[Due] = field(default_factory=list)  # each log's first step no behaviour takes (on a rejection)
    furthest: str = ""  # that state, its daemons' and engines' variables

    @property
    def first(self) -> Due | None:
        """The first wrong line: of the steps due, the earliest written among those whose action the spec
        can take after the steps before them, with another outcome (the others wait: on it, or on the
        spec's rank order); where there is none, the earliest written."""
        enabled = [d for d in self.due if d.enabled]
        return min(enabled or self.due, key=lambda d: d.source.t_ns, default=None)

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
            f"  no behaviour takes more than {self.taken} of the {self.steps} logged steps; each log's first step "
            "that no behaviour takes:",
            *(f"    {d.line()}" for d in self.due),
        ]
        if first is not None:
            lines.append(f"  the first wrong line: {first.source.path}:{first.source.line} ({first.who})")
        lines.append(f"  a state that took the most:\n    {self.furthest}")
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
                self._unlogged += [(self._no_rank_lost(sp.Agree), (e,)), (sp.Promote, (e,))]
                self._unlogged += [(self._no_rank_lost(sp.Decide), (e,)), (self._no_rank_lost(sp.Verify), (e,))]
        for e in E:
            self._unlogged += [(sp.BeginChunk, (e, c)) for c in sp.Chunks]
        for e in E:
            self._unlogged += [(sp.MoveLayer, (e, r, ll)) for r in R for ll in sp.Layers]
        for e in E:
            self._unlogged += [(sp.CommitRefused, (e, r)) for r in R]  # a request that never reached its daemon
        for e in E:
            self._unlogged += [(sp.BeginUnreached, (e, r)) for r in R]

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
        """``Logged(r, l)``: the spec's action of the logged event on daemon r, with the logged answer
        (every next state)."""
        for e, t in self._action(s, r, rec):
            if self._answer(t, r, rec, e) == rec.ans or rec.ev not in _ANSWERED:
                yield t
        # A commit's faults: refused for its rows (logged refused), or recorded with its reply lost (logged
        # committed, while the engine counts it refused).
        if rec.ev == "commit" and rec.eng in self.spec.ix:
            fault = {"commit_refused": self.spec.CommitRefused, "committed": self.spec.CommitUnanswered}.get(rec.ans)
            t = None if fault is None else fault(s, rec.eng, r)
            if t is not None:
                yield t
        # A begin taken with its reply lost: logged with the daemon's answer, counted refused by the engine.
        if rec.ev == "begin" and rec.eng in self.spec.ix and self.spec.BeginReply(s, rec.eng, r) == rec.ans:
            t = self.spec.BeginUnanswered(s, rec.eng, r)
            if t is not None:
                yield t

    def _action(self, s: State, r: int, rec: Step) -> list[tuple[str, State]]:
        """``Logged``'s CASE arm without the answer's conjunct: (the engine, the next state) of each way
        the spec's action of the event takes the step."""
        sp, known = self.spec, self.spec.ix
        ev, e = rec.ev, rec.eng
        if ev in ("attach", "begin", "abort", "commit", "detach", "park", "claim", "rejoin") and e not in known:
            return []  # an engine the model lacks: every action of it is disabled
        if ev == "fetch":
            found = [(c, sp.Fetch(s, c, r)) for c in sorted(rec.cands) if c in known]
        elif ev == "restart":
            found = [(e, t) for step in (sp.Lose(s, r), sp.Restart(s, r)) for t in step or ()]
        elif ev in _ACTIONS:
            action = getattr(sp, _ACTIONS[ev])
            found = [(e, action(s, r, e) if ev == "detach" else action(s, e, r))]
        elif ev in _DAEMON_ACTIONS:
            found = [(e, getattr(sp, _DAEMON_ACTIONS[ev])(s, r))]
        else:
            # TLC stops on a CASE that no arm matches: so does the oracle.
            raise ValueError(f"Logged: no arm of the CASE for the event {ev!r}")
        return [(c, t) for c, t in found if t is not None]

    def _answer(self, t: State, r: int, rec: Step, e: str) -> str:
        """The answer of the spec's step to state ``t``, in the log's words ("" where none is logged)."""
        i = self.spec.ix.get(e)
        if rec.ev == "fetch" and i is not None:
            return "served" if r in t.eserv[i] else "refused"
        if rec.ev in ("begin", "commit") and i is not None:
            return t.reb[i].replies[r - 1]
        if rec.ev == "claim" and i is not None:
            return t.eclaim[i][r - 1]
        if rec.ev == "rejoin" and i is not None:
            return {"wait": "granted", "refused": "refused"}.get(t.efind[i][r - 1].found, "")
        return rec.ans

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
        if s.ephase[i] == "start" and s.efind[i][q - 1].found == "nothing":
            return s._replace(efind=ex(s.efind, i, ex(s.efind[i], q - 1, s.efind[i][q - 1]._replace(found="lost"))))
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
        i = self.spec.ix[e]
        return all(w != "lost" for w in s.reb[i].replies) and all(f.found != "lost" for f in s.efind[i])

    def _no_rank_lost(self, action: Any) -> Any:
        """``action(e) /\\ NoRankLost(e)``."""

        def step(s: State, e: str) -> State | None:
            return action(s, e) if self.NoRankLost(s, e) else None

        return step

    def Decided(self, s: State, e: str, rec: Decision) -> State | None:
        """``Decided(e, l)``: the engine's logged decision."""
        t = self._decision(s, e, rec)
        if t is None:
            return None
        i = self.spec.ix[e]
        if rec.ev == "agree":
            return (
                t
                if t.ephase[i] == rec.ph and (rec.ph != "load" or (t.ever[i], t.eshare[i]) == (rec.ver, rec.share))
                else None
            )
        if rec.ev == "decide":
            return t if (t.reb[i].step, t.eshare[i]) == (rec.step, rec.share) else None
        if rec.ev == "verify":
            return t if t.eshare[i] == rec.share else None
        if rec.ev == "promote":
            return t if t.ephase[i] == rec.ph and (rec.ph != "run" or t.ever[i] == rec.ver) else None
        return t  # rebalance_end: the guard is the whole step

    def _decision(self, s: State, e: str, rec: Decision) -> State | None:
        """``Decided``'s CASE arm without the conjuncts on the logged values: the spec's action."""
        sp = self.spec
        if e not in sp.ix:
            return None
        i = sp.ix[e]
        if rec.ev == "agree":
            return sp.Agree(s, e) if self.NoRankLost(s, e) else None
        if rec.ev == "decide":
            return sp.Decide(s, e) if self.NoRankLost(s, e) else None
        if rec.ev == "verify":
            return sp.Verify(s, e) if self.NoRankLost(s, e) else None
        if rec.ev == "promote":
            return sp.Promote(s, e)
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
            verdict.due = self._due(seen)
            verdict.furthest = self._shown(best[1])
        return verdict

    def _due(self, seen: set[TraceState]) -> list[Due]:
        """Each log's first step that no reached state took, and how the spec's steps from the states
        that took the steps before it differ from it."""
        due = []
        for k, log in enumerate(self.run.logs):
            n = max(st[1][k] for st in seen)
            if n < len(log.records):
                rec, r = self.Log[k][n], k + 1
                outcomes = [(e, t) for st in seen if st[1][k] == n for e, t in self._action(st[0], r, rec)]
                d = Due(f"rank {log.rank}", n + 1, log.sources[n], tlc_text(log.records[n]), bool(outcomes))
                d.why = self._daemon_diff(r, rec, *outcomes[0]) if outcomes else _NOT_ENABLED
                due.append(d)
        for k, log in enumerate(self.run.engine_logs):
            n = max(st[2][k] for st in seen)
            if n < len(log.records):
                eng, dec = self.ELog[k][0], self.ELog[k][1][n]
                nexts = [t for st in seen if st[2][k] == n if (t := self._decision(st[0], eng, dec)) is not None]
                d = Due(f"engine {log.engine}", n + 1, log.sources[n], tlc_text(log.records[n]), bool(nexts))
                d.why = self._decision_diff(eng, dec, nexts[0]) if nexts else _NOT_ENABLED
                due.append(d)
        return due

    def _daemon_diff(self, r: int, rec: Step, e: str, t: State) -> str:
        i = r - 1
        spec = {
            "ans": self._answer(t, r, rec, e),
            "ph": t.dphase[i],
            "ver": t.dver[i],
            "pend": t.dpend[i],
            "att": t.datt[i],
            "park": t.dpark[i],
            "nf": t.dnf[i],
        }
        return _diff(spec, rec._asdict())

    def _decision_diff(self, e: str, rec: Decision, t: State) -> str:
        i = self.spec.ix[e]
        spec = {"ph": t.ephase[i], "ver": t.ever[i], "share": t.eshare[i], "step": t.reb[i].step}
        if rec.ev == "rebalance_end":
            return "the spec's step is enabled after the steps before it"
        checked = {"agree": ("ph", "ver", "share"), "decide": ("step", "share"), "verify": ("share",)}
        keys = checked.get(rec.ev, ("ph", "ver"))
        return _diff({k: spec[k] for k in keys}, rec._asdict())

    def _shown(self, st: TraceState) -> str:
        s, pos, epos = st
        shown = ["pos", "epos", "dphase", "dver", "dpend", "datt", "dpark", "dnf", "ephase", "ever", "eshare", "reb"]
        values = dict(zip(State._fields, self.spec.project(s), strict=True))
        values |= {"pos": pos, "epos": epos}
        return "\n    ".join(f"{name} = {tlc_text(values[name])}" for name in shown)


_NOT_ENABLED = "the spec's action is enabled in no state that took the steps before it (it waits on another step)"


def _value(v: Any) -> str:
    if isinstance(v, Pend):
        return tlc_text(Record(mover=v.mover, layers=v.layers, base=v.base))
    return "NONE" if v is None else tlc_text(v)


def _diff(spec: dict[str, Any], logged: dict[str, Any]) -> str:
    """The fields where the spec's step and the log differ."""
    differ = [k for k in spec if spec[k] != logged[k]]
    if not differ:
        return "the spec's step gives the logged values, yet in no behaviour that takes the other logs' steps"
    return "the spec's step is enabled after the steps before it, but gives " + ", ".join(
        f"{k} = {_value(spec[k])} (logged: {_value(logged[k])})" for k in differ
    )


def check_run(run: Run) -> OracleVerdict:
    """The oracle's verdict on one run's logs."""
    return TraceSearch(run).search()


def check_paths(paths: Sequence[Path]) -> list[OracleVerdict]:
    """The oracle's verdict on every run under ``paths`` (one per folder of daemon traces, as TLC's)."""
    return [check_run(run) for run in runs([Path(p) for p in paths])]
