"""Data-driven tests of one ``EngineSession``, in the manner of etcd's raft ``testdata/*.txt``.

The same file format as ``datadriven.py`` (a command, ``----``, the expected output, a blank
line; ``REWRITE=1`` regenerates the outputs, to review as a diff). Each command is one step of
the session as the plugin takes it; the output is the step's ``Step`` (``go(reason) severity:
message``) or the error it raised, then the session's state.

Commands (maps: ``initial`` is the engine's own, ``moved`` has layer 0's row rotated;
``narrow``, in a session with a redundant slot, is a map without it):
  session ranks=2 [static] [redundant=1]   a new engine E (static: it routes by the static layout)
  attach R record [version=N] [map=moved] | no_record [no_eplb] | pending | repairing | dirty | unreadable | none
                                           what rank R found (none: no daemon at its socket; repairing:
                                           a daemon machine's own attach reply while it repairs layer 0)
  poll R record [version=N] [map=moved] | pending | repairing | dirty | lost
                                           a waiting rank's poll (lost: not sent)
  timeout R                                the wait of rank R ran out
  gather                                   the ranks' findings, all-gathered
  agree
  fetch R ok | refused | error
  loaded R ...                             the ranks' gathered load results: the listed ranks loaded
  start daemon disk none ... [elastic]     where each rank's weights came from (none: unknown)
  install ok | missing                     whether sglang applied every hook of the plugin
  rebalance
  chunk [0]
  begin R ok | busy | refused | none       rank R's begin reply (none: no readable reply)
  decide
  abort R                                  rank R aborted its begun move
  move [map=moved]                         sglang moved the chunk: the engine's whole new map
  commit R ok [version=N] [map=moved] | refused | none
  committed                                the chunk ends: route moved, claim the next version, owe the check
  verify                                   the all-gather that ends a rebalance checks what is owed
  session ranks=2 standby                  a warm standby E (issue 18)
  park R [notified]                        rank R's park reply (notified: it is the notice)
  notice R                                 rank R's daemon wrote the notice on its attach connection
  notices [R ...]                          the gathered notices: the listed ranks' readers have theirs
  next park | claim                        the rank that parks or claims next (none: no rank)
  claim R granted [version=N] [map=moved] | taken | dirty
                                           rank R's claim reply
  promote                                  the gathered claims
"""

from __future__ import annotations

import ast
import shlex
from typing import Any

from layout_sm.daemon import DaemonMachine
from layout_sm.engine import EngineLayout, RankFinding, Step
from layout_sm.messages import AttachRequest, BeginRequest
from layout_sm.reasons import Reason, busy, ok, refused
from layout_sm.record import LayoutRecord, layout_digest
from layout_sm.session import EngineSession

INITIAL = ((0, 1, 2, 3), (3, 2, 1, 0))
MOVED = ((1, 2, 3, 0), (3, 2, 1, 0))
MAPS = {"initial": INITIAL, "moved": MOVED}
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
        if command == "attach":
            return _render_step(session.found(rank, self._finding(rank, what, positional, args), f"s{rank}"))
        if command == "poll":
            return _render_step(session.polled(rank, self._query(what, args)))
        if command == "timeout":
            return _render_step(session.timed_out(rank, 300.0))
        if command == "gather":
            session.gathered([session.finding(r) for r in range(session.view().num_ranks)])
            return "gathered"
        if command == "agree":
            step = session.agree()
            installs = session.layout_to_install()
            return _render_step(step) + ("" if installs is None else f"\ninstall: {_map_name(self.maps, installs)}")
        if command == "fetch":
            return _render_step(session.fetched(rank, _fetch_reply(what)))
        if command == "loaded":
            listed = {int(r) for r in positional}
            return _render_step(session.loaded_all([r in listed for r in range(session.view().num_ranks)]))
        if command == "install":
            session.install_checked("hooks X were not applied" if "missing" in positional else None)
            return "checked"
        if command == "start":
            sources = [None if s == "none" else s for s in positional if s != "elastic"]
            return _render_step(session.start_rebalance(sources, elastic_ep="elastic" in positional))
        if command == "rebalance":
            step = session.rebalance()
            return _render_step(step) + f"\nshares: {'yes' if session.shares else 'no'}"
        if command == "chunk":
            session.begin_chunk(ast.literal_eval(positional[0]))
            return "chunk begun"
        if command == "begin":
            session.begun(rank, _begin_reply(what, session.view().version))
            return "answered"
        if command == "decide":
            step = session.decide()
            aborts = [r for r in range(session.view().num_ranks) if session.abort_request(r) is not None]
            return _render_step(step) + (f"\nabort: ranks {aborts}" if aborts else "")
        if command == "abort":
            session.aborted(rank)
            return "aborted"
        if command == "move":
            session.moved(self.maps[str(args.get("map", "moved"))])
            return "moved"
        if command == "commit":
            session.committed(rank, self._commit_reply(what, session, args))
            return "answered"
        if command == "committed":
            return _render_step(session.chunk_committed())
        if command == "verify":
            return _render_step(session.verify())
        if command == "park":
            session.park_request(rank)  # raises when the rank has no park to send
            notified = ["E"] if "notified" in positional else []
            return _render_step(session.parked(rank, ok(Reason.PARKED, "parked", notified=notified).to_wire()))
        if command == "notice":
            return _render_step(session.noticed(rank))
        if command == "notices":
            listed = {int(r) for r in positional}
            return _render_step(session.noticed_all([r in listed for r in range(session.view().num_ranks)]))
        if command == "next":
            nxt = session.next_to_park() if positional[0] == "park" else session.next_to_claim()
            return f"next: {'none' if nxt is None else nxt}"
        if command == "claim":
            session.claim_request(rank)  # raises when the rank may not claim yet
            return _render_step(session.claimed(rank, self._claim_reply(what, args)))
        if command == "promote":
            step = session.promote()
            installs = session.layout_to_install()
            shown = step.go.value == "proceed" and installs is not None
            return _render_step(step) + (f"\ninstall: {_map_name(self.maps, installs)}" if shown else "")
        raise ValueError(f"unknown session command {command!r}")

    def _finding(self, rank: int, kind: str, positional: list[str], args: dict[str, Any]) -> RankFinding:
        if kind == "none":
            return RankFinding.no_daemon(rank, "no socket")
        if kind in ("record", "pending"):
            detail = "engine 'X' is moving layers [0] from version 0" if kind == "pending" else ""
            return RankFinding(rank, kind, self._record(args), detail)  # type: ignore[arg-type]
        if kind == "repairing":
            reply = _repairing_daemon(self._record(args)).attach_engine(AttachRequest("E"), "sE")
            return RankFinding.from_attach_reply(rank, reply.to_wire())
        if kind == "no_record":
            return RankFinding(rank, "no_record", detail="no record", without_eplb="no_eplb" in positional)
        if kind == "dirty":
            return RankFinding(rank, "dirty", detail="engine 'X' went away while moving layers [0]")
        return RankFinding.unreachable(rank, "connection refused")

    def _query(self, what: str, args: dict[str, Any]) -> dict[str, Any] | None:
        if what == "lost":
            return None
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
    daemon.attach_engine(AttachRequest("X"), "sX")
    daemon.begin_move(BeginRequest("X", "sX", record.version, (0,)))
    daemon.detach_engine("X", "sX")
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
