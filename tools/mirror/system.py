"""The mirror: ``layout_sm`` composed into the system that spec/LayoutProtocol.tla describes.

Why: TLC checks the spec, the tests check ``layout_sm``; the mirror shows that both are the same
protocol. It composes one ``DaemonMachine`` per daemon and one ``EngineSession`` per engine (the
object every rank of a real engine runs, ``layout_sm.session``) into a system with the constants
of a TLC model, and every spec action is an event of the same name here (``EVENTS``). The mirror
only *wires*: every reply and every engine step (attach, poll, timeout, agree, fetch claim,
begin, decide, abort, move, commit, committed, verify) is ``layout_sm``'s, with its machines taking the
transitions; a step that they do not allow raises and stops the exploration.
What the mirror adds is what the spec calls the environment: the real layout of each
daemon's memory (``truth``), which ``MoveLayer`` rewrites, the order in which ranks act and
which engine acts next, the layout EPLB moves to (``System.target``), crashes, engines without
the plugin (``OlderEngine``), an operator restarting a dirty daemon or repairing it again, and
the end of a repair (the reload of the torn layers, which restores their truth, or its failure).

State: a ``SysState`` holds the daemons' ``DaemonView``s, the truth, one engine per engine id
(its session's bare ``EngineView``, an ``OlderEngine`` or a ``GoneEngine``) and the count of
chunks begun. ``project`` maps it to the spec's variables (Python values of
``tools.mirror.values``); ``render`` prints it as TLC does.

Abstraction (the same as the spec's): 2 physical slots and 2 logical experts per layer, each
layer's row is permutation 0 = (0, 1) or 1 = (1, 0); spec layers are 1-based, ``layout_sm``'s
0-based. The session token of engine ``e`` is ``"s-" + e`` (an engine id attaches once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from layout_sm.daemon import DaemonMachine, DaemonView, RepairDone, RepairFailed
from layout_sm.durable import CopyOwner, copy_bytes, copy_due, read_copy
from layout_sm.engine import EngineLayout, Go, RankAnswer, RankFinding, needs_wait
from layout_sm.messages import AttachRequest
from layout_sm.ready import (
    Aborted,
    Attached,
    BeginAnswered,
    ChunkAsked,
    ChunkEnded,
    ClaimAnswered,
    ClaimsEnded,
    CommitAnswered,
    Decided,
    Event,
    Fetched,
    FindingsGathered,
    Moved,
    Noticed,
    OwedGathered,
    ParkAnswered,
    Polled,
    Ready,
    RejoinAnswered,
    SourcesGathered,
)
from layout_sm.reasons import Reason, Status
from layout_sm.record import LayoutRecord
from layout_sm.session import EngineSession, EngineView
from tools.mirror.model import SPEC_STEP, VARIABLES, Model, label, render_projection
from tools.mirror.model import load_model as load_model  # re-exported: the mirror's users read models from here
from tools.mirror.reference import ReferenceEngineSession
from tools.mirror.values import Fn, Interval, ModelValue, Record

ROWS = ((0, 1), (1, 0))  # the two permutations a layer's row can be
_FAILED_CHECK = RankAnswer(Status.REFUSED, text="")  # every rank's answer of an owed check that fails
NUM_LOGICAL = 2

# Spec action -> parameter names (the spec's Next, in order).
EVENTS: dict[str, tuple[str, ...]] = {
    "Attach": ("e", "r"),
    "Poll": ("e", "r"),
    "Timeout": ("e", "r"),
    "Agree": ("e",),
    "Fetch": ("e", "r"),
    "BeginChunk": ("e", "c"),
    "Begin": ("e", "r"),
    "BeginUnanswered": ("e", "r"),
    "BeginUnreached": ("e", "r"),
    "Decide": ("e",),
    "Abort": ("e", "r"),
    "MoveLayer": ("e", "r", "l"),
    "Commit": ("e", "r"),
    "CommitRefused": ("e", "r"),
    "CommitUnanswered": ("e", "r"),
    "Committed": ("e",),
    "Verify": ("e",),
    "Crash": ("e",),
    "Detach": ("r", "e"),
    "Restart": ("r",),
    "RepairDone": ("r",),
    "RepairFails": ("r",),
    "RepairAgain": ("r",),
    "Park": ("e", "r"),
    "Claim": ("e", "r"),
    "Promote": ("e",),
    "Lose": ("r",),
    "AskRejoin": ("e", "r"),
    "Persist": ("r",),
}

# The spec's actions that can be enabled and change nothing (TLC's graph then has a self-loop): the loss
# of a daemon that holds nothing from any engine and nothing moved starts it again as it was. Every other
# event returns a changed state or None (a poll of a move still pending is no step: the spec disables it).
STUTTERING = frozenset({"Lose"})

# How each spec variable is computed from the mirror's state (for the structural cross-check).
VARIABLE_SOURCES: dict[str, str] = {
    "dphase": "DaemonView.phase",
    "dver": "DaemonView.record.version (0 without a record)",
    "dmap": "DaemonView.record.rows (as permutation indexes)",
    "dpend": "DaemonView.pending, or DaemonView.dirty once dirty or repairing, else NONE",
    "datt": "DaemonView.attachments (engine ids)",
    "dnf": "DaemonView.non_following_seen",
    "truth": "SysState.truth (the environment)",
    "ephase": "EngineView.phase (OlderEngine.phase, GoneEngine.phase)",
    "efind": "EngineView.findings (RankFinding kind and record)",
    "eroute": "EngineView.rows (None: the initial layout)",
    "ever": "EngineView.version",
    "eserv": "EngineView.served (OlderEngine.serv)",
    "eshare": "EngineView.shares (set by the actions of Agree, Decide and Verify)",
    "reb": "EngineView.rebalance / chunk / begins, aborted, commits / owed",
    "moves": "SysState.moves",
    "dpark": "DaemonView.parked (engine ids)",
    "eclaim": 'EngineView.claims (a standby\'s role per rank; all "none" for a primary)',
    "dcopy": "SysState.copies (the environment: the file each daemon's writer last renamed in place)",
}


# -- state --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OlderEngine:
    """An engine without the layout plugin (the spec's ``Older``): it only fetches, with no claim."""

    phase: str  # "load" or "run"
    serv: frozenset[int] = frozenset()


@dataclass(frozen=True)
class GoneEngine:
    """An engine whose process is gone (the spec's ``Forget``): it failed, or it crashed."""

    phase: str  # "failed" or "dead"


# A newer engine is its ``EngineSession``'s bare view (``EngineView.bare``): what the spec keeps.
Engine = EngineView | OlderEngine | GoneEngine


@dataclass(frozen=True)
class SysState:
    """The whole system: the daemons' views, the truth, the engines, the chunks begun."""

    daemons: tuple[DaemonView, ...]
    truth: tuple[tuple[int, ...], ...]
    engines: tuple[Engine, ...]
    moves: int
    copies: tuple[LayoutRecord | None, ...] = ()  # each daemon's durable copy (empty: none anywhere)


def rows_of_perms(perms: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The map whose layer ``i`` is permutation ``perms[i]`` (the spec's ``dmap``/``eroute`` values)."""
    return tuple(ROWS[p] for p in perms)


def perms_of(rows: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(ROWS.index(tuple(row)) for row in rows)


# The spec's efind[e][r].found for the finding kinds named otherwise there.
_FINDING_WORDS = {"pending": "wait", "rejoin_refused": "refused"}


class System:
    """One model's system: the initial states, the events, the projection to spec variables."""

    def __init__(self, model: Model, *, statemachine: bool = False) -> None:
        """``statemachine``: the sessions take their steps with python-statemachine's own engine
        (``ReferenceEngineSession``) rather than the declared tables (``layout_sm.declared``); both
        read the same classes."""
        self.model = model
        self.R = model.num_ranks
        self.initial_perms = tuple(0 for _ in model.layers)
        self.initial_record = LayoutRecord.initial(rows_of_perms(self.initial_perms), NUM_LOGICAL)
        self.engine_layout = EngineLayout(
            num_layers=model.num_layers,
            num_physical=len(ROWS[0]),
            num_logical=NUM_LOGICAL,
            initial_digest=self.initial_record.digest,
            routes_by_metadata=True,
            rejoins=model.rejoins,
        )
        # One reused machine per daemon and one reused session per engine: states are loaded into
        # them (``restore``), never rebuilt.
        self.machines = [DaemonMachine(self.initial_record, auto_repair=model.repairs) for _ in model.ranks]
        session_class = ReferenceEngineSession if statemachine else EngineSession
        self.sessions = {
            e: session_class(e, self.R, self.engine_layout, standby=e in model.standbys) for e in model.newer
        }
        # Each engine's view at its start (a standby's has taken its role).
        self.fresh = {e: session.view().bare() for e, session in self.sessions.items()}
        self._memo: dict[tuple[Any, ...], tuple[Any, DaemonView]] = {}
        self._session_memo: dict[tuple[Any, ...], tuple[Ready, EngineView]] = {}
        self._commit_memo: dict[tuple[Any, ...], tuple[EngineView, DaemonView] | None] = {}
        self._spec_memo: dict[Engine, tuple[Any, ...]] = {}
        self.eidx = {e: i for i, e in enumerate(model.engines)}

    # -- daemon calls (memoised: the reply is a function of the view and the request) -------

    def _call(self, r: int, view: DaemonView, op: str, arg: Any) -> tuple[Any, DaemonView]:
        key = (op, view, arg)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        m = self.machines[r - 1]
        m.restore(view)
        if op == "attach":
            result: Any = m.attach_engine(AttachRequest(arg), session=_session(arg))
        elif op == "query":
            result = m.query_state(include_map=True)
        elif op == "fetch":
            result = m.fetch_check(arg)
        elif op == "begin":
            result = m.begin_move(arg)
        elif op == "commit":
            result = m.commit_move(arg)
        elif op == "abort":
            result = m.abort_move(arg)
        elif op == "detach":
            result = m.detach_engine(arg, _session(arg))
        elif op == "repair":
            result = m.begin_repair()
        elif op == "repair_done":
            result = m.handle(RepairDone(arg, "reloaded")).reply
        elif op == "repair_failed":
            result = m.handle(RepairFailed(Reason.REPAIR_FAILED, "a read error")).reply
        elif op == "park":
            result = m.park_engine(arg)
        elif op == "claim":
            result = m.claim_primary(arg)
        elif op == "rejoin":
            result = m.rejoin_layout(arg)
        else:  # pragma: no cover
            raise ValueError(op)
        out = (result, m.view())
        self._memo[key] = out
        return out

    # -- engine steps: the engines' own EngineSession (memoised like the daemon calls) -------

    def _step(self, e: str, view: EngineView, event: Event, memo: Any = None) -> tuple[Ready, EngineView]:
        """``EngineSession.step(event)`` on engine ``e`` in ``view``: what it says next, and the bare view after.

        ``memo`` stands for the event in the memo's key when it is not hashable (a daemon's reply is a
        function of the daemon's view before the request).
        """
        key = (view, event if memo is None else (type(event), memo))
        hit = self._session_memo.get(key)
        if hit is not None:
            return hit
        session = self.sessions[e]
        session.restore(view)
        out = (session.step(event), session.view().bare())
        self._session_memo[key] = out
        return out

    def _request(self, e: str, view: EngineView, rank: int) -> Any:
        """What rank ``rank`` of engine ``e`` sends its daemon next in ``view`` (None: nothing now)."""
        session = self.sessions[e]
        session.restore(view)
        return session.next_request(rank)

    # -- initial states ------------------------------------------------------------------

    def initial_states(self) -> list[SysState]:
        m = self.model
        out = []
        lack = sorted(m.may_lack_record)
        engines = tuple(OlderEngine("load") if e in m.older else self.fresh[e] for e in m.engines)
        for mask in range(1 << len(lack)):
            without = {lack[i] for i in range(len(lack)) if mask >> i & 1}
            daemons = tuple(
                DaemonView(None if r in without else self.initial_record, auto_repair=m.repairs) for r in m.ranks
            )
            out.append(SysState(daemons, tuple(self.initial_perms for _ in m.ranks), engines, 0))
        return out

    # -- helpers -------------------------------------------------------------------------

    def _view(self, s: SysState, e: str) -> EngineView | None:
        """Engine ``e``'s session view, when it is a live engine with the plugin."""
        es = s.engines[self.eidx[e]]
        return es if isinstance(es, EngineView) else None

    def _with(self, s: SysState, e: str, es: Engine, **kw: Any) -> SysState:
        if isinstance(es, EngineView) and (es.phase == "failed" or es.role == "failed"):
            es = GoneEngine("failed")  # the process exits: its memory is gone
        elif isinstance(es, EngineView) and es.owed and self._owed_word(es) == "bad":
            # The spec keeps a failed check as "bad", not which rank failed it: one failed check, one state.
            es = replace(es, owed=(_FAILED_CHECK,) * len(es.owed))
        engines = list(s.engines)
        engines[self.eidx[e]] = es
        return replace(s, engines=tuple(engines), **kw)

    @staticmethod
    def _set_daemon(s: SysState, r: int, view: DaemonView) -> tuple[DaemonView, ...]:
        daemons = list(s.daemons)
        daemons[r - 1] = view
        return tuple(daemons)

    def route(self, v: EngineView) -> tuple[int, ...]:
        return self.initial_perms if v.rows is None else _perms_cached(v.rows)

    def target(self, v: EngineView) -> tuple[int, ...]:
        """The layout EPLB moves to with the current chunk (the environment's choice, as the
        spec's ``Target``): the chunk's rows flipped."""
        return tuple(1 - p if i in v.chunk else p for i, p in enumerate(self.route(v)))

    # -- events (one per spec action, same names) ----------------------------------------

    def Attach(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "start" or v.findings[r - 1] is not None:
            return None
        if any(f is None for f in v.findings[: r - 1]):
            return None  # ranks attach in rank order
        reply, daemon = self._call(r, s.daemons[r - 1], "attach", e)
        _, v2 = self._step(e, v, Attached(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def Poll(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "start" or not _waits(v.findings[r - 1]):
            return None
        reply, _ = self._call(r, s.daemons[r - 1], "query", None)
        _, v2 = self._step(e, v, Polled(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        return self._with(s, e, v2)  # still pending: the same state (no edge)

    def Timeout(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "start" or not _waits(v.findings[r - 1]):
            return None
        _, v2 = self._step(e, v, Polled(r - 1, None, now_s=math.inf))  # the spec has no clock: any time
        return self._with(s, e, v2)

    def Agree(self, s: SysState, e: str) -> SysState | None:
        v = self._view(s, e)
        if v is None or not _may_agree(v):
            return None
        agreed, v2 = self._step(e, v, FindingsGathered(v.findings))
        if agreed.done is not None and agreed.done.go is Go.PROCEED:  # a pause: the fresh ranks rejoin first
            # Every rank of the spec's engines loads from its daemon.
            _, v2 = self._step(e, v2, SourcesGathered(("daemon",) * self.R))
        return self._with(s, e, v2)

    def Fetch(self, s: SysState, e: str, r: int) -> SysState | None:
        es = s.engines[self.eidx[e]]
        if isinstance(es, GoneEngine) or es.phase != "load":
            return None
        serv = _serv(es)
        if r in serv or any(q not in serv for q in range(1, r)):
            return None
        if isinstance(es, OlderEngine):  # sglang's own loader: no claim
            reply, daemon = self._call(r, s.daemons[r - 1], "fetch", None)
            daemons = self._set_daemon(s, r, daemon)
            if not reply.ok:
                return self._with(s, e, GoneEngine("failed"), daemons=daemons)
            served = es.serv | {r}
            return self._with(s, e, OlderEngine("run" if len(served) == self.R else "load", served), daemons=daemons)
        session = self.sessions[e]
        session.restore(es)
        reply, daemon = self._call(r, s.daemons[r - 1], "fetch", session.fetch_claim(r - 1))
        _, v2 = self._step(e, es, Fetched(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def BeginChunk(self, s: SysState, e: str, c: frozenset[int]) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != "idle" or s.moves >= self.model.max_moves:
            return None
        if not self._guard(e, v, "acts_as_primary"):
            return None
        _, v2 = self._step(e, v, ChunkAsked(0, _layers(c)))
        return self._with(s, e, v2, moves=s.moves + 1)

    def Begin(self, s: SysState, e: str, r: int) -> SysState | None:
        return self._begin(s, e, r, "answered")

    def BeginUnanswered(self, s: SysState, e: str, r: int) -> SysState | None:
        """The daemon takes the begin as it would, and its reply is lost: the rank has no answer."""
        return self._begin(s, e, r, "reply_lost") if self.model.reply_faults else None

    def BeginUnreached(self, s: SysState, e: str, r: int) -> SysState | None:
        """The begin never reaches a daemon that would take it: the daemon is unchanged, no answer."""
        return self._begin(s, e, r, "request_lost") if self.model.reply_faults else None

    def _begin(self, s: SysState, e: str, r: int, fault: str) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != "beginning" or v.begins[r - 1] is not None:
            return None
        if any(a is None for a in v.begins[: r - 1]):
            return None  # ranks begin in rank order
        reply, daemon = self._ask_daemon(s, e, v, r, "begin")
        if fault == "request_lost":
            if not reply.ok:
                return None  # the daemon would not take it: BeginUnanswered's step
            daemon = s.daemons[r - 1]
        if fault != "answered":
            reply = None
        _, v2 = self._step(e, v, BeginAnswered(r - 1, reply), memo=(r, s.daemons[r - 1], fault))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def Decide(self, s: SysState, e: str) -> SysState | None:
        return self._once_every_rank_answered(s, e, "beginning", "begins", Decided())

    def Abort(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != "aborting" or not _to_abort(v, r - 1):
            return None
        if any(_to_abort(v, q) for q in range(r - 1)):
            return None  # ranks abort in rank order
        reply, daemon = self._ask_daemon(s, e, v, r, "abort")
        assert reply.ok, reply
        _, v2 = self._step(e, v, Aborted(r - 1))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def MoveLayer(self, s: SysState, e: str, r: int, l: int) -> SysState | None:  # noqa: E741
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != "moving" or l - 1 not in v.chunk:
            return None
        target = self.target(v)
        want = target[l - 1]
        if s.truth[r - 1][l - 1] == want:
            return None
        if any(k < l - 1 and s.truth[r - 1][k] != target[k] for k in v.chunk):
            return None  # layers move in increasing order
        truth = list(s.truth)
        truth[r - 1] = _set(truth[r - 1], l - 1, want)
        return replace(s, truth=tuple(truth))

    def Commit(self, s: SysState, e: str, r: int) -> SysState | None:
        return self._commit(s, e, r, "answered")

    def CommitRefused(self, s: SysState, e: str, r: int) -> SysState | None:
        """The daemon refuses rows it cannot take (a row that is no permutation of its experts): its
        move stays pending; a request that never reached it is the same step of the spec."""
        return self._commit(s, e, r, "bad_rows") if self.model.reply_faults else None

    def CommitUnanswered(self, s: SysState, e: str, r: int) -> SysState | None:
        """The daemon records the commit, and its reply is lost: the rank has no answer."""
        return self._commit(s, e, r, "reply_lost") if self.model.reply_faults else None

    def _commit(self, s: SysState, e: str, r: int, fault: str) -> SysState | None:
        """Rank ``r``'s commit: answered as the daemon answers it, or with one of the faults of a real
        socket, which the spec allows only where the daemon would record the move."""
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance not in ("moving", "committing"):
            return None
        if not _to_commit(v, r - 1) or any(_to_commit(v, q) for q in range(r - 1)):
            return None  # ranks commit in rank order
        target = self.target(v)
        if any(s.truth[q - 1][k] != target[k] for q in self.model.ranks for k in v.chunk):
            return None  # the device synchronize waits for every layer on every rank
        key = ("Commit", fault, v, r, s.daemons[r - 1])
        hit = self._commit_memo.get(key, False)
        if hit is False:
            # sglang's move and the commit's answer, in one step of the session: the moved map is held by
            # the session (not its view) until the answer comes, so the two are never apart here.
            session = self.sessions[e]
            session.restore(v)
            if v.rebalance == "moving":
                request = session.step(Moved(r - 1, rows_of_perms(target))).send
            else:
                request = session.next_request(r - 1)
            reply, daemon = self._call(r, s.daemons[r - 1], "commit", request)
            if fault != "answered" and not reply.ok:
                hit = None  # the daemon refuses this commit anyway: Commit's step, no fault of its own
            else:
                if fault == "bad_rows":
                    bad = tuple((-1,) * len(row) for row in request.rows)  # no expert of the model
                    reply, daemon = self._call(r, s.daemons[r - 1], "commit", replace(request, rows=bad))
                    assert not reply.ok and daemon == s.daemons[r - 1], reply
                elif fault == "reply_lost":
                    reply = None
                session.step(CommitAnswered(r - 1, reply))
                hit = (session.view().bare(), daemon)
            self._commit_memo[key] = hit
        if hit is None:
            return None
        v2, daemon = hit
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def Committed(self, s: SysState, e: str) -> SysState | None:
        return self._once_every_rank_answered(s, e, "committing", "commits", ChunkEnded())

    def Verify(self, s: SysState, e: str) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != "idle" or not v.owed:
            return None  # the rebalance ends between chunks with a check owed (EPLB's choice: any time)
        _, v2 = self._step(e, v, OwedGathered(v.owed))
        return self._with(s, e, v2)

    def _ask_daemon(self, s: SysState, e: str, v: EngineView, r: int, op: str) -> tuple[Any, DaemonView]:
        """Rank ``r`` of engine ``e`` sends its ``op`` request to its daemon: the reply and the daemon after."""
        return self._call(r, s.daemons[r - 1], op, self._request(e, v, r - 1))

    def _once_every_rank_answered(
        self, s: SysState, e: str, waiting: str, answers: str, event: Decided | ChunkEnded
    ) -> SysState | None:
        """The engine's Decide or Committed: enabled in rebalance phase ``waiting`` once every rank has its
        reply in ``answers``."""
        v = self._view(s, e)
        if v is None or v.phase != "run" or v.rebalance != waiting or any(a is None for a in getattr(v, answers)):
            return None
        _, v2 = self._step(e, v, event)
        return self._with(s, e, v2)

    def Crash(self, s: SysState, e: str) -> SysState | None:
        if isinstance(s.engines[self.eidx[e]], GoneEngine):
            return None
        return self._with(s, e, GoneEngine("dead"))

    def Detach(self, s: SysState, r: int, e: str) -> SysState | None:
        view = s.daemons[r - 1]
        if e not in view.attachments or not isinstance(s.engines[self.eidx[e]], GoneEngine):
            return None
        effect, view2 = self._call(r, view, "detach", e)
        return self._notify(replace(s, daemons=self._set_daemon(s, r, view2)), r, effect.notified)

    def _copy(self, s: SysState, r: int) -> LayoutRecord | None:
        return s.copies[r - 1] if s.copies else None

    def _started_again(self, s: SysState, r: int, had_record: bool) -> list[SysState]:
        """Daemon ``r`` started again (the spec's ``StartFrom``): from the file its writer last renamed in
        place, read as ``layout_sm.durable.read_copy`` reads it; where a copy is there, also from that
        file spoiled (torn, corrupt, of another checkpoint: every unusable file is read alike), which the
        daemon sets aside. Its memory is loaded at the record it starts with."""
        copy = self._copy(s, r) if self.model.durable else None
        files: list[bytes | None] = [None] if copy is None else [copy_bytes(copy, _OWNER), _SPOILED_COPY]
        out = []
        for data in files:
            read = read_copy(data, _OWNER, self.initial_record)
            record = (read.record or self.initial_record) if had_record else None
            truth = list(s.truth)
            truth[r - 1] = self.initial_perms if record is None else _perms_cached(record.rows)
            copies = list(s.copies or (None,) * self.R)
            copies[r - 1] = read.record
            fresh = DaemonView(record, auto_repair=self.model.repairs)
            out.append(
                replace(
                    s,
                    daemons=self._set_daemon(s, r, fresh),
                    truth=tuple(truth),
                    copies=tuple(copies) if any(c is not None for c in copies) else (),
                )
            )
        return out

    def Restart(self, s: SysState, r: int) -> list[SysState] | None:
        view = s.daemons[r - 1]
        if not self.model.daemon_restarts or view.phase != "dirty" or view.attachments:
            return None
        if any(r in _serv(es) for es in s.engines):
            return None
        return self._started_again(s, r, had_record=True)

    def Lose(self, s: SysState, r: int) -> list[SysState] | None:
        """Daemon ``r`` dies and starts again from disk (the environment, ``_started_again``); every
        engine attached to it or serving from it dies."""
        if not self.model.rejoins:
            return None
        view = s.daemons[r - 1]
        out = []
        for s2 in self._started_again(s, r, had_record=view.record is not None):
            for e in self.model.engines:
                es = s.engines[self.eidx[e]]
                if not isinstance(es, GoneEngine) and (e in view.attachments or r in _serv(es)):
                    s2 = self._with(s2, e, GoneEngine("dead"))
            out.append(s2)
        return out

    def Persist(self, s: SysState, r: int) -> SysState | None:
        """Daemon ``r``'s writer renames a copy of the record ``layout_sm.durable.copy_due`` names in place."""
        if not self.model.durable:
            return None
        record = copy_due(s.daemons[r - 1], self._copy(s, r))
        if record is None:
            return None
        copies = list(s.copies or (None,) * self.R)
        copies[r - 1] = record
        return replace(s, copies=tuple(copies))

    def AskRejoin(self, s: SysState, e: str, r: int) -> SysState | None:
        """Rank ``r`` of engine ``e`` asks its fresh daemon to rejoin, in rank order."""
        v = self._view(s, e)
        if v is None or v.phase != "start" or not self._guard(e, v, "to_rejoin", r - 1):
            return None
        if any(self._guard(e, v, "to_rejoin", q) for q in range(r - 1)):
            return None
        reply, daemon = self._ask_daemon(s, e, v, r, "rejoin")
        _, v2 = self._step(e, v, RejoinAnswered(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def RepairDone(self, s: SysState, r: int) -> SysState | None:
        """The reload of the torn move's layers ended: their truth is the record's rows again."""
        view = s.daemons[r - 1]
        repairs = self.model.repairs or self.model.operator_repairs
        if not repairs or view.phase != "repairing" or view.dirty is None or view.record is None:
            return None
        layers = view.dirty.layers
        reply, view2 = self._call(r, view, "repair_done", layers)
        assert reply.ok, reply
        record = _perms_cached(view.record.rows)
        truth = list(s.truth)
        truth[r - 1] = tuple(record[k] if k in layers else p for k, p in enumerate(truth[r - 1]))
        s2 = replace(s, daemons=self._set_daemon(s, r, view2), truth=tuple(truth))
        return self._notify(s2, r, tuple(reply.data.get("notified", ())))

    def RepairFails(self, s: SysState, r: int) -> SysState | None:
        view = s.daemons[r - 1]
        repairs = self.model.repairs or self.model.operator_repairs
        if not (repairs and self.model.repair_may_fail) or view.phase != "repairing":
            return None
        reply, view2 = self._call(r, view, "repair_failed", None)
        return self._notify(replace(s, daemons=self._set_daemon(s, r, view2)), r, tuple(reply.data.get("notified", ())))

    def RepairAgain(self, s: SysState, r: int) -> SysState | None:
        """The operator's ``expert-layout repair`` on a dirty daemon (auto repair on or off)."""
        view = s.daemons[r - 1]
        if not self.model.operator_repairs or view.phase != "dirty":
            return None
        reply, view2 = self._call(r, view, "repair", None)
        assert reply.ok, reply
        return replace(s, daemons=self._set_daemon(s, r, view2))

    def Park(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or not (v.role == "parked" or (v.role == "warming" and self._guard(e, v, "warmed_up"))):
            return None
        if not self._guard(e, v, "to_park", r - 1):
            return None
        reply, daemon = self._ask_daemon(s, e, v, r, "park")
        _, v2 = self._step(e, v, ParkAnswered(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        s2 = self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))
        return self._notify(s2, r, tuple(f for f in reply.data.get("notified", ()) if f != e))

    def Claim(self, s: SysState, e: str, r: int) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.role != "parked" or not self._guard(e, v, "may_claim", r - 1):
            return None
        reply, daemon = self._ask_daemon(s, e, v, r, "claim")
        _, v2 = self._step(e, v, ClaimAnswered(r - 1, reply.to_wire()), memo=(r, s.daemons[r - 1]))
        return self._with(s, e, v2, daemons=self._set_daemon(s, r, daemon))

    def Promote(self, s: SysState, e: str) -> SysState | None:
        v = self._view(s, e)
        if v is None or v.role != "parked" or not self._guard(e, v, "claims_ended"):
            return None
        _, v2 = self._step(e, v, ClaimsEnded())
        return self._with(s, e, v2)

    def _guard(self, e: str, v: EngineView, name: str, *args: Any) -> bool:
        """One of the session's guards (``EngineState``'s conjuncts) on ``v``: what enables a step."""
        session = self.sessions[e]
        session.restore(v)
        return bool(getattr(session.model, name)(*args))

    def _notify(self, s: SysState, r: int, engines: tuple[str, ...]) -> SysState:
        """Daemon ``r``'s notice reaches each of ``engines`` (rank ``r``'s reader; a dead process reads nothing)."""
        for f in engines:
            vf = self._view(s, f)
            if vf is not None:
                _, vf2 = self._step(f, vf, Noticed(r - 1))
                s = self._with(s, f, vf2)
        return s

    # -- successor enumeration (the spec's Next, in order) --------------------------------

    def actions(self) -> list[tuple[str, tuple[Any, ...], Callable[..., SysState | None]]]:
        """Every (action name, parameters, bound event) instance of Next."""
        m = self.model
        domain: dict[str, list[Any]] = {
            "e": list(m.engines),
            "r": list(m.ranks),
            "c": sorted(m.chunks, key=lambda c: (len(c), sorted(c))),
            "l": list(m.layers),
        }
        out = []
        for name, params in EVENTS.items():
            fn = getattr(self, name)
            for combo in _product([domain[p] for p in params]):
                out.append((name, combo, fn))
        return out

    def successors(self, s: SysState) -> Iterator[tuple[str, SysState]]:
        for name, params, fn in self._actions:
            out = fn(s, *params)
            # A daemon's start (Lose, Restart) has a successor per file it may find.
            for nxt in out if isinstance(out, list) else (out,):
                if nxt is not None and (nxt != s or name in STUTTERING):
                    yield self._labels[(name, params)], nxt

    @property
    def _actions(self) -> list[tuple[str, tuple[Any, ...], Callable[..., SysState | None]]]:
        cached = self.__dict__.get("_actions_cache")
        if cached is None:
            cached = self.actions()
            self.__dict__["_actions_cache"] = cached
            self.__dict__["_labels"] = {(n, p): label(n, p) for n, p, _ in cached}
        return cached

    # -- projection to the spec's variables ----------------------------------------------

    def project(self, s: SysState) -> tuple[Any, ...]:
        """The spec's variables, in ``VARIABLES`` order, as ``tools.mirror.values`` values."""
        engines = [self._spec_engine(es) for es in s.engines]
        return (
            tuple(v.phase for v in s.daemons),
            tuple(0 if v.record is None else v.record.version for v in s.daemons),
            tuple(self.initial_perms if v.record is None else _perms_cached(v.record.rows) for v in s.daemons),
            tuple(_dpend(v) for v in s.daemons),
            tuple(frozenset(ModelValue(e) for e in v.attachments) for v in s.daemons),
            tuple(v.non_following_seen for v in s.daemons),
            s.truth,
            *(_fn(self.model.engines, [x[i] for x in engines]) for i in range(7)),
            s.moves,
            tuple(frozenset(ModelValue(e) for e in v.parked) for v in s.daemons),
            _fn(self.model.engines, [x[7] for x in engines]),
            tuple(_dcopy(s.copies[i] if s.copies else None) for i in range(self.R)),
        )

    def spec_state(self, s: SysState) -> Record:
        """The spec's state as one value, a record of the variables: equal to TLC's state, decoded."""
        return Record(zip(VARIABLES, self.project(s), strict=True))

    def _spec_engine(self, es: Engine) -> tuple[Any, ...]:
        """One engine's spec variables: ephase, efind, eroute, ever, eserv, eshare, reb, eclaim."""
        hit = self._spec_memo.get(es)
        if hit is not None:
            return hit
        blank = (tuple(self._find_rec(None) for _ in range(self.R)), self.initial_perms, 0)
        no_claims = ("none",) * self.R
        if isinstance(es, GoneEngine):
            out = (es.phase, *blank, frozenset(), False, _IDLE_REB[self.R], no_claims)
        elif isinstance(es, OlderEngine):
            out = (es.phase, *blank, es.serv, False, _IDLE_REB[self.R], no_claims)
        else:
            out = (
                "parked" if es.role == "parked" else es.phase,
                tuple(self._find_rec(f) for f in es.findings),
                self.route(es),
                es.version,
                frozenset(r + 1 for r in es.served),
                es.shares,
                _reb(es, self._owed_word(es)),
                es.claims or no_claims,
            )
        self._spec_memo[es] = out
        return out

    def _owed_word(self, v: EngineView) -> str:
        """The spec's ``reb[e].owed``: the check the last committed chunk owes, as the session's own
        guard (``owed_checks``) will judge it at the next all-gather."""
        if not v.owed:
            return "none"
        return "good" if self._guard(v.engine_id, v, "owed_checks") else "bad"

    def _find_rec(self, f: RankFinding | None) -> Record:
        if f is None:
            return _finding_rec("nothing", 0, self.initial_perms)
        word = _FINDING_WORDS.get(f.kind, f.kind)
        if f.record is None:
            return _finding_rec(word, 0, self.initial_perms)
        return _finding_rec(word, f.record.version, _perms_cached(f.record.rows))

    def render(self, s: SysState) -> str:
        return render_projection(self.project(s))

    def step_view(self, s: SysState) -> tuple[Any, ...]:
        """What the action properties read (``invariants.StepView``)."""
        engines = [self._spec_engine(es) for es in s.engines]
        return (
            tuple(v.phase for v in s.daemons),
            tuple(0 if v.record is None else v.record.version for v in s.daemons),
            tuple(es.version if isinstance(es, EngineView) else 0 for es in s.engines),
            tuple(isinstance(es, GoneEngine) for es in s.engines),
            tuple(frozenset(e for e in v.attachments if e not in v.parked) for v in s.daemons),
            tuple(_serv(es) for es in s.engines),
            tuple(None if v.pending is None else v.pending.engine_id for v in s.daemons),
            tuple(v.parked for v in s.daemons),
            tuple(x[7] for x in engines),
            tuple(x[6]["replies"] for x in engines),
            tuple(self.initial_perms if v.record is None else _perms_cached(v.record.rows) for v in s.daemons),
            tuple(v.non_following_seen for v in s.daemons),
            tuple(frozenset(v.attachments) for v in s.daemons),
            tuple(x[6] for x in engines),
            tuple(x[5] for x in engines),
            tuple(x[0] for x in engines),
        )


@lru_cache(maxsize=4096)
def _perms_cached(rows: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return perms_of(rows)


@lru_cache(maxsize=4096)
def _finding_rec(word: str, version: int, perms: tuple[int, ...]) -> Record:
    return Record(found=word, fver=version, fmap=perms)


# The copy the mirror's daemons own, and a file none of them can use (read_copy: torn).
_OWNER = CopyOwner("mirror-checkpoint", "mirror-config")
_SPOILED_COPY = b'{"format": "sglang-expert-la'


def _dcopy(copy: LayoutRecord | None) -> Any:
    if copy is None:
        return ModelValue("NONE")
    return Record(cver=copy.version, cmap=_perms_cached(copy.rows))


def _dpend(v: DaemonView) -> Any:
    move = v.pending if v.pending is not None else v.dirty
    if move is None:
        return ModelValue("NONE")
    layers = frozenset(x + 1 for x in move.layers)
    if getattr(move, "rejoin", False):  # the spec's rejoin takes `Layers` whole, which TLC prints as 1..n
        layers = Interval(1, len(move.layers))
    return Record(mover=ModelValue(move.engine_id), layers=layers, base=move.base_version)


def _reb(v: EngineView, owed: str) -> Record:
    step = SPEC_STEP.get(v.rebalance, "idle")
    chunk = frozenset(layer + 1 for layer in v.chunk)
    replies = tuple(_reply_word(v, i) for i in range(v.num_ranks))
    return Record((("step", step), ("chunk", chunk), ("replies", replies), ("owed", owed)))


def _reply_word(v: EngineView, rank: int) -> str:
    """Rank ``rank``'s entry of the spec's ``reb[e].replies``."""
    begun = v.begins[rank]
    if begun is None:
        return "none"
    if rank in v.aborted:
        return "aborted"
    commit = v.commits[rank]
    if commit is not None:
        return "committed" if commit.ok else "commit_refused"
    return "refused" if begun.status is None else begun.status.value


class _IdleRebs(dict[int, Record]):
    def __missing__(self, num_ranks: int) -> Record:
        rec = Record((("step", "idle"), ("chunk", frozenset()), ("replies", ("none",) * num_ranks), ("owed", "none")))
        self[num_ranks] = rec
        return rec


_IDLE_REB = _IdleRebs()


def _serv(es: Engine) -> frozenset[int]:
    """The spec's ``eserv[e]``: the ranks (1-based) whose fetch_state was served."""
    if isinstance(es, EngineView):
        return frozenset(r + 1 for r in es.served)
    return es.serv if isinstance(es, OlderEngine) else frozenset()


def _waits(f: RankFinding | None) -> bool:
    return f is not None and needs_wait(f)


def _may_agree(v: EngineView) -> bool:
    return v.phase == "start" and all(f is not None and not needs_wait(f) and f.kind != "rejoin" for f in v.findings)


def _to_abort(v: EngineView, rank: int) -> bool:
    """Rank ``rank``'s begin was ok and it has not aborted yet."""
    begun = v.begins[rank]
    return begun is not None and begun.ok and rank not in v.aborted


def _to_commit(v: EngineView, rank: int) -> bool:
    """Rank ``rank``'s begin was ok and it has not committed yet."""
    begun = v.begins[rank]
    return begun is not None and begun.ok and v.commits[rank] is None


@lru_cache(maxsize=16)
def _mvs(engines: tuple[str, ...]) -> tuple[ModelValue, ...]:
    return tuple(ModelValue(e) for e in engines)


def _fn(engines: tuple[str, ...], values: list[Any]) -> Any:
    return Fn(tuple(zip(_mvs(engines), values, strict=False)))


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1 :])


def _session(engine: str) -> str:
    return "s-" + engine


def _layers(chunk: frozenset[int]) -> tuple[int, ...]:
    """The chunk's layers as ``layout_sm`` numbers them (0-based, ascending)."""
    return tuple(sorted(layer - 1 for layer in chunk))


def _product(domains: list[list[Any]]) -> Iterator[tuple[Any, ...]]:
    if not domains:
        yield ()
        return
    for head in domains[0]:
        for rest in _product(domains[1:]):
            yield (head, *rest)
