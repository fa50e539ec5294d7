"""Data-driven tests of one ``EngineSession``, in the manner of etcd's raft ``testdata/*.txt``.

The same file format as ``datadriven.py`` (a command, ``----``, the expected output, a blank
line; ``REWRITE=1`` regenerates the outputs, to review as a diff). Each command is one event the
session's ``step`` takes, as the mirror hands them (one rank's reply at a time); the output is what
the session says next (the ``Ready``: the request to send, the part to all-gather, the move, the map
to install, the attachment to close, and the step the sequence ends with: ``go(reason) severity:
message``) or the error it raised, then the session's state. The session is rank 0's process.

Commands (maps: ``initial`` is the engine's own, ``moved`` has layer 0's row rotated;
``narrow``, in a session with a redundant slot, is a map without it):
  session ranks=2 [static] [redundant=1]   a new engine E (static: it routes by the static layout)
  attach R record [version=N] [map=moved] | no_record [no_eplb] | pending | repairing | dirty | unreadable | none
                                           rank R's daemon's attach reply (no_record: an older daemon's,
                                           no_eplb: a layout-aware daemon without a record; none: no daemon
                                           at its socket; repairing: a daemon machine's own reply while it
                                           repairs layer 0)
  poll R record [version=N] [map=moved] | pending | repairing | dirty | lost
                                           a waiting rank's poll (lost: not answered)
  timeout R                                rank R polls past its wait's timeout
  agree                                    the ranks' findings, all-gathered: the agreement
  fetch R ok | refused | error
  loaded R ...                             the ranks' gathered load results: the listed ranks loaded
  start daemon disk none ... [elastic]     where each rank's weights came from, gathered (none: unknown)
  install ok | missing                     a rebalance begins: whether sglang applied every hook
  rebalance                                a rebalance begins (every hook in place)
  chunk [0]
  begin R ok | busy | refused | none       rank R's begin reply (none: no readable reply)
  decide
  abort R                                  rank R aborted its begun move
  move [map=moved]                         sglang moved the chunk: the engine's whole new map
  commit R ok [version=N] [map=moved] | refused | none
  committed                                the chunk ends: route moved, claim the next version, owe the check
  verify                                   the all-gather that ends a rebalance checks what is owed
  session ranks=2 standby                  a warm standby E
  park R [notified]                        rank R's park reply (notified: it is the notice)
  notice R                                 rank R's daemon wrote the notice on its attach connection
  notices [R ...]                          the gathered notices: the listed ranks' readers have theirs
  next park | claim                        the rank that parks or claims next (none: no rank)
  claim R granted [version=N] [map=moved] | taken | dirty
                                           rank R's claim reply
  promote                                  the claims ended
"""

from __future__ import annotations

import ast
import shlex
from typing import Any

from layout_sm.daemon import DaemonMachine, Detach
from layout_sm.engine import EngineLayout, RankAnswer, RankFinding, Step
from layout_sm.messages import SGLANG_UNKNOWN_REQUEST, AbortRequest, AttachRequest, BeginRequest
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
    LoadsGathered,
    Moved,
    Noticed,
    NoticesGathered,
    OwedGathered,
    ParkAnswered,
    Polled,
    Ready,
    RebalanceAsked,
    SourcesGathered,
    Started,
    Unanswered,
)
from layout_sm.reasons import Reason, busy, ok, refused
from layout_sm.record import LayoutRecord, layout_digest
from layout_sm.session import DEFAULT_WAIT_TIMEOUT_S, EngineSession

INITIAL = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED = ((1, 2, 3, 0), (3, 2, 1, 0))
MAPS = {"initial": INITIAL, "moved": MOVED, "other": ((2, 3, 0, 1), (3, 2, 1, 0))}
WIDER = {"initial": ((0, 1, 2, 3, 0), (3, 2, 1, 0, 3)), "narrow": INITIAL}  # an engine with a redundant slot


class SessionRunner:
    def __init__(self) -> None:
        self.session: EngineSession | None = None
        self.maps = MAPS

    def run(self, line: str) -> str:
        words = shlex.split(line)
        command, positional = words[0], [w for w in words[1:] if "=" not in w]
        args = {k: _literal(v) for k, v in (w.split("=", 1) for w in words[1:] if "=" in w)}
        if command == "session":
            redundant = int(args.get("redundant", 0))  # type: ignore[arg-type]
            self.maps = MAPS if redundant == 0 else WIDER
            initial = self.maps["initial"]
            layout = EngineLayout(2, len(initial[0]), 4, layout_digest(initial), "static" not in positional)
            self.session = EngineSession(
                "E",
                int(args["ranks"]),  # type: ignore[arg-type]
                layout,
                standby="standby" in positional,
            )
            self.session.step(Started(0, initial))  # rank 0's process
            return _render_state(self.session)
        session = self.session
        assert session is not None, "start with a 'session' command"
        try:
            out = self._step(session, command, positional, args)
        except Exception as error:  # the refusal of a step its state does not allow is the output
            out = f"error: {type(error).__name__}: {error}"
        return f"{out}\n{_render_state(session)}"

    def _record(self, args: dict[str, Any]) -> LayoutRecord:
        return LayoutRecord.build(self.maps[str(args.get("map", "initial"))], 4, int(args.get("version", 0)))

    def _step(self, session: EngineSession, command: str, positional: list[str], args: dict[str, Any]) -> str:
        rank = int(positional[0]) if positional and positional[0].isdigit() else -1
        what = positional[1] if len(positional) > 1 else ""
        ranks = range(session.view().num_ranks)
        event: Event
        if command == "attach":
            event = Attached(rank, self._attach_reply(rank, what, positional, args))
        elif command == "poll":
            event = Polled(rank, self._query(what, args))
        elif command == "timeout":
            event = Polled(rank, None, now_s=DEFAULT_WAIT_TIMEOUT_S)  # the session began its wait at 0
        elif command == "agree":
            event = FindingsGathered([f for f in session.view().findings if f is not None])
        elif command == "fetch":
            event = Fetched(rank, _fetch_reply(what))
        elif command == "loaded":
            event = LoadsGathered([str(r) in positional for r in ranks])
        elif command == "install":
            event = RebalanceAsked(0, "hooks X were not applied" if "missing" in positional else None)
        elif command == "start":
            sources = [None if s == "none" else s for s in positional if s != "elastic"]
            event = SourcesGathered(sources, elastic_ep="elastic" in positional)
        elif command == "rebalance":
            return self._render(session.step(RebalanceAsked(0))) + f"\nshares: {'yes' if session.shares else 'no'}"
        elif command == "chunk":
            event = ChunkAsked(0, ast.literal_eval(positional[0]))
        elif command == "begin":
            event = BeginAnswered(rank, _begin_reply(what, session.view().version))
        elif command == "decide":
            ready = session.step(Decided())
            aborts = [r for r in ranks if isinstance(session.next_request(r), AbortRequest)]
            return self._render(ready) + (f"\nabort: ranks {aborts}" if aborts else "")
        elif command == "abort":
            event = Aborted(rank)
        elif command == "move":
            event = Moved(0, self.maps[str(args.get("map", "moved"))])
        elif command == "commit":
            event = CommitAnswered(rank, self._commit_reply(what, session, args))
        elif command == "committed":
            event = ChunkEnded()
        elif command == "verify":
            event = OwedGathered(session.view().owed)
        elif command == "park":
            notified = ["E"] if "notified" in positional else []
            event = ParkAnswered(rank, ok(Reason.PARKED, "parked", notified=notified).to_wire())
        elif command == "notice":
            event = Noticed(rank)
        elif command == "notices":
            event = NoticesGathered([str(r) in positional for r in ranks])
        elif command == "next":
            nxt = session.model.next_to_park() if positional[0] == "park" else session.model.next_to_claim()
            return f"next: {'none' if nxt is None else nxt}"
        elif command == "claim":
            event = ClaimAnswered(rank, self._claim_reply(what, args))
        elif command == "promote":
            event = ClaimsEnded()
        else:
            raise ValueError(f"unknown session command {command!r}")
        return self._render(session.step(event))

    def _render(self, ready: Ready) -> str:
        """What the session says next, one line a part."""
        lines = []
        if ready.close:
            lines.append("close the attachment")
        if ready.install is not None:
            lines.append(f"install: {_map_name(self.maps, ready.install)}")
        if ready.send is not None:
            later = " (its reply read later)" if ready.read_later else ""
            lines.append(f"send: {type(ready.send).__name__}{later}")
        if ready.gathers:
            lines.append(f"gather: {_render_part(ready.gather)}")
        if ready.move:
            lines.append("move: sglang moves the chunk")
        if ready.await_notice_s is not None:
            lines.append(f"await the notice ({ready.await_notice_s:.0f} s)")
        if ready.next is not None:
            lines.append(f"next: {type(ready.next).__name__}")
        if ready.done is not None:
            lines.append(_render_step(ready.done) + (" (repeat)" if ready.repeat else ""))
        return "\n".join(lines) or "nothing"

    def _attach_reply(self, rank: int, kind: str, positional: list[str], args: dict[str, Any]) -> object:
        """Rank ``rank``'s daemon's attach reply, from a daemon machine in that state."""
        if kind == "none":
            return Unanswered("no weight cache daemon socket at /run/wc.sock", absent=True)
        if kind == "unreadable":
            return Unanswered("the attach was not answered (ConnectionRefusedError)")
        if kind == "no_record" and "no_eplb" not in positional:  # an older daemon: sglang's own answer
            return {"status": "error", "message": f"{SGLANG_UNKNOWN_REQUEST}: 'expert_layout_attach'"}
        record = None if kind == "no_record" else self._record(args)
        daemon = _repairing_daemon(record) if kind == "repairing" else DaemonMachine(record, auto_repair=False)
        if kind in ("pending", "dirty"):
            daemon.handle(AttachRequest("X"), session="sX")
            daemon.handle(BeginRequest("X", "sX", record.version, (0,)))  # type: ignore[union-attr]
        if kind == "dirty":
            daemon.handle(Detach("X", "sX"))
        return daemon.handle(AttachRequest("E"), session=f"s{rank}").reply.to_wire()

    def _query(self, what: str, args: dict[str, Any]) -> object:
        if what == "lost":
            return Unanswered("its expert_layout_query was not answered (ConnectionRefusedError)")
        reply: dict[str, Any] = {"status": "ok", "reason": "queried", "message": "", "has_record": True}
        if what == "dirty":
            return {**reply, "dirty": {"engine_id": "X", "layers": [0], "base_version": 0}}
        if what == "repairing":
            return _repairing_daemon(self._record(args)).query_state(include_map=True).to_wire()
        reply.update(self._record(args).to_wire(include_map=True))
        if what == "pending":
            reply["pending"] = {"engine_id": "X", "layers": [0], "base_version": 0}
        return reply

    def _claim_reply(self, what: str, args: dict[str, Any]) -> Any:
        if what == "granted":
            record = self._record(args)
            return ok(Reason.PROMOTED, "primary", version=record.version, record=record.to_wire()).to_wire()
        if what == "taken":
            return busy(Reason.PRIMARY_ATTACHED, "engines ['P'] are attached and not parked").to_wire()
        return refused(Reason.DIRTY, "the layout is unknown: engine 'P' went away while moving layers [0]").to_wire()

    def _commit_reply(self, what: str, session: EngineSession, args: dict[str, Any]) -> Any:
        if what == "none":
            return None
        if what == "refused":
            return refused(Reason.BAD_ROWS, "rows do not fit").to_wire()
        version = int(args.get("version", session.view().version + 1))
        digest = layout_digest(self.maps[str(args.get("map", "moved"))])
        return ok(Reason.COMMITTED, f"recorded version {version}", version=version, digest=digest).to_wire()


def _repairing_daemon(record: LayoutRecord) -> DaemonMachine:
    """A daemon whose mover X left mid-move of layer 0: it repairs it (auto repair)."""
    daemon = DaemonMachine(record)
    daemon.handle(AttachRequest("X"), session="sX")
    daemon.handle(BeginRequest("X", "sX", record.version, (0,)))
    daemon.handle(Detach("X", "sX"))
    assert daemon.phase == "repairing"
    return daemon


def _fetch_reply(what: str) -> dict[str, Any]:
    if what == "ok":
        return {"status": "ok", "entries": {}}
    if what == "refused":
        return {"status": "layout_refused", "reason": "digest_mismatch", "message": "the layout differs"}
    return {"status": "error", "message": "cache config mismatch"}


def _begin_reply(what: str, version: int) -> Any:
    if what == "ok":
        return ok(Reason.BEGUN, "begun", version=version).to_wire()
    if what == "busy":
        return busy(Reason.OTHER_ENGINE_ATTACHED, "engine 'S' is attached").to_wire()
    if what == "refused":
        return refused(Reason.NON_FOLLOWING_SEEN, "an engine without the plugin was served").to_wire()
    return None


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _map_name(maps: dict[str, Any], rows: Any) -> str:
    return next((name for name, m in maps.items() if m == rows), repr(rows))


def _render_part(part: Any) -> str:
    """A part of an all-gather: a finding by its kind, an answer by its status, a pair, or the value."""
    if isinstance(part, tuple):
        return "(" + ", ".join(_render_part(p) for p in part) + ")"
    if isinstance(part, dict) and "kind" in part:
        return f"finding {part['kind']}"
    if isinstance(part, RankAnswer):
        return _render_answer(part)
    return repr(part)


def _render_step(step: Step) -> str:
    return f"{step.go.value}({step.reason.value}) {step.severity.name.lower()}: {step.message}"


def _render_finding(f: RankFinding | None) -> str:
    if f is None:
        return "-"
    return f.kind if f.record is None else f"{f.kind}@v{f.record.version}"


def _render_answer(a: Any) -> str:
    return "-" if a is None else ("none" if a.status is None else a.status.value)


def _render_state(session: EngineSession) -> str:
    v = session.view()
    findings = ",".join(_render_finding(f) for f in v.findings)
    line = f"state: {v.phase}/{v.rebalance} v{v.version} shares={'yes' if v.shares else 'no'} found=[{findings}]"
    if v.served:
        line += f" served={sorted(v.served)}"
    if v.claims:
        line += f" role={v.role} claims=[{','.join(v.claims)}]"
    if v.chunk:
        line += f" chunk={list(v.chunk)} begins=[{','.join(_render_answer(a) for a in v.begins)}]"
        if v.aborted:
            line += f" aborted={sorted(v.aborted)}"
        if any(a is not None for a in v.commits):
            line += f" commits=[{','.join(_render_answer(a) for a in v.commits)}]"
    if v.owed:
        line += f" owed=[{','.join(_render_answer(a) for a in v.owed)}]"
    return line
