"""``python -m tools.trace_check PATH...``: is each daemon and engine trace a behaviour of the protocol?

A daemon trace (``daemon_adapter.trace``, written with ``SGLANG_EXPERT_LAYOUT_TRACE``) is replayed on
a fresh ``layout_sm.daemon.DaemonMachine`` (the daemon part of the mirror, whose graphs equal TLC's),
loaded as the trace's ``start`` line says. For each step the machine must take the logged event with
the logged payload, give the logged answer, and end in the logged record (phase, version, digest,
pending move, attachments, parked standbys; the digest stands for the map). A ``fetch_served`` must
name the step of a layout check that passed: handles sent without one are the fetch gate bypassed.
A ``notice_sent`` must go to a parked standby that a step's answer named (``notified``): a notice the
machine did not decide (an unparked engine still attached, or the daemon repairing) breaks the spec's
``NoticeOnlyWhenFree``.
Nothing is left to guess: every variable of the daemon's part of the spec is logged after each step.
A last line cut short (the daemon SIGKILLed while writing it) is left out, and a file killed before its
start line was whole holds no step.

An engine rank's trace (``engine-*.ndjson``) is replayed on a fresh ``layout_sm.session.EngineSession``
built as its start line says: each event must be enabled, give the logged result and end in the
logged view. At each ``rebalance_end`` no check of a commit may be owed (the spec's
``(reb[e].owed # "none") ~> (reb[e].owed = "none")``, which a finished rebalance must have met).
A ``routes`` line is the digest of the map sglang's model runner routes with, read back from it after
an install or a move: it must be the digest of the map the session says the engine routes with (the
map startup or a takeover installed, with each move since), so a map that sglang took otherwise than
the session believes (a layer left out of an install, a row moved outside the chunk) is reported. The
session takes a move with its commit's answer: a ``routes`` line written after sglang's move is checked
when the ``move`` step that follows it is replayed (a rank killed before that leaves it unchecked).

A ``truth`` line is a reading of a daemon's memory slot by slot, written by a rank (the harness) or by a
memory probe (``probe-*.ndjson``: the demo, the real-server chaos schedules), with the times it began
and ended. It is taken into the replay of the daemon on that socket at that moment: where the record
is clean, its rows for those slots must be what the memory holds (the spec's ``CleanRecordIsTruth``).
A reading during which the daemon took a step is left out.

Then the processes are checked together, per folder (one machine's run): every answer an engine rank
took from its own daemon (begin, commit, claim) must be an answer that daemon's trace gave that
engine, in the same order. Each rank sends its daemon one request at a time on its own connection,
so the two orders are the same without any clock. A rank's answer that no daemon step gave (a grant
the daemon never made, a commit the engine took as recorded) is reported with the daemon's answers,
and so is one taken before the daemon's step that gave it (on the machine's monotonic clock: the
daemon stamps its step before it replies, the rank stamps its line after it took the answer).

And in one order, by ``t_ns``: the folder's lines merged on one machine's monotonic clock. Each line is
stamped after the step it records, and a daemon's step is stamped before its reply is sent, so the
merged order keeps every message's order; the rule it checks needs no more. A daemon lost (its socket's
next ``start``) ends every engine attached to it that it served its weights, as the spec's ``Lose``: on
a GPU their ranks map the daemon's memory. A line of such an engine after that start was written by a
process that outlived the daemon it maps, which no per-process replay can see. The clock orders one
machine's processes only: a run across machines needs its traces per machine.

The first line that the protocol does not explain is reported with the state before it, the
machine's own answer, and the phase changes the machine declares from there. PATH: trace files or
folders of them. Exit status 0 when every trace is a behaviour, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layout_sm.daemon import DaemonMachine
from layout_sm.durable import copy_due
from layout_sm.engine import RankAnswer
from layout_sm.engine_machines import RebalanceMachine
from layout_sm.reasons import Reply
from layout_sm.record import LayoutRecord, layout_digest
from layout_sm.session import EngineSession
from layout_sm.trace_codec import decode, encode, engine_state_after, state_after
from tools.trace_files import Lines, by_socket, read_lines, read_trace, step_engine, trace_files

# The engine events whose answer is its own rank's daemon's reply, and the argument that holds it.
_ANSWERED = {"begin": "answer", "commit": "answer", "claim": "reply"}


@dataclass
class Divergence:
    """The first line of a trace that the protocol does not explain."""

    seq: int
    line: dict[str, Any]
    why: str
    before: dict[str, Any]
    phase_changes: list[str]

    def report(self, path: Path) -> str:
        shown = {k: v for k, v in self.line.items() if k not in ("after",)}
        return (
            f"{path}: line seq {self.seq} is no step of the protocol: {self.why}\n"
            f"  the line: {json.dumps(shown)}\n"
            f"  the record before it: {json.dumps(self.before)}\n"
            f"  the phase changes the machine declares from there: {', '.join(self.phase_changes) or 'none'} "
            f"(every loaded phase answers every request)"
        )


@dataclass
class Verdict:
    path: Path
    steps: int = 0
    fetches_served: int = 0
    seconds: float = 0.0
    divergence: Divergence | None = None
    notices_sent: int = 0
    events: dict[str, int] = field(default_factory=dict)
    cut_short: bool = False  # its last line was cut by a kill

    # "daemon", "engine", "answers" (a folder's engines against its daemons) or "order" (in one order)
    kind: str = "daemon"
    matched: int = 0  # answers matched with their daemon's step ("answers")
    truths: int = 0  # readings of the daemon's memory checked against its record

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _phase_changes(machine: DaemonMachine, phase: str) -> list[str]:
    state = machine.states_map[phase]
    return sorted({f"{t.event} -> {t.target.id}" for t in state.transitions if t.target.id != state.id})


def _begins(first: dict[str, Any] | None, verdict: Verdict) -> bool:
    """Whether a trace whose first line is ``first`` has steps to replay. None: the process was killed
    before its start line was whole (a file opened, nothing written), a trace cut short with no step."""
    if first is None:
        verdict.cut_short = True
    elif first.get("kind") != "start":
        verdict.divergence = Divergence(0, first, "the trace does not begin with its start line", {}, [])
    return first is not None and verdict.divergence is None


def _lines(path: Path, verdict: Verdict) -> Iterator[dict[str, Any]]:
    """The trace's lines; a last line cut short (the daemon SIGKILLed while writing it) is left out."""
    lines, verdict.cut_short = read_lines(path)
    yield from lines


def _started(line: dict[str, Any]) -> DaemonMachine:
    """The machine of a daemon just loaded, as its start line says (at its durable copy's version, where
    it started from one)."""
    rows = decode(line["rows"])
    record = None if rows is None else LayoutRecord.build(rows, line["num_logical"], line.get("version", 0))
    return DaemonMachine(record, auto_repair=line["auto_repair"])


def _copy_at_start(line: dict[str, Any], machine: DaemonMachine) -> LayoutRecord | None:
    """The record the durable copy holds when the daemon starts: the record it started with (``machine``,
    from ``_started``), where that came from a whole copy."""
    return machine.view().record if line.get("copy") == "whole" else None


@dataclass
class _Owed:
    """What the steps so far let the daemon send: handles, after each fetch check that passed (by its
    ``seq``), and a notice to each parked standby a step's answer named."""

    fetches: set[int] = field(default_factory=set)
    notices: set[str] = field(default_factory=set)
    copy: LayoutRecord | None = None  # the record the durable copy holds (None: none yet, or unknown)


def _notified(answer: Any) -> tuple[str, ...]:
    """The parked standbys an answer of the machine tells (a park's, a repair end's, a detach's)."""
    if isinstance(answer, Reply):
        return tuple(answer.data.get("notified", ()))
    return tuple(getattr(answer, "notified", ()))


def _replay(machine: DaemonMachine, line: dict[str, Any], owed: _Owed, verdict: Verdict) -> str | None:
    """Take one line on ``machine``; why it is no step of the protocol, or None."""
    kind = line.get("kind")
    if kind == "notice_sent":
        if line.get("engine") not in owed.notices:
            return (
                f"a notice went to parked standby {line.get('engine')!r}, which no step's answer named: "
                "the primary role was not free (an unparked engine attached, or the daemon repairing)"
            )
        owed.notices.discard(line["engine"])
        verdict.notices_sent += 1
        return None
    if kind == "fetch_served":
        if line.get("check_seq") not in owed.fetches:
            return "sglang's handles were served without a layout check that passed"
        owed.fetches.discard(line["check_seq"])
        verdict.fetches_served += 1
        return None
    if kind == "persist":
        due = copy_due(machine.view(), owed.copy)
        if due is None:
            return "the durable copy was written with no record due (the daemon not clean, or its copy already that)"
        after = _json(state_after(machine.view()))
        if after != line["after"]:
            return f"the copy holds {json.dumps(line['after'])}, the record is {json.dumps(after)}"
        owed.copy = due
        verdict.events["persist"] = verdict.events.get("persist", 0) + 1
        return None
    if kind != "step":
        return f"a line of unknown kind {kind!r}"
    event = line["event"]
    try:
        answer = machine.replay(event, decode(line["payload"]))
    except Exception as error:
        return f"the machine cannot take {event}: {type(error).__name__}: {error}"
    got = _json(answer.to_wire() if isinstance(answer, Reply) else encode(answer))
    if got != line["answer"]:
        return f"the daemon answered {json.dumps(line['answer'])}, the protocol answers {json.dumps(got)}"
    after = _json(state_after(machine.view()))
    if after != line["after"]:
        return f"the record after it is {json.dumps(line['after'])}, the protocol's is {json.dumps(after)}"
    if event == "fetch" and isinstance(answer, Reply) and answer.ok:
        owed.fetches.add(line["seq"])
    owed.notices.update(_notified(answer))
    verdict.steps += 1
    verdict.events[event] = verdict.events.get(event, 0) + 1
    return None


def _truth_differs(machine: DaemonMachine, truth: dict[str, Any]) -> str | None:
    """The spec's ``CleanRecordIsTruth`` at a test's reading of the daemon's memory: a clean record's
    rows (the slots read) are what the memory holds. None when it holds, or when the record is not
    clean (a move pending, a repair, dirty: the memory may differ)."""
    view = machine.view()
    if view.record is None or view.phase != "clean":
        return None
    first = truth["first_slot"]
    held = [list(row) for row in truth["slots"]]
    recorded = [list(row[first : first + len(held[0])]) for row in view.record.rows] if held else []
    for layer, (want, got) in enumerate(zip(recorded, held, strict=False)):
        if want != got:
            return (
                f"the daemon's record is clean at version {view.record.version}, but its memory holds another "
                f"layout: layer {layer}, slots {first}.. hold {got}, the record says {want} (an expert moved "
                "with no begin and commit)"
            )
    return None


def check_daemon_trace(path: Path, truths: Iterable[dict[str, Any]] = ()) -> Verdict:
    """Replay one daemon trace on the protocol's daemon machine; ``truths``: what tests read from this
    daemon's memory (``truth`` lines of its ranks' traces), each checked against the record of the
    moment it was read, where no step of the daemon fell within the read."""
    started = time.perf_counter()
    verdict = Verdict(path)
    lines = _lines(path, verdict)
    first = next(lines, None)
    if not _begins(first, verdict):
        return verdict
    machine = _started(first)
    owed = _Owed(copy=_copy_at_start(first, machine))
    pending = sorted(truths, key=lambda truth: truth["read_ns"])
    last_ns = first["t_ns"]

    def read_truths(until_ns: int) -> str | None:
        """Check each truth read before ``until_ns``; one read while the daemon took a step is left."""
        while pending and pending[0]["done_ns"] < until_ns:
            truth = pending.pop(0)
            if truth["read_ns"] <= last_ns:
                continue
            verdict.truths += 1
            why = _truth_differs(machine, truth)
            if why is not None:
                verdict.divergence = Divergence(truth["seq"], truth, why, state_after(machine.view()), [])
                return why
        return None

    for line in lines:
        if read_truths(line.get("t_ns", 0)) is not None:
            break
        if line.get("kind") == "start":  # the daemon started again in this process (a file per process)
            machine = _started(line)
            owed = _Owed(copy=_copy_at_start(line, machine))
            continue
        before, phase = state_after(machine.view()), machine.phase
        why = _replay(machine, line, owed, verdict)
        if why is not None:
            verdict.divergence = Divergence(line.get("seq", -1), line, why, before, _phase_changes(machine, phase))
            break
        last_ns = line.get("t_ns", last_ns)
    else:
        read_truths(pending[-1]["done_ns"] + 1 if pending else 0)
    verdict.seconds = time.perf_counter() - started
    return verdict


def _engine_started(line: dict[str, Any]) -> EngineSession:
    """The session of an engine rank just started, as its start line says."""
    return EngineSession(line["engine_id"], line["num_ranks"], decode(line["layout"]), standby=line["standby"])


def _moved_rows(session: EngineSession, initial: Any, chunk_rows: dict[str, Any]) -> list[list[int]]:
    """A move's whole map, as the trace gives it: the map the engine routed with (its own initial one when
    it adopted none), with the chunk's rows moved. Rows that changed outside the chunk make another
    digest than the engine's, and the view after the move differs."""
    base = session.view().rows or initial
    rows = [list(row) for row in base]
    for layer, row in chunk_rows.items():
        rows[int(layer)] = list(row)
    return rows


def _replay_engine(session: EngineSession, line: dict[str, Any], verdict: Verdict, initial: Any = None) -> str | None:
    kind = line.get("kind")
    if kind == "rebalance_end":
        owed = session.view().owed
        if owed:
            return (
                f"the rebalance ended with the check of version {session.view().version}'s commits owed: no "
                "all-gather verified that every daemon recorded the engine's map"
            )
        return None
    if kind == "truth":  # checked against the daemon's record (check_daemon_trace)
        return None
    if kind != "step":
        return f"a line of unknown kind {kind!r}"
    event = line["event"]
    arguments = {k: decode(v) for k, v in line["arguments"].items()}
    if event == "move" and "chunk_rows" in arguments:
        if session.view().rows is None and initial is None:
            return "a move of the engine's own map, whose rows the start line does not give"
        arguments = {"rows": _moved_rows(session, initial, line["arguments"]["chunk_rows"])}
    try:
        result = session.take(event, **arguments)
    except Exception as error:
        return f"the engine's machines cannot take {event}: {type(error).__name__}: {error}"
    got = _json(encode(result))
    if got != line["result"]:
        return f"the engine's step gave {json.dumps(line['result'])}, the protocol's gives {json.dumps(got)}"
    after = _json(engine_state_after(session.view()))
    if after != line["after"]:
        return f"the view after it is {json.dumps(line['after'])}, the protocol's is {json.dumps(after)}"
    verdict.steps += 1
    verdict.events[event] = verdict.events.get(event, 0) + 1
    return None


class _Routed:
    """The map the session says the engine routes with, as the replay goes: the engine's own initial map,
    the map an install put in its place (startup's adoption, a takeover), and each move's whole map."""

    def __init__(self, initial: Any) -> None:
        self.rows = None if initial is None else [list(row) for row in initial]
        self.installed: Any = None

    def before(self, session: EngineSession, line: dict[str, Any], initial: Any) -> None:
        moves = line.get("kind") == "step" and line["event"] == "move" and "chunk_rows" in line["arguments"]
        if moves and (session.view().rows is not None or initial is not None):
            self.rows = _moved_rows(session, initial, line["arguments"]["chunk_rows"])

    def after(self, session: EngineSession) -> None:
        installed = session.layout_to_install()
        if installed is not None and installed != self.installed:
            self.installed, self.rows = installed, [list(row) for row in installed]

    def differs(self, line: dict[str, Any]) -> str | None:
        believed = None if self.rows is None else layout_digest(self.rows)
        if line.get("digest") == believed:
            return None
        return (
            f"sglang routes with the map of digest {line.get('digest')}, the session says the engine routes with "
            f"the map of digest {believed}"
        )


def check_engine_trace(path: Path) -> Verdict:
    """Replay one engine rank's trace on the protocol's engine machines."""
    started = time.perf_counter()
    verdict = Verdict(path, kind="engine")
    lines = _lines(path, verdict)
    first = next(lines, None)
    if not _begins(first, verdict):
        return verdict
    session, initial = _engine_started(first), first.get("initial_rows")
    routed = _Routed(initial)
    moved: dict[str, Any] | None = None  # a routes line written after sglang's move, before the session took it
    for line in lines:
        before, phase = _json(engine_state_after(session.view())), session.view().rebalance
        if line.get("kind") == "routes" and phase == "moving":
            moved, why = line, None
        elif line.get("kind") == "routes":
            why = routed.differs(line)
        else:
            routed.before(session, line, initial)
            why = _replay_engine(session, line, verdict, initial)
            routed.after(session)
            if why is None and moved is not None and line.get("event") == "move":
                line, moved, why = moved, None, routed.differs(moved)
        if why is not None:
            changes = sorted({f"{t.event} -> {t.target.id}" for t in RebalanceMachine.states_map[phase].transitions})
            verdict.divergence = Divergence(line.get("seq", -1), line, why, before, changes)
            break
    verdict.seconds = time.perf_counter() - started
    return verdict


def _daemon_answers(daemon_traces: list[list[dict[str, Any]]], engine_id: str) -> list[tuple[str, Any, int]]:
    """What a daemon (its traces, one per process, in the order they started) answered ``engine_id``, each
    with the time its step was stamped (before its reply was sent)."""
    answers = []
    for lines in daemon_traces:
        for line in lines:
            if line.get("kind") != "step" or line["event"] not in _ANSWERED:
                continue
            if line["payload"].get("engine_id") != engine_id:
                continue
            answer = line["answer"]
            if line["event"] != "claim":
                answer = _json(encode(RankAnswer.of(answer)))
            answers.append((line["event"], answer, line["t_ns"]))
    return answers


def check_answers(folder: Path, engines: Mapping[Path, Lines], daemons: Mapping[Path, Lines]) -> Verdict:
    """Every answer each engine rank took from its own daemon is one that daemon's trace gave it, in order
    (``engines`` and ``daemons``: one folder's traces, read)."""
    started = time.perf_counter()
    verdict = Verdict(folder, kind="answers")
    daemons_of = by_socket(daemons)
    for path, lines in engines.items():
        start = lines[0] if lines else {}
        if start.get("kind") != "start" or start.get("socket") not in daemons_of:
            continue  # no traced daemon behind this rank (a plain sglang daemon, an engine from disk)
        rank, engine_id = start["rank"], start["engine_id"]
        given = _daemon_answers([daemon for _, daemon in daemons_of[start["socket"]]], engine_id)
        n = 0
        for line in lines[1:]:
            if line.get("kind") != "step" or line["event"] not in _ANSWERED:
                continue
            arguments = line["arguments"]
            if arguments.get("rank") != rank:
                continue  # another rank's answer, as gathered: that rank's own trace matches it
            taken = arguments[_ANSWERED[line["event"]]]
            if line["event"] != "claim" and taken.get("status") is None:
                continue  # no reply (the daemon unreachable): nothing to match
            while n < len(given) and given[n][:2] != (line["event"], taken):
                n += 1
            if n < len(given) and line["t_ns"] < given[n][2]:
                why = (
                    f"engine {engine_id} rank {rank} took a {line['event']} answer "
                    f"{(given[n][2] - line['t_ns']) / 1e6:.3f} ms before its daemon ({start['socket']}) gave it: "
                    f"{json.dumps(taken)}"
                )
                verdict.divergence = Divergence(
                    line.get("seq", -1), {**line, "trace": str(path)}, why, {"the daemon's step at": given[n][2]}, []
                )
                verdict.seconds = time.perf_counter() - started
                return verdict
            if n == len(given):
                why = (
                    f"engine {engine_id} rank {rank} took a {line['event']} answer that its daemon "
                    f"({start['socket']}) never gave it: {json.dumps(taken)}"
                )
                shown = [answer for event, answer, _ in given if event == line["event"]]
                verdict.divergence = Divergence(
                    line.get("seq", -1), {**line, "trace": str(path)}, why, {"the daemon's answers": shown}, []
                )
                verdict.seconds = time.perf_counter() - started
                return verdict
            n += 1
            verdict.matched += 1
    verdict.seconds = time.perf_counter() - started
    return verdict


def check_order(folder: Path, engines: Mapping[Path, Lines], daemons: Mapping[Path, Lines]) -> Verdict:
    """The folder's lines merged by ``t_ns``: no engine writes a line once a daemon that served it its
    weights, and that it was still attached to, was started again (the spec's ``Lose`` ends it)."""
    started = time.perf_counter()
    verdict = Verdict(folder, kind="order")
    firsts = {runs[0][0] for runs in by_socket(daemons).values()}
    merged = sorted(
        ((path, line) for traces in (daemons, engines) for path, lines in traces.items() for line in lines),
        key=lambda item: (item[1]["t_ns"], str(item[0]), item[1]["seq"]),  # a tie: by file, then line
    )
    attached: dict[str, set[str]] = {}  # by socket: the engines attached to its daemon after its last step
    served: dict[str, set[str]] = {}  # by socket: the engines its daemon served their weights (they map them)
    ended: dict[str, str] = {}  # an engine ended by a daemon's loss: that daemon's socket
    engine_of = {path: lines[0].get("engine_id", "") for path, lines in engines.items() if lines}
    for path, line in merged:
        if path in daemons:
            socket = daemons[path][0].get("socket", "")
            if line.get("kind") == "start" and path not in firsts:
                ended.update((engine, socket) for engine in attached.get(socket, set()) & served.get(socket, set()))
                attached[socket], served[socket] = set(), set()
            elif line.get("kind") == "step":
                attached[socket] = set(line["after"].get("attached", ()))
                if line["event"] == "fetch" and (line.get("answer") or {}).get("status") == "ok":
                    served.setdefault(socket, set()).add(step_engine(line))
        elif engine_of.get(path) in ended:
            engine = engine_of[path]
            why = (
                f"engine {engine} wrote this line after its daemon at {ended[engine]}, whose memory it maps, was "
                f"lost and started again: a rank that maps a daemon's memory ends with it (the spec's Lose)"
            )
            verdict.divergence = Divergence(line.get("seq", -1), {**line, "trace": str(path)}, why, {}, [])
            break
        verdict.steps += 1
    verdict.seconds = time.perf_counter() - started
    return verdict


def _truths(engines: Mapping[Path, Lines], daemons: Mapping[Path, Lines]) -> dict[Path, Lines]:
    """Each daemon trace's truths: the ``truth`` lines of the ranks (and memory probes) on its socket, read
    while that daemon process ran (from its start to the next start of a daemon on the same socket)."""
    ranks_of = by_socket(engines)
    truths: dict[Path, Lines] = {}
    for socket, runs in by_socket(daemons).items():
        read = [line for _, lines in ranks_of.get(socket, ()) for line in lines if line.get("kind") == "truth"]
        for n, (path, lines) in enumerate(runs):
            begun = lines[0]["t_ns"]
            ended = runs[n + 1][1][0]["t_ns"] if n + 1 < len(runs) else None
            truths[path] = [t for t in read if t["read_ns"] > begun and (ended is None or t["done_ns"] < ended)]
    return truths


def check_all(paths: Iterable[Path]) -> list[Verdict]:
    """Every daemon and engine trace under ``paths``, then each folder's engines against its daemons."""
    paths = list(paths)
    daemons, engines = trace_files(paths), trace_files(paths, "engine-*.ndjson")
    probes = trace_files(paths, "probe-*.ndjson")  # a memory probe's readings (tools.demo.memory_probe)
    read = {path: read_trace(path) for path in daemons + engines + probes}  # once, for the checks across processes
    truths = _truths({p: read[p] for p in engines + probes}, {p: read[p] for p in daemons})
    verdicts = [check_daemon_trace(path, truths.get(path, ())) for path in daemons]
    verdicts += [check_engine_trace(path) for path in engines]
    for folder in sorted({path.parent for path in engines}):
        ranks = {p: read[p] for p in engines if p.parent == folder}
        its_daemons = {p: read[p] for p in daemons if p.parent == folder}
        verdicts.append(check_answers(folder, ranks, its_daemons))
        verdicts.append(check_order(folder, ranks, its_daemons))
    return verdicts


def reports(verdicts: Iterable[Verdict]) -> str:
    """Every divergence's report, one after the other."""
    return "\n".join(v.divergence.report(v.path) for v in verdicts if v.divergence is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.trace_check", description=__doc__)
    parser.add_argument(
        "paths", nargs="+", type=Path, help="trace files, or folders of daemon-*.ndjson and engine-*.ndjson"
    )
    args = parser.parse_args(argv)
    verdicts = check_all(args.paths)
    if not verdicts:
        print(f"trace_check: no trace under {', '.join(map(str, args.paths))}")
        return 1
    if any(not v.ok for v in verdicts):
        print(reports(verdicts))
    print(f"trace_check: {summary(verdicts)}")
    return 0 if all(v.ok for v in verdicts) else 1


def summary(verdicts: list[Verdict]) -> str:
    """One line: what was checked, how long it took, and the verdict."""
    daemons = [v for v in verdicts if v.kind == "daemon"]
    engines = [v for v in verdicts if v.kind == "engine"]
    bad = [v for v in verdicts if not v.ok]
    return (
        f"{len(daemons)} daemon traces ({sum(v.steps for v in daemons)} steps, "
        f"{sum(v.fetches_served for v in daemons)} fetches served, {sum(v.notices_sent for v in daemons)} notices "
        f"sent), {len(engines)} engine rank traces ({sum(v.steps for v in engines)} steps), "
        f"{sum(v.matched for v in verdicts)} engine answers matched with their daemon's, "
        f"{sum(v.truths for v in verdicts)} readings of a daemon's memory matched with its record, in "
        f"{sum(v.seconds for v in verdicts):.2f} s: "
        + ("every trace is a behaviour of the protocol" if not bad else f"{len(bad)} NOT")
    )


if __name__ == "__main__":
    sys.exit(main())
