"""Drive real daemon adapters through the spec's actions, and check them against the spec's states.

One `RealSystem` per behaviour: one real `LayoutAwareDaemon` per rank (sglang 0.5.23's serve loop
on a real Unix socket, in its own process or in a thread: `daemon_hosts`), and engines that talk
to them through the engine adapter's client code (`daemon_adapter.client`: one connection
per request, the long-lived `Attachment`) and take every step with their own
`layout_sm.session.EngineSession`, the object every rank of a real engine runs: it builds each
request and makes each decision; this file only sends and checks.

The binding of spec values to real ones (`spec/LayoutProtocol.tla`):

- engine `e1` is engine id "e1"; rank r (1-based) talks to daemon r; layer l (1-based) is
  wire layer l-1;
- a map `dmap[r]` is one of two permutations per layer: 0 -> `PERMS[0]`, 1 -> `PERMS[1]`;
- `Crash(e)` marks the engine dead (it sends nothing more); `Detach(r, e)` is the abrupt close of
  its attach connection to daemon r (what the kernel does when the process dies), then the test
  waits until daemon r reports that it noticed the EOF;
- `Restart(r)` is a fresh daemon (a SIGKILL and a new process, for `ProcessHost`); so is `Lose(r)`,
  whose engines (attached to daemon r or served by it) die with it: their connections to daemon r
  went with the old daemon, the others close at their `Detach` steps;
- `MoveLayer` changes only `truth` (the weights in memory), which `expert_layout_query` does not
  report: nothing is sent for it.

After every step each daemon's `expert_layout_query` must equal the daemon part of the spec's
state, and every reply must be the one the spec's action implies.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from tools.harness import daemon_proc
from tools.mirror.system import NUM_LOGICAL, ROWS, rows_of_perms
from tools.mirror.tlc_formats import Action
from tools.mirror.values import ModelValue, Record

from daemon_adapter import client
from layout_sm import messages
from layout_sm.engine import EngineLayout, Go
from layout_sm.messages import request_wire
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
    Fetched,
    FindingsGathered,
    Moved,
    Noticed,
    OwedGathered,
    ParkAnswered,
    Polled,
    RejoinAnswered,
    SourcesGathered,
)
from layout_sm.reasons import Reply
from layout_sm.record import layout_digest
from layout_sm.session import EngineSession
from tests.model_based.daemon_hosts import DaemonHandle, DaemonHost

NONE = ModelValue("NONE")
PERMS = ROWS  # the mirror's binding of the spec's two permutations (tools.mirror.system)
NOTICE_TIMEOUT_S = 5.0
WAIT_TIMEOUT_S = 300.0  # the engine's startup wait (docs/protocol.md §5), reported in a timed-out finding

# spec reply names (reb[e].replies) -> wire status
_BEGIN_STATUS = {"ok": "ok", "busy": "busy", "refused": "refused"}


class Mismatch(AssertionError):
    """The real system and the spec's state disagree (names the step and what differs)."""


def wire_layers(layers: frozenset[int]) -> list[int]:
    return sorted(layer - 1 for layer in layers)


def _name(v: Any) -> str:
    return v.name if isinstance(v, ModelValue) else str(v)


def _at(fn: Any, key: Any) -> Any:
    """`f[k]` for a spec function: a tuple for domain 1..n (k is 1-based), else a mapping."""
    if isinstance(fn, tuple):
        return fn[key - 1]
    return fn[key]


@dataclass
class EngineSide:
    """What the processes of one engine (all its ranks) hold: connections and the engine's session
    (None for an engine without the plugin)."""

    name: str
    session: EngineSession | None
    conns: dict[int, client.Attachment] = field(default_factory=dict)
    dead: bool = False

    @property
    def steps(self) -> EngineSession:
        assert self.session is not None, f"{self.name} runs no layout plugin"
        return self.session


class RealSystem:
    """Real daemons (one process per rank) and protocol-speaking engines, driven step by step."""

    def __init__(
        self,
        host: DaemonHost,
        init: Record,
        older: frozenset[str] = frozenset(),
        standbys: frozenset[str] = frozenset(),
        rejoins: bool = False,
    ) -> None:
        self.ranks = len(init["dphase"])
        self.standbys = standbys
        self.num_layers = len(_at(init["dmap"], 1))
        self.older = older
        self.initial_rows = rows_of_perms((0,) * self.num_layers)
        self.engine_layout = EngineLayout(
            num_layers=self.num_layers,
            num_physical=len(PERMS[0]),
            num_logical=NUM_LOGICAL,
            initial_digest=layout_digest(self.initial_rows),
            routes_by_metadata=True,
            rejoins=rejoins,  # the model's Rejoins
        )
        self.engines: dict[str, EngineSide] = {}
        self.daemons: dict[int, DaemonHandle] = {}
        self.log: list[str] = []
        self.touched: set[int] = set()  # daemons a step sent something to (checked after it)
        for r in range(1, self.ranks + 1):
            has_record = _at(init["dphase"], r) != "no_record"
            self.daemons[r] = host.start(f"d{r}", self.initial_rows if has_record else None, NUM_LOGICAL)

    # -- plumbing -----------------------------------------------------------------------

    def close(self) -> None:
        for eng in self.engines.values():
            for conn in eng.conns.values():
                with contextlib.suppress(OSError):
                    conn.close()
        for d in self.daemons.values():
            with contextlib.suppress(Exception):
                d.stop()

    def engine(self, e: Any) -> EngineSide:
        name = _name(e)
        if name not in self.engines:
            session = (
                None
                if name in self.older
                else EngineSession(name, self.ranks, self.engine_layout, standby=name in self.standbys)
            )
            self.engines[name] = EngineSide(name, session)
        return self.engines[name]

    def request(self, r: int, msg: dict[str, Any]) -> dict[str, Any]:
        self.touched.add(r)
        reply = client.request(self.daemons[r].socket_path, msg)
        self.log.append(f"  d{r} <- {msg.get('type')}: {reply.get('status')}({reply.get('reason', '')})")
        return reply

    def query(self, r: int) -> dict[str, Any]:
        return client.request(self.daemons[r].socket_path, messages.query_request(include_map=True))

    # -- one step ----------------------------------------------------------------------

    def step(self, action: Action, before: Record, after: Record) -> None:
        """Do `action` on the real system; raise Mismatch when a reply is not what the spec implies."""
        self.log.append(action.label)
        handler = getattr(self, f"do_{action.name}", None)
        if handler is None:
            raise Mismatch(f"no real counterpart for the spec action {action.name}")
        handler(before, after, *action.args)

    def do_Attach(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        self.touched.add(r)
        att = client.Attachment(self.daemons[r].socket_path, request_wire(eng.steps.next_request(r - 1)))
        wire = att.reply
        self.log.append(f"  d{r} <- attach {eng.name}: {wire.get('status')}({wire.get('reason')})")
        if wire.get("status") == "ok":
            eng.conns[r] = att
        else:
            att.close()
        eng.steps.step(Attached(r - 1, wire))
        self._expect_finding(eng, e, r, after, f"Attach({eng.name}, {r})")

    def do_Poll(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        wire = self.request(r, messages.query_request(include_map=True))
        ready = eng.steps.step(Polled(r - 1, wire))
        if ready.send is not None:
            raise Mismatch(f"Poll({eng.name}, {r}): the rank still waits ({ready.done}); the spec's move ended")
        self._expect_finding(eng, e, r, after, f"Poll({eng.name}, {r})")

    def do_Timeout(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        eng.steps.step(Polled(r - 1, None, now_s=WAIT_TIMEOUT_S))  # its wait began at 0
        self._expect_finding(eng, e, r, after, f"Timeout({eng.name}, {r})")

    def do_Agree(self, before: Record, after: Record, e: Any) -> None:
        eng = self.engine(e)
        outcome = eng.steps.step(FindingsGathered(eng.steps.view().findings)).done
        assert outcome is not None
        want_phase = after["ephase"][e]
        if outcome.go is Go.PAUSE:  # the rejoin branch: the fresh ranks are to rejoin, still starting
            marked = [f is not None and f.kind == "rejoin" for f in eng.steps.view().findings]
            spec = [_at(after["efind"][e], r)["found"] == "rejoin" for r in range(1, self.ranks + 1)]
            if want_phase != "start" or marked != spec:
                raise Mismatch(f"Agree({eng.name}): the session marks ranks {marked} to rejoin ({outcome.message}); "
                               f"the spec's engine goes to {want_phase!r}, marking {spec}")  # fmt: skip
            return
        if (outcome.go is Go.STOP) != (want_phase == "failed"):
            raise Mismatch(f"Agree({eng.name}): the session said {outcome.go.value} ({outcome.message}); "
                           f"the spec's engine goes to {want_phase!r}")  # fmt: skip
        if outcome.go is Go.STOP:
            return
        eng.steps.step(SourcesGathered(("daemon",) * self.ranks))
        view = eng.steps.view()
        route = rows_of_perms(after["eroute"][e])
        got_rows = tuple(tuple(row) for row in view.rows) if view.rows is not None else self.initial_rows
        if got_rows != route or view.version != after["ever"][e]:
            raise Mismatch(f"Agree({eng.name}): engine routes with version {view.version} map {got_rows}; "
                           f"spec: version {after['ever'][e]} map {route}")  # fmt: skip
        if view.shares != after["eshare"][e]:
            raise Mismatch(f"Agree({eng.name}): shared rebalance {view.shares}, spec {after['eshare'][e]}")

    def do_Fetch(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        msg: dict[str, Any] = {"type": "fetch_state", "config": daemon_proc.default_cache_config()}
        claim = None if eng.session is None else eng.session.fetch_claim(r - 1)
        if claim is not None:
            msg[messages.FETCH_FIELD] = request_wire(claim)
        wire = self.request(r, msg)
        if eng.session is not None:
            eng.session.step(Fetched(r - 1, wire))
        served = r in after["eserv"][e]
        if (wire.get("status") == "ok") != served:
            raise Mismatch(f"Fetch({eng.name}, {r}): daemon replied {wire.get('status')}({wire.get('reason')}): "
                           f"{wire.get('message')}; the spec {'serves' if served else 'refuses'}")  # fmt: skip
        if not served and wire.get("status") != "layout_refused":
            raise Mismatch(f"Fetch({eng.name}, {r}): refusal is {wire.get('status')}, expected layout_refused")

    def do_BeginChunk(self, before: Record, after: Record, e: Any, c: frozenset[int]) -> None:
        self.engine(e).steps.step(ChunkAsked(0, wire_layers(c)))

    def do_Begin(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        reply = Reply.from_wire(self.request(r, request_wire(eng.steps.next_request(r - 1))))
        eng.steps.step(BeginAnswered(r - 1, reply.to_wire()))
        want = _at(after["reb"][e]["replies"], r)
        if reply.status.value != _BEGIN_STATUS[want]:
            raise Mismatch(f"Begin({eng.name}, {r}): daemon replied {reply}; the spec's reply is {want!r}")

    def do_BeginUnanswered(self, before: Record, after: Record, e: Any, r: int) -> None:
        """The begin sent and taken as the daemon takes it; its reply is dropped before the rank reads it."""
        eng = self.engine(e)
        reply = Reply.from_wire(self.request(r, request_wire(eng.steps.next_request(r - 1))))
        took = _at(after["dphase"], r) == "pending" and _at(before["dphase"], r) != "pending"
        if reply.ok != took:
            raise Mismatch(f"BeginUnanswered({eng.name}, {r}): daemon replied {reply}; the spec "
                           f"{'takes' if took else 'does not take'} the move")  # fmt: skip
        eng.steps.step(BeginAnswered(r - 1, None))

    def do_BeginUnreached(self, before: Record, after: Record, e: Any, r: int) -> None:
        """The begin never sent: the rank has no answer, the daemon is unchanged."""
        self.engine(e).steps.step(BeginAnswered(r - 1, None))

    def do_Decide(self, before: Record, after: Record, e: Any) -> None:
        eng = self.engine(e)
        decision = eng.steps.step(Decided()).done
        assert decision is not None
        step = after["reb"][e]["step"]
        if (decision.go is Go.PROCEED) != (step == "move"):
            raise Mismatch(
                f"Decide({eng.name}): the session said {decision.go.value} ({decision.message}); spec step {step!r}"
            )
        if decision.go is not Go.PROCEED:
            oks = {r - 1 for r in range(1, self.ranks + 1) if _at(before["reb"][e]["replies"], r) == "ok"}
            aborts = {r for r in range(self.ranks) if isinstance(eng.steps.next_request(r), messages.AbortRequest)}
            if aborts != oks:
                raise Mismatch(f"Decide({eng.name}): aborts ranks {sorted(aborts)}; the spec aborts "
                               f"the ok ranks {sorted(oks)}")  # fmt: skip
        if eng.steps.view().shares != after["eshare"][e]:
            raise Mismatch(f"Decide({eng.name}): {decision.go.value} but the spec's eshare is {after['eshare'][e]}")

    def do_Abort(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        abort = eng.steps.next_request(r - 1)
        if not isinstance(abort, messages.AbortRequest):
            raise Mismatch(f"Abort({eng.name}, {r}): the session has no begun move of rank {r} to abort")
        reply = Reply.from_wire(self.request(r, request_wire(abort)))
        if reply.reason.value != "aborted":
            raise Mismatch(f"Abort({eng.name}, {r}): daemon replied {reply}; the spec aborts the move")
        eng.steps.step(Aborted(r - 1))

    def do_MoveLayer(self, before: Record, after: Record, e: Any, r: int, layer: int) -> None:
        pass  # truth only (see the module docstring)

    def _commit_request(self, before: Record, e: Any, r: int) -> Any:
        eng = self.engine(e)
        if eng.steps.view().rebalance == "moving":  # the first commit: sglang's move has ended
            return eng.steps.step(Moved(r - 1, self._target(before, e))).send
        return eng.steps.next_request(r - 1)

    def do_Commit(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        commit = self._commit_request(before, e, r)
        reply = Reply.from_wire(self.request(r, request_wire(commit)))
        eng.steps.step(CommitAnswered(r - 1, reply.to_wire()))
        want = _at(after["reb"][e]["replies"], r)
        if reply.ok != (want == "committed"):
            raise Mismatch(f"Commit({eng.name}, {r}): daemon replied {reply}; the spec's reply is {want!r}")

    def do_CommitRefused(self, before: Record, after: Record, e: Any, r: int) -> None:
        """The commit sent with rows the daemon cannot take (an expert the model does not have)."""
        eng = self.engine(e)
        commit = self._commit_request(before, e, r)
        bad = replace(commit, rows=tuple((-1,) * len(row) for row in commit.rows))
        reply = Reply.from_wire(self.request(r, request_wire(bad)))
        if reply.ok or reply.reason.value != "bad_rows":
            raise Mismatch(f"CommitRefused({eng.name}, {r}): daemon replied {reply}; the spec refuses the rows")
        eng.steps.step(CommitAnswered(r - 1, reply.to_wire()))

    def do_CommitUnanswered(self, before: Record, after: Record, e: Any, r: int) -> None:
        """The commit sent and recorded; its reply is dropped before the rank reads it."""
        eng = self.engine(e)
        reply = Reply.from_wire(self.request(r, request_wire(self._commit_request(before, e, r))))
        if not reply.ok:
            raise Mismatch(f"CommitUnanswered({eng.name}, {r}): daemon replied {reply}; the spec records the commit")
        eng.steps.step(CommitAnswered(r - 1, None))

    def do_Committed(self, before: Record, after: Record, e: Any) -> None:
        eng = self.engine(e)
        eng.steps.step(ChunkEnded())
        view = eng.steps.view()
        want = after["reb"][e]["owed"]
        good = eng.steps.model.owed_checks()  # the session's own guard: what the next all-gather will judge
        if (want == "good") != good or view.version != after["ever"][e]:
            check = "passes" if good else "fails"
            raise Mismatch(f"Committed({eng.name}): the session claims version {view.version} with a check that "
                           f"{check}; the spec's ever is {after['ever'][e]}, owed {want!r}")  # fmt: skip

    def do_Verify(self, before: Record, after: Record, e: Any) -> None:
        eng = self.engine(e)
        verdict = eng.steps.step(OwedGathered(eng.steps.view().owed)).done
        assert verdict is not None
        if (verdict.go is Go.PROCEED) != after["eshare"][e]:
            raise Mismatch(f"Verify({eng.name}): the session said {verdict.go.value} ({verdict.message}); "
                           f"spec eshare {after['eshare'][e]}")  # fmt: skip

    def do_Crash(self, before: Record, after: Record, e: Any) -> None:
        self.engine(e).dead = True  # its connections close when each daemon is to notice (Detach)

    # -- a warm standby (issue 18) ---------------------------------------------------------

    def do_Park(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        wire = self.request(r, request_wire(eng.steps.next_request(r - 1)))
        if wire.get("reason") != "parked":
            raise Mismatch(f"Park({eng.name}, {r}): daemon replied {wire.get('status')}({wire.get('reason')})")
        eng.steps.step(ParkAnswered(r - 1, wire))
        self._read_notices(r, [n for n in wire.get("notified", ()) if n != eng.name], f"Park({eng.name}, {r})")
        self._expect_claims(after, f"Park({eng.name}, {r})")

    def do_Claim(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        wire = self.request(r, request_wire(eng.steps.next_request(r - 1)))
        eng.steps.step(ClaimAnswered(r - 1, wire))
        self._expect_claims(after, f"Claim({eng.name}, {r})")

    def do_Promote(self, before: Record, after: Record, e: Any) -> None:
        eng = self.engine(e)
        step = eng.steps.step(ClaimsEnded()).done
        assert step is not None
        want = after["ephase"][e]
        got = {"proceed": "run", "stop": "failed", "pause": "parked"}[step.go.value]
        if got != want:
            raise Mismatch(f"Promote({eng.name}): the session said {step.go.value} ({step.message}); spec {want!r}")
        if want == "run":
            view = eng.steps.view()
            if view.rows is None or tuple(map(tuple, view.rows)) != rows_of_perms(after["eroute"][e]):
                raise Mismatch(f"Promote({eng.name}): routes with {view.rows}; spec {after['eroute'][e]}")
        self._expect_claims(after, f"Promote({eng.name})")

    def _read_notices(self, r: int, engines: list[str] | tuple[str, ...], where: str) -> None:
        """The notice the daemon wrote on each of ``engines``' attach connection to daemon ``r``: a live
        standby's rank reads it at once (its reader blocks on the connection); a dead one's is dropped."""
        for name in engines:
            eng = self.engines[name]
            conn = eng.conns.get(r)
            if conn is None:
                continue
            notice = conn.notice(NOTICE_TIMEOUT_S)
            if not messages.is_notice(notice):
                raise Mismatch(f"{where}: {name} got {notice!r} on its attach connection to daemon {r}, not the notice")
            self.log.append(f"  d{r} -> {name}: notice")
            if not eng.dead:
                eng.steps.step(Noticed(r - 1))

    def _expect_claims(self, after: Record, where: str) -> None:
        for name, eng in self.engines.items():
            if eng.dead or eng.session is None or name not in self.standbys:
                continue
            view = eng.steps.view()
            if view.role == "failed":
                continue
            want = tuple(_at(after["eclaim"][ModelValue(name)], r) for r in range(1, self.ranks + 1))
            if view.claims != want:
                raise Mismatch(f"{where}: {name}'s roles per rank are {view.claims}; the spec's are {want}")

    def do_Detach(self, before: Record, after: Record, r: int, e: Any) -> None:
        eng = self.engine(e)
        self.touched.add(r)
        eng.conns.pop(r).close()  # abrupt: no goodbye message, as when the process is killed
        deadline = time.monotonic() + NOTICE_TIMEOUT_S
        while time.monotonic() < deadline:
            if eng.name not in self.query(r).get("attached", []):
                self._read_notices_if_told(after, r, f"Detach({r}, {eng.name})")
                self._expect_claims(after, f"Detach({r}, {eng.name})")
                return
            time.sleep(0.002)
        raise Mismatch(f"Detach({r}, {eng.name}): daemon {r} did not notice the EOF within {NOTICE_TIMEOUT_S} s")

    def do_Restart(self, before: Record, after: Record, r: int) -> None:
        self.touched.add(r)
        if _at(before["dcopy"], r) != NONE and _at(after["dcopy"], r) == NONE:
            self._host_call(r, "spoil_copy", f"Restart({r}) from a copy it cannot use")
        self.daemons[r] = self.daemons[r].restart()

    def do_Persist(self, before: Record, after: Record, r: int) -> None:
        self.log.append(f"  d{r}: its writer writes the durable copy")
        self._host_call(r, "persist", f"Persist({r})")

    def _host_call(self, r: int, what: str, where: str) -> None:
        call = getattr(self.daemons[r], what, None)
        if call is None:
            raise Mismatch(f"{where}: daemon {r}'s host cannot {what} (daemon processes write their copies themselves)")
        call()

    def do_Lose(self, before: Record, after: Record, r: int) -> None:
        for name, eng in self.engines.items():
            e = ModelValue(name)
            if before["ephase"][e] not in ("failed", "dead") and (
                e in _at(before["datt"], r) or r in before["eserv"][e]
            ):
                eng.dead = True
        for eng in self.engines.values():  # their connections to the lost daemon went with it
            conn = eng.conns.pop(r, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        self.do_Restart(before, after, r)

    def do_AskRejoin(self, before: Record, after: Record, e: Any, r: int) -> None:
        eng = self.engine(e)
        # A record at the engine's initial map comes as a stamp (the daemons leave out a map the engine
        # knows): its rows are the engine's own, as the ranks' all-gather of the rows finds.
        target = eng.steps.view().findings[r - 1]
        initial = target is not None and getattr(target.record, "digest", None) == layout_digest(self.initial_rows)
        wire = self.request(r, request_wire(eng.steps.next_request(r - 1, self.initial_rows if initial else None)))
        eng.steps.step(RejoinAnswered(r - 1, wire))
        self._expect_finding(eng, e, r, after, f"AskRejoin({eng.name}, {r})")

    def _read_notices_if_told(self, after: Record, r: int, where: str) -> None:
        """The step left daemon ``r`` with only parked standbys attached, and not repairing (the spec's
        Notify): each of them reads the notice on its attach connection."""
        parked = sorted(_name(x) for x in _at(after["dpark"], r))
        alone = set(parked) == {_name(x) for x in _at(after["datt"], r)}
        if parked and alone and _at(after["dphase"], r) != "repairing":
            self._read_notices(r, parked, where)

    def do_RepairDone(self, before: Record, after: Record, r: int) -> None:
        self._end_repair(r, ok=True, phase="clean")
        self._read_notices_if_told(after, r, f"RepairDone({r})")
        self._expect_claims(after, f"RepairDone({r})")

    def do_RepairFails(self, before: Record, after: Record, r: int) -> None:
        self._end_repair(r, ok=False, phase="dirty")
        self._read_notices_if_told(after, r, f"RepairFails({r})")
        self._expect_claims(after, f"RepairFails({r})")

    def do_RepairAgain(self, before: Record, after: Record, r: int) -> None:
        """The operator's `expert-layout repair`: its reply comes when the reload ends (a later step)."""
        self.touched.add(r)
        path = self.daemons[r].socket_path
        self.log.append(f"  d{r} <- expert_layout_repair")
        threading.Thread(target=client.request, args=(path, messages.repair_request()), daemon=True).start()
        self._wait_phase(r, "repairing", "RepairAgain")

    def _end_repair(self, r: int, ok: bool, phase: str) -> None:
        self.touched.add(r)
        end_repair = getattr(self.daemons[r], "end_repair", None)
        if end_repair is None:
            raise Mismatch(f"daemon {r}'s host cannot end a repair (daemon processes have no fake reload)")
        end_repair(ok)
        self._wait_phase(r, phase, "RepairDone" if ok else "RepairFails")

    def _wait_phase(self, r: int, phase: str, where: str) -> None:
        deadline = time.monotonic() + NOTICE_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.query(r).get("phase") == phase:
                return
            time.sleep(0.002)
        raise Mismatch(f"{where}({r}): daemon {r} is not {phase} within {NOTICE_TIMEOUT_S} s")

    def _target(self, state: Record, e: Any) -> tuple[tuple[int, ...], ...]:
        chunk = state["reb"][e]["chunk"]
        route = state["eroute"][e]
        return rows_of_perms(tuple(1 - p if (i + 1) in chunk else p for i, p in enumerate(route)))

    def _expect_finding(self, eng: EngineSide, e: Any, r: int, after: Record, where: str) -> None:
        finding = eng.steps.view().findings[r - 1]
        assert finding is not None
        want = _at(after["efind"][e], r)
        kind = {"wait": "pending", "refused": "rejoin_refused"}.get(want["found"], want["found"])
        if finding.kind != kind:
            raise Mismatch(
                f"{where}: the rank found {finding.kind!r} ({finding.detail}); the spec finds {want['found']!r}"
            )
        if kind == "record":
            # By digest: a record of the engine's own initial map comes without its map (a stamp).
            assert finding.record is not None
            spec_map = rows_of_perms(want["fmap"])
            if finding.record.version != want["fver"] or finding.record.digest != layout_digest(spec_map):
                raise Mismatch(f"{where}: record version {finding.record.version}, spec {want['fver']} "
                               f"(digests differ; the spec's map {spec_map})")  # fmt: skip

    # -- the daemons' observable state -------------------------------------------------

    def check_daemons(self, state: Record, where: str, only_touched: bool = False) -> None:
        """Each daemon's `expert_layout_query` against the spec's state (after a step: the daemons it
        sent something to; a step that sends nothing cannot change a daemon)."""
        ranks = sorted(self.touched) if only_touched else range(1, self.ranks + 1)
        self.touched.clear()
        for r in ranks:
            got = self.query(r)
            want = expected_query(state, r)
            seen = {k: got.get(k) for k in want}
            if isinstance(seen["repairing"], dict):  # whether a repair is a rejoin: words for people, not state
                seen["repairing"] = {k: v for k, v in seen["repairing"].items() if k != "rejoin"}
            if seen != want:
                diff = {k: (seen[k], want[k]) for k in want if seen[k] != want[k]}
                raise Mismatch(f"after {where}: daemon {r} reports {diff} as (daemon, spec)")
            durable = got.get("durable") or {}
            if durable.get("enabled"):  # the version its durable copy holds: the spec's dcopy
                copy = _at(state["dcopy"], r)
                if durable.get("version") != (None if copy == NONE else copy["cver"]):
                    raise Mismatch(f"after {where}: daemon {r}'s copy holds {durable} where the spec's is {copy}")


def expected_query(state: Record, r: int) -> dict[str, Any]:
    """The fields of `expert_layout_query` that the daemon part of a spec state determines."""
    phase = _at(state["dphase"], r)
    pend = _at(state["dpend"], r)
    move = (
        None
        if not isinstance(pend, Record)
        else {"engine_id": _name(pend["mover"]), "layers": wire_layers(pend["layers"]), "base_version": pend["base"]}
    )
    has_record = phase != "no_record"
    rows = rows_of_perms(_at(state["dmap"], r))
    return {
        "phase": phase,
        "version": _at(state["dver"], r) if has_record else None,
        "digest": layout_digest(rows) if has_record else None,
        "map": [list(row) for row in rows] if has_record else None,
        "pending": move if phase == "pending" else None,
        "dirty": move if phase == "dirty" else None,
        "repairing": move if phase == "repairing" else None,
        "attached": sorted(_name(x) for x in _at(state["datt"], r)),
        "non_following_seen": _at(state["dnf"], r),
    }
