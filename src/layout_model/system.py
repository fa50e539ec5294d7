"""The mirror: ``layout_sm``'s machines composed into the system that spec/LayoutProtocol.tla describes.

Why: TLC checks the spec, the tests check the machines; the mirror shows that both are the
same protocol. It composes one ``DaemonMachine`` per daemon and the engine decisions of
``layout_sm.engine`` into a system with the constants of a TLC model, and every spec action
is an event of the same name here (``EVENTS``). The mirror only *wires*: every reply and
every decision (attach, poll, fetch, begin, commit, abort, detach, startup, chunk, verify)
comes from ``layout_sm``, and ``layout_sm``'s engine phase machines (``StartupMachine`` per
rank, ``RebalanceMachine`` per engine) are driven beside the engine events and must take the
transition the spec takes (``System._drive``; a mismatch stops the exploration).
What the mirror adds is what the spec calls the environment: the real layout of each
daemon's memory (``truth``), which ``MoveLayer`` rewrites, the engines' control flow (which
step comes next), crashes, and an operator restarting a dirty daemon.

State: a ``SysState`` holds the daemons' ``DaemonView``s, the truth, one ``EngineState`` per
engine and the count of chunks begun. ``project`` maps it to the spec's variables (Python
values of ``layout_model.values``); ``render`` prints it as TLC does.

Abstraction (the same as the spec's): 2 physical slots and 2 logical experts per layer, each
layer's row is permutation 0 = (0, 1) or 1 = (1, 0); spec layers are 1-based, ``layout_sm``'s
0-based. The session token of engine ``e`` is ``"s-" + e`` (an engine id attaches once).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from layout_model.render import pretty
from layout_model.values import Fn, ModelValue, Record, tlc_text
from layout_sm.daemon import DaemonMachine, DaemonView
from layout_sm.engine import (
    EngineLayout,
    RankFinding,
    RebalanceMachine,
    StartupMachine,
    chunk_decision,
    needs_wait,
    rebalance_mode,
    startup_decision,
    verify_commits,
)
from layout_sm.messages import AbortRequest, AttachRequest, BeginRequest, CommitRequest, FetchLayoutField
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutRecord, layout_digest

ROWS = ((0, 1), (1, 0))  # the two permutations a layer's row can be
NUM_LOGICAL = 2

# The spec's variables, in declaration order (the order TLC prints them).
VARIABLES = (
    "dphase", "dver", "dmap", "dpend", "datt", "dnf", "truth",
    "ephase", "efind", "eroute", "ever", "eserv", "eshare", "reb", "moves",
)  # fmt: skip

# Spec action -> parameter names (the spec's Next, in order).
EVENTS: dict[str, tuple[str, ...]] = {
    "Attach": ("e", "r"),
    "Poll": ("e", "r"),
    "Timeout": ("e", "r"),
    "Agree": ("e",),
    "Fetch": ("e", "r"),
    "BeginChunk": ("e", "c"),
    "Begin": ("e", "r"),
    "Decide": ("e",),
    "Abort": ("e", "r"),
    "MoveLayer": ("e", "r", "l"),
    "Commit": ("e", "r"),
    "Verify": ("e",),
    "Crash": ("e",),
    "Detach": ("r", "e"),
    "Restart": ("r",),
}

# How each spec variable is computed from the mirror's state (for the structural cross-check).
VARIABLE_SOURCES: dict[str, str] = {
    "dphase": "DaemonView.phase",
    "dver": "DaemonView.record.version (0 without a record)",
    "dmap": "DaemonView.record.rows (as permutation indexes)",
    "dpend": "DaemonView.pending, or DaemonView.dirty once dirty, else NONE",
    "datt": "DaemonView.attachments (engine ids)",
    "dnf": "DaemonView.non_following_seen",
    "truth": "SysState.truth (the environment)",
    "ephase": "EngineState.phase",
    "efind": "EngineState.finds (RankFinding kind and record)",
    "eroute": "EngineState.route",
    "ever": "EngineState.ever",
    "eserv": "EngineState.serv",
    "eshare": "EngineState.share (rebalance_mode(...).shared, then chunk/verify outcomes)",
    "reb": "EngineState.step / chunk / replies",
    "moves": "SysState.moves",
}


@dataclass(frozen=True)
class Model:
    """The constants of one TLC model (the .cfg, read by ``load_model``)."""

    name: str
    num_ranks: int
    num_layers: int
    engines: tuple[str, ...]
    older: frozenset[str]
    may_lack_record: frozenset[int]
    chunks: tuple[frozenset[int], ...]
    max_moves: int
    daemon_restarts: bool
    invariants: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()

    @property
    def ranks(self) -> range:
        return range(1, self.num_ranks + 1)

    @property
    def layers(self) -> range:
        return range(1, self.num_layers + 1)

    @property
    def newer(self) -> tuple[str, ...]:
        return tuple(e for e in self.engines if e not in self.older)


def _set_of(text: str) -> list[str]:
    inner = text.strip()
    assert inner.startswith("{") and inner.endswith("}"), text
    return re.findall(r"\{[^{}]*\}|[^,{}\s]+", inner[1:-1])


def load_model(spec_dir: str | Path, name: str) -> Model:
    """Read the constants of ``spec/<name>.cfg`` (and the chunks of ``spec/<name>.tla``)."""
    spec_dir = Path(spec_dir)
    cfg = re.sub(r"\\\*[^\n]*", "", (spec_dir / f"{name}.cfg").read_text())
    consts = dict(re.findall(r"^\s*(\w+)\s*=\s*(.+?)\s*$", cfg, re.M))
    subst = dict(re.findall(r"^\s*(\w+)\s*<-\s*(\w+)\s*$", cfg, re.M))
    mc = (spec_dir / f"{name}.tla").read_text()

    def const(key: str) -> str:
        if key in consts:
            return consts[key]
        m = re.search(rf"^{subst[key]}\s*==\s*(.+)$", mc, re.M)
        assert m, f"{name}: no value for {key}"
        return m.group(1).strip()

    def block(keyword: str) -> tuple[str, ...]:
        m = re.search(rf"^{keyword}S?\b(.*?)(?=^[A-Z]+\b|\Z)", cfg, re.M | re.S)
        return tuple(m.group(1).split()) if m else ()

    chunks = tuple(frozenset(int(x) for x in re.findall(r"\d+", c)) for c in _set_of(const("Chunks")))
    return Model(
        name=name,
        num_ranks=int(const("NumRanks")),
        num_layers=int(const("NumLayers")),
        engines=tuple(_set_of(const("Engines"))),
        older=frozenset(_set_of(const("Older"))),
        may_lack_record=frozenset(int(x) for x in _set_of(const("MayLackRecord"))),
        chunks=chunks,
        max_moves=int(const("MaxMoves")),
        daemon_restarts=const("DaemonRestarts") == "TRUE",
        invariants=block("INVARIANT"),
        properties=block("PROPERTY") or block("PROPERTIES"),
    )


# -- state --------------------------------------------------------------------------------

Finding = tuple[str, LayoutRecord | None] | None  # (RankFinding kind, record); None: nothing yet


@dataclass(frozen=True)
class EngineState:
    """One engine as the spec sees it (its ``e``-indexed variables); hashable for the explorer.

    ``commits`` is the one field the spec does not show: the version and digest of each ok
    commit reply, which ``verify_commits`` reads. It is a function of the shown state (the
    daemon's record right after the commit), so it never splits a spec state.
    """

    phase: str  # "start", "load", "run", "failed", "dead"
    finds: tuple[Finding, ...]
    route: tuple[int, ...]  # permutation index per layer
    ever: int
    serv: frozenset[int]
    share: bool
    step: str  # "idle", "begin", "abort", "move", "commit"
    chunk: frozenset[int]
    replies: tuple[str, ...]  # per rank: the spec's reply word
    commits: tuple[tuple[int, str] | None, ...]  # per rank: (version, digest) of an ok commit reply


@dataclass(frozen=True)
class SysState:
    """The whole system: the daemons' views, the truth, the engines, the chunks begun."""

    daemons: tuple[DaemonView, ...]
    truth: tuple[tuple[int, ...], ...]
    engines: tuple[EngineState, ...]
    moves: int


def rows_of_perms(perms: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The map whose layer ``i`` is permutation ``perms[i]`` (the spec's ``dmap``/``eroute`` values)."""
    return tuple(ROWS[p] for p in perms)


def perms_of(rows: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return tuple(ROWS.index(tuple(row)) for row in rows)


class System:
    """One model's system: the initial states, the events, the projection to spec variables."""

    def __init__(self, model: Model) -> None:
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
        )
        # One reused machine per daemon: states are loaded into it (``restore``), never rebuilt.
        self.machines = [DaemonMachine(self.initial_record) for _ in model.ranks]
        self._memo: dict[tuple[Any, ...], tuple[Any, DaemonView]] = {}
        # layout_sm's engine phase machines, driven beside each engine event (``_drive``): they
        # must take the transition the spec's control flow takes, or the mirror stops. (These two
        # instances only name the classes; ``_drive`` sends to fresh ones.)
        self.startup_machine = StartupMachine()
        self.rebalance_machine = RebalanceMachine()
        self._drive_memo: set[tuple[Any, ...]] = set()
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
        else:  # pragma: no cover
            raise ValueError(op)
        out = (result, m.view())
        self._memo[key] = out
        return out

    # -- initial states ------------------------------------------------------------------

    def initial_states(self) -> list[SysState]:
        m = self.model
        out = []
        lack = sorted(m.may_lack_record)
        for mask in range(1 << len(lack)):
            without = {lack[i] for i in range(len(lack)) if mask >> i & 1}
            daemons = tuple(DaemonView(None if r in without else self.initial_record) for r in m.ranks)
            engines = tuple(self._blank_engine("load" if e in m.older else "start") for e in m.engines)
            out.append(SysState(daemons, tuple(self.initial_perms for _ in m.ranks), engines, 0))
        return out

    # -- helpers -------------------------------------------------------------------------

    def _eng(self, s: SysState, e: str) -> EngineState:
        return s.engines[self.eidx[e]]

    def _with(self, s: SysState, e: str, es: EngineState, **kw: Any) -> SysState:
        engines = list(s.engines)
        engines[self.eidx[e]] = es
        return replace(s, engines=tuple(engines), **kw)

    @staticmethod
    def _set_daemon(s: SysState, r: int, view: DaemonView) -> tuple[DaemonView, ...]:
        daemons = list(s.daemons)
        daemons[r - 1] = view
        return tuple(daemons)

    def _blank_engine(self, phase: str) -> EngineState:
        """An engine with no process memory: one about to start, or one gone (crashed, failed),
        which only the daemons still remember (their attachments)."""
        return EngineState(
            phase=phase,
            finds=(None,) * self.R,
            route=self.initial_perms,
            ever=0,
            serv=frozenset(),
            share=False,
            step="idle",
            chunk=frozenset(),
            replies=("none",) * self.R,
            commits=(None,) * self.R,
        )

    def _drive(self, machine: Any, before: str, event: str, after: str, **kw: Any) -> None:
        """Send ``event`` to ``machine`` in state ``before``; it must end in ``after``."""
        key = (type(machine), before, event, after, tuple(sorted((k, repr(v)) for k, v in kw.items())))
        if key in self._drive_memo:
            return
        # A fresh instance each time: a machine that reached a final state takes no more events.
        # (The memo keeps this to a few hundred instances per exploration.)
        machine = type(machine)()
        machine.current_state_value = before
        machine.send(event, **kw)
        got = str(machine.current_state_value)
        if got != after:
            raise AssertionError(
                f"{type(machine).__name__}: {event} from {before} went to {got}, the spec's control flow to {after}"
            )
        self._drive_memo.add(key)

    @staticmethod
    def _rebalance_state(es: EngineState) -> str:
        """The RebalanceMachine state of an engine past its startup."""
        if es.step in ("idle", "abort"):
            return "idle" if es.share else "off"
        return {"begin": "beginning", "move": "moving", "commit": "committing"}[es.step]

    @staticmethod
    def _startup_state(f: Finding) -> str:
        if f is None:
            return "attaching"
        return "waiting" if f[0] == "pending" else "agreeing"

    def target(self, es: EngineState) -> tuple[int, ...]:
        return tuple(1 - p if (i + 1) in es.chunk else p for i, p in enumerate(es.route))

    @staticmethod
    def _finding(f: RankFinding) -> Finding:
        return (f.kind, f.record)

    # -- events (one per spec action, same names) ----------------------------------------

    def Attach(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        if e in self.model.older or es.phase != "start" or es.finds[r - 1] is not None:
            return None
        if any(f is None for f in es.finds[: r - 1]):
            return None  # ranks attach in rank order
        reply, view = self._call(r, s.daemons[r - 1], "attach", e)
        finding = RankFinding.from_attach_reply(r - 1, reply.to_wire())
        finds = _set(es.finds, r - 1, self._finding(finding))
        self._drive(self.startup_machine, "attaching", "found", self._startup_state(finds[r - 1]), finding=finding)
        return self._with(s, e, replace(es, finds=finds), daemons=self._set_daemon(s, r, view))

    def Poll(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        f = es.finds[r - 1]
        if es.phase != "start" or f is None or not needs_wait(RankFinding(r - 1, f[0], f[1])):
            return None
        reply, _ = self._call(r, s.daemons[r - 1], "query", None)
        polled = RankFinding.from_query_reply(r - 1, reply.to_wire())
        if needs_wait(polled):
            return None  # still pending: polling again changes nothing
        self._drive(self.startup_machine, "waiting", "polled", "agreeing", finding=polled)
        return self._with(s, e, replace(es, finds=_set(es.finds, r - 1, self._finding(polled))))

    def Timeout(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        f = es.finds[r - 1]
        if es.phase != "start" or f is None or not needs_wait(RankFinding(r - 1, f[0], f[1])):
            return None
        timed = RankFinding(r - 1, f[0], f[1]).timed_out(300.0)
        self._drive(self.startup_machine, "waiting", "timed_out", "agreeing")
        return self._with(s, e, replace(es, finds=_set(es.finds, r - 1, self._finding(timed))))

    def Agree(self, s: SysState, e: str) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "start" or any(
            f is None or needs_wait(RankFinding(i, f[0], f[1])) for i, f in enumerate(es.finds)
        ):
            return None
        findings = [RankFinding(i, f[0], f[1]) for i, f in enumerate(es.finds) if f is not None]
        outcome = startup_decision(findings, self.engine_layout)
        end = {"fail": "failed", "adopt": "adopted", "keep_own": "kept"}[outcome.kind]
        self._drive(self.startup_machine, "agreeing", "decided", end, outcome=outcome)
        if outcome.failed:
            return self._with(s, e, self._blank_engine("failed"))
        record = outcome.record
        mode = rebalance_mode(outcome, ["daemon"] * self.R)
        shared = mode.enabled and mode.shared
        self._drive(self.rebalance_machine, "starting", "start", "idle" if shared else "off", mode=mode)
        return self._with(
            s,
            e,
            replace(
                es,
                phase="load",
                route=perms_of(record.rows) if record is not None else self.initial_perms,
                ever=record.version if record is not None else 0,
                share=mode.enabled and mode.shared,
            ),
        )

    def Fetch(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "load" or r in es.serv or any(q not in es.serv for q in range(1, r)):
            return None
        claim = None
        if e not in self.model.older:
            claim = FetchLayoutField(e, _session(e), es.ever, _digest(es.route))
        reply, view = self._call(r, s.daemons[r - 1], "fetch", claim)
        daemons = self._set_daemon(s, r, view)
        if reply.ok:
            serv = es.serv | {r}
            phase = "run" if len(serv) == self.R else "load"
            return self._with(s, e, replace(es, serv=serv, phase=phase), daemons=daemons)
        return self._with(s, e, self._blank_engine("failed"), daemons=daemons)

    def BeginChunk(self, s: SysState, e: str, c: frozenset[int]) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or not es.share or es.step != "idle" or s.moves >= self.model.max_moves:
            return None
        es2 = replace(es, step="begin", chunk=c, replies=("none",) * self.R, commits=(None,) * self.R)
        self._drive(self.rebalance_machine, "idle", "chunk", "beginning")
        return self._with(s, e, es2, moves=s.moves + 1)

    def Begin(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or es.step != "begin" or es.replies[r - 1] != "none" or "none" in es.replies[: r - 1]:
            return None
        req = BeginRequest(e, _session(e), es.ever, _layers(es.chunk))
        reply, view = self._call(r, s.daemons[r - 1], "begin", req)
        es2 = replace(es, replies=_set(es.replies, r - 1, reply.status.value))
        return self._with(s, e, es2, daemons=self._set_daemon(s, r, view))

    def Decide(self, s: SysState, e: str) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or es.step != "begin" or "none" in es.replies:
            return None
        decision = chunk_decision([_reply(word) for word in es.replies])
        share = es.share and decision.kind != "disable"
        if decision.kind == "proceed":
            es2 = replace(es, step="move")
        elif decision.abort_ranks:
            es2 = replace(es, step="abort", share=share)
        else:
            es2 = _idle(es, self.R, share=share)
        self._drive(self.rebalance_machine, "beginning", "begun", self._rebalance_state(es2), decision=decision)
        return self._with(s, e, es2)

    def Abort(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or es.step != "abort" or es.replies[r - 1] != "ok" or "ok" in es.replies[: r - 1]:
            return None
        reply, view = self._call(r, s.daemons[r - 1], "abort", AbortRequest(e, _session(e)))
        assert reply.ok, reply
        replies = _set(es.replies, r - 1, "aborted")
        es2 = _idle(es, self.R) if "ok" not in replies else replace(es, replies=replies)
        return self._with(s, e, es2, daemons=self._set_daemon(s, r, view))

    def MoveLayer(self, s: SysState, e: str, r: int, l: int) -> SysState | None:  # noqa: E741
        es = self._eng(s, e)
        if es.phase != "run" or es.step != "move" or l not in es.chunk:
            return None
        target = self.target(es)
        want = target[l - 1]
        if s.truth[r - 1][l - 1] == want:
            return None
        if any(k < l and s.truth[r - 1][k - 1] != target[k - 1] for k in es.chunk):
            return None  # layers move in increasing order
        truth = list(s.truth)
        truth[r - 1] = _set(truth[r - 1], l - 1, want)
        return replace(s, truth=tuple(truth))

    def Commit(self, s: SysState, e: str, r: int) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or es.step not in ("move", "commit") or es.replies[r - 1] != "ok":
            return None
        if "ok" in es.replies[: r - 1]:
            return None  # ranks commit in rank order
        target = self.target(es)
        if any(s.truth[q - 1][k - 1] != target[k - 1] for q in self.model.ranks for k in es.chunk):
            return None  # the device synchronize waits for every layer on every rank
        layers = _layers(es.chunk)
        req = CommitRequest(e, _session(e), layers, tuple(ROWS[target[i]] for i in layers))
        reply, view = self._call(r, s.daemons[r - 1], "commit", req)
        if reply.ok:
            word, got = "committed", (reply.data["version"], reply.data["digest"])
        else:
            word, got = "commit_refused", None
        es2 = replace(es, step="commit", replies=_set(es.replies, r - 1, word), commits=_set(es.commits, r - 1, got))
        if es.step == "move":
            self._drive(self.rebalance_machine, "moving", "moved", "committing")
        return self._with(s, e, es2, daemons=self._set_daemon(s, r, view))

    def Verify(self, s: SysState, e: str) -> SysState | None:
        es = self._eng(s, e)
        if es.phase != "run" or es.step != "commit":
            return None
        if any(w not in ("committed", "commit_refused") for w in es.replies):
            return None
        target = self.target(es)
        replies = [
            Reply(Status.OK, Reason.COMMITTED, "", {"version": c[0], "digest": c[1]})
            if c is not None
            else Reply(Status.REFUSED, Reason.NO_PENDING_MOVE, "")
            for c in es.commits
        ]
        verdict = verify_commits(replies, rows_of_perms(target), expected_version=es.ever + 1)
        es2 = _idle(
            replace(es, route=target, ever=es.ever + 1 if verdict.ok else es.ever),
            self.R,
            share=es.share and verdict.ok,
        )
        self._drive(self.rebalance_machine, "committing", "committed", self._rebalance_state(es2), verdict=verdict)
        return self._with(s, e, es2)

    def Crash(self, s: SysState, e: str) -> SysState | None:
        es = self._eng(s, e)
        if es.phase in ("failed", "dead"):
            return None
        return self._with(s, e, self._blank_engine("dead"))

    def Detach(self, s: SysState, r: int, e: str) -> SysState | None:
        view = s.daemons[r - 1]
        if e not in view.attachments or self._eng(s, e).phase not in ("failed", "dead"):
            return None
        _, view2 = self._call(r, view, "detach", e)
        return replace(s, daemons=self._set_daemon(s, r, view2))

    def Restart(self, s: SysState, r: int) -> SysState | None:
        view = s.daemons[r - 1]
        if not self.model.daemon_restarts or view.dirty is None or view.attachments:
            return None
        if any(r in es.serv for es in s.engines):
            return None
        truth = list(s.truth)
        truth[r - 1] = self.initial_perms
        return replace(s, daemons=self._set_daemon(s, r, DaemonView(self.initial_record)), truth=tuple(truth))

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
            nxt = fn(s, *params)
            if nxt is not None and nxt != s:
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
        """The spec's variables, in ``VARIABLES`` order, as ``layout_model.values`` values."""
        return (
            tuple(v.phase for v in s.daemons),
            tuple(0 if v.record is None else v.record.version for v in s.daemons),
            tuple(self.initial_perms if v.record is None else _perms_cached(v.record.rows) for v in s.daemons),
            tuple(_dpend(v) for v in s.daemons),
            tuple(frozenset(ModelValue(e) for e in v.attachments) for v in s.daemons),
            tuple(v.non_following_seen for v in s.daemons),
            s.truth,
            _fn(self.model.engines, [es.phase for es in s.engines]),
            _fn(self.model.engines, [tuple(self._find_rec(f) for f in es.finds) for es in s.engines]),
            _fn(self.model.engines, [es.route for es in s.engines]),
            _fn(self.model.engines, [es.ever for es in s.engines]),
            _fn(self.model.engines, [es.serv for es in s.engines]),
            _fn(self.model.engines, [es.share for es in s.engines]),
            _fn(self.model.engines, [_reb(es) for es in s.engines]),
            s.moves,
        )

    def spec_state(self, s: SysState) -> Record:
        """The spec's state as one value, a record of the variables: equal to TLC's state, decoded."""
        return Record(zip(VARIABLES, self.project(s), strict=True))

    def _find_rec(self, f: Finding) -> Record:
        if f is None:
            return _finding_rec("nothing", 0, self.initial_perms)
        kind, record = f
        word = "wait" if kind == "pending" else kind
        if record is None:
            return _finding_rec(word, 0, self.initial_perms)
        return _finding_rec(word, record.version, _perms_cached(record.rows))

    def render(self, s: SysState) -> str:
        return render_projection(self.project(s))

    @staticmethod
    def step_view(s: SysState) -> tuple[Any, ...]:
        """What the action properties read (``invariants.StepView``)."""
        return (
            tuple(v.phase for v in s.daemons),
            tuple(0 if v.record is None else v.record.version for v in s.daemons),
            tuple(es.ever for es in s.engines),
            tuple(es.phase in ("failed", "dead") for es in s.engines),
            tuple(frozenset(v.attachments) for v in s.daemons),
            tuple(es.serv for es in s.engines),
            tuple(None if v.pending is None else v.pending.engine_id for v in s.daemons),
        )


def render_projection(values: tuple[Any, ...]) -> str:
    return "\n".join(f"/\\ {name} = {_var_text(name, v)}" for name, v in zip(VARIABLES, values, strict=True))


@lru_cache(maxsize=200_000)
def _var_text(name: str, v: Any) -> str:
    # Keyed by the variable too: 0 == False in Python, so (0, 0) and (False, False) would share
    # one cache entry; within one variable the types never mix.
    return pretty(tlc_text(v))


def _tla_cached(v: Any) -> str:
    return tlc_text(v)


@lru_cache(maxsize=4096)
def _perms_cached(rows: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    return perms_of(rows)


@lru_cache(maxsize=4096)
def _finding_rec(word: str, version: int, perms: tuple[int, ...]) -> Record:
    return Record(found=word, fver=version, fmap=perms)


def _dpend(v: DaemonView) -> Any:
    move = v.pending if v.pending is not None else v.dirty
    if move is None:
        return ModelValue("NONE")
    layers = frozenset(x + 1 for x in move.layers)
    return Record(mover=ModelValue(move.engine_id), layers=layers, base=move.base_version)


def _reb(es: EngineState) -> Record:
    return Record(step=es.step, chunk=es.chunk, replies=es.replies)


@lru_cache(maxsize=16)
def _mvs(engines: tuple[str, ...]) -> tuple[ModelValue, ...]:
    return tuple(ModelValue(e) for e in engines)


def _fn(engines: tuple[str, ...], values: list[Any]) -> Any:
    return Fn(tuple(zip(_mvs(engines), values, strict=False)))


def _idle(es: EngineState, num_ranks: int, share: bool | None = None) -> EngineState:
    return replace(
        es,
        step="idle",
        chunk=frozenset(),
        replies=("none",) * num_ranks,
        commits=(None,) * num_ranks,
        share=es.share if share is None else share,
    )


def _set(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return (*t[:i], v, *t[i + 1 :])


def _session(engine: str) -> str:
    return "s-" + engine


def _layers(chunk: frozenset[int]) -> tuple[int, ...]:
    return tuple(sorted(layer - 1 for layer in chunk))


@lru_cache(maxsize=64)
def _digest(perms: tuple[int, ...]) -> str:
    return layout_digest(rows_of_perms(perms))


_BEGIN_REASON = {"ok": Reason.BEGUN, "busy": Reason.MOVE_PENDING, "refused": Reason.NOT_ATTACHED}


def _reply(word: str) -> Reply:
    """A begin reply of status ``word`` for ``chunk_decision``, which reads only the status.

    The spec keeps only the status of each begin reply, so the mirror's state does too (a
    reason kept here could split one spec state into several).
    """
    return Reply(Status(word), _BEGIN_REASON[word], "")


def _product(domains: list[list[Any]]) -> Iterator[tuple[Any, ...]]:
    if not domains:
        yield ()
        return
    for head in domains[0]:
        for rest in _product(domains[1:]):
            yield (head, *rest)


def label(name: str, params: tuple[Any, ...]) -> str:
    """The edge label of an action instance, as TLC's ``actionlabels`` prints it."""
    if not params:
        return name
    return f"{name}(" + ", ".join(_tla_cached(_param_value(p)) for p in params) + ")"


def _param_value(p: Any) -> Any:
    if isinstance(p, str):
        return ModelValue(p)
    return p
