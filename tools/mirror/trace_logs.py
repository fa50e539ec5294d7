"""A run's traces in the spec's terms: each daemon's logged steps (``Log[r]`` of
spec/TraceLayoutProtocol.tla) and each engine's logged decisions (``ELog[k]``), with the model's
constants that the run implies. Pure: no ``layout_sm``.

Why apart: TLC's trace check (``tools.mirror.trace_tla``, which writes these logs into a TLA+ module)
and the spec oracle's (``tools.oracle.traces``, which searches them in Python) must judge the same
logs, read one way. How a real trace becomes the spec's is told in ``tools.mirror.trace_tla``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tools.mirror.model import SPEC_STEP, Model
from tools.mirror.values import ModelValue, Record, Value
from tools.trace_files import by_socket, read_trace, step_engine, trace_files

NONE = ModelValue("NONE")


class Source(NamedTuple):
    """Where a logged step came from: its trace, its line there (``seq``), its time (``t_ns``)."""

    path: Path
    line: int
    t_ns: int


def _source(path: Path, line: dict[str, Any]) -> Source:
    return Source(path, int(line.get("seq", 0)), int(line.get("t_ns", 0)))


@dataclass
class DaemonLog:
    """One socket's steps in the spec's terms, with where each came from."""

    socket: str
    rank: int  # the spec's rank, from 1
    records: list[Record] = field(default_factory=list)  # each step, as TLA+ values
    origins: list[str] = field(default_factory=list)  # "file:seq event" of each record
    sources: list[Source] = field(default_factory=list)  # where each record came from
    engines: set[str] = field(default_factory=set)
    older: list[str] = field(default_factory=list)
    standbys: set[str] = field(default_factory=set)
    chunks: set[frozenset[int]] = field(default_factory=set)
    begins: dict[str, int] = field(default_factory=dict)  # each engine's begins here
    auto_repair: bool = True
    lacks_record: bool = False
    restarted: bool = False
    repair_failed: bool = False
    num_layers: int = 0
    durable: bool = False  # the daemon keeps a durable copy (its start says what it read, or it wrote one)


def _move(info: dict[str, Any] | None) -> Value:
    if not info:
        return NONE
    layers = frozenset(layer + 1 for layer in info["layers"])
    return Record(mover=info["engine_id"], layers=layers, base=info["base_version"])


def _record(
    event: str, engine: str, cands: Iterable[str], answer: str, after: dict[str, Any], probes: set[str]
) -> Record:
    phase = after["phase"]
    info = {"pending": after.get("pending"), "dirty": after.get("dirty"), "repairing": after.get("repairing")}.get(
        phase
    )
    return Record(
        ev=event,
        eng=engine,
        cands=frozenset(cands),
        ans=answer,
        ph=phase,
        ver=after.get("version") or 0,
        pend=_move(info),
        att=frozenset(after.get("attached", ())) - probes,
        park=frozenset(after.get("parked", ())),
        nf=bool(after.get("non_following_seen")),
    )


def _answer(event: str, answer: Any) -> str:
    """The daemon's answer in the spec's words."""
    status = answer.get("status") if isinstance(answer, dict) else None
    if event == "begin":
        return status if status in ("ok", "busy") else "refused"
    if event == "commit":
        return "committed" if status == "ok" else "commit_refused"
    if event == "claim":
        return {"ok": "granted", "busy": "taken"}.get(status or "", "refused")
    if event == "fetch":
        return "served" if status == "ok" else "refused"
    if event == "rejoin":
        return "granted" if status == "ok" else "refused"
    return ""


def daemon_log(
    socket: str, rank: int, runs: Sequence[tuple[Path, list[dict[str, Any]]]], probes: set[str]
) -> DaemonLog:
    """One socket's daemon traces as the spec's steps. The k-th fetch without a claim on each daemon is
    older engine k's (its ranks fetch at once, one from each daemon), or an attached engine's."""
    log = DaemonLog(socket, rank)
    first = runs[0][1][0]
    log.auto_repair = bool(first.get("auto_repair", True))
    log.lacks_record = first.get("rows") is None
    log.durable = first.get("copy") is not None
    attached: set[str] = set()
    for n, (path, lines) in enumerate(runs):
        for line in lines:
            kind = line.get("kind")
            if kind == "start":
                if line.get("rows") is not None:
                    log.num_layers = len(line["rows"])
                if n == 0 and line is lines[0]:
                    continue
                log.restarted = True
                phase = "clean" if line.get("rows") is not None else "no_record"
                after = {"phase": phase, "version": line.get("version", 0)}  # its durable copy's, if it had one
                log.records.append(_record("restart", "", (), "", after, probes))
                log.origins.append(f"{path.name}:{line['seq']} start")
                log.sources.append(_source(path, line))
                attached = set()
                continue
            if kind == "persist":
                log.durable = True
                log.records.append(_record("persist", "", (), "", line["after"], probes))
                log.origins.append(f"{path.name}:{line['seq']} persist")
                log.sources.append(_source(path, line))
                continue
            if kind != "step":
                continue  # fetch_served, notice_sent: checked by tools.trace_check, no step of the spec
            event, engine = line["event"], step_engine(line)
            if engine in probes:
                continue
            cands: set[str] = {engine} if engine else set()
            if event == "fetch" and not engine:
                older = f"older-{len(log.older) + 1}"
                log.older.append(older)
                cands = {older} | attached
            if event == "begin":
                log.begins[engine] = log.begins.get(engine, 0) + 1
                log.chunks.add(frozenset(layer + 1 for layer in line["payload"]["layers"]))
            if event == "park":
                log.standbys.add(engine)
            if event == "repair_failed":
                log.repair_failed = True
            if engine:
                log.engines.add(engine)
            log.records.append(_record(event, engine, cands, _answer(event, line["answer"]), line["after"], probes))
            log.origins.append(f"{path.name}:{line['seq']} {event}")
            log.sources.append(_source(path, line))
            attached = set(line["after"].get("attached", ())) - probes
    return log


# An engine's decisions on its ranks' all-gathers (every rank takes the same), the spec's actions,
# and the end of each rebalance, where no check of a commit may be owed.
DECISIONS = ("agree", "decide", "verify", "promote")
REBALANCE_END = "rebalance_end"
# The spec's ephase after a promotion, for the standby's role after it.
_PROMOTED = {"promoted": "run", "failed": "failed", "parked": "parked"}


@dataclass
class EngineLog:
    """One engine's decisions in the spec's terms, from the rank trace that logged the most of them."""

    engine: str
    records: list[Record] = field(default_factory=list)
    origins: list[str] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)


def _decision(event: str, after: dict[str, Any]) -> Record:
    phase = _PROMOTED.get(after.get("role", ""), "failed") if event == "promote" else after.get("phase", "")
    return Record(
        ev=event,
        ph=phase,
        ver=after.get("version") or 0,
        share=bool(after.get("shares")),
        step=SPEC_STEP.get(after.get("rebalance", ""), "idle"),
    )


def engine_logs(traces: dict[Path, list[dict[str, Any]]], probes: set[str]) -> list[EngineLog]:
    """Each traced engine's decisions. Its ranks decide on the same all-gathers, so one rank's are a
    prefix of another's (a rank may die first); the longest is the engine's."""
    by_engine: dict[str, list[tuple[Path, list[dict[str, Any]]]]] = {}
    for path, lines in sorted(traces.items()):
        engine = lines[0].get("engine_id", "") if lines and lines[0].get("kind") == "start" else ""
        if engine and engine not in probes:
            decided = [
                {**line, "event": REBALANCE_END, "after": {}} if line.get("kind") == REBALANCE_END else line
                for line in lines
                if line.get("kind") == REBALANCE_END or (line.get("kind") == "step" and line["event"] in DECISIONS)
            ]
            by_engine.setdefault(engine, []).append((path, decided))
    logs = []
    for engine, ranks in sorted(by_engine.items()):
        decisions = [(path, [_decision(line["event"], line["after"]) for line in decided]) for path, decided in ranks]
        longest = max(range(len(ranks)), key=lambda n: len(decisions[n][1]))
        path, lines = ranks[longest]
        log = EngineLog(
            engine,
            decisions[longest][1],
            [f"{path.name}:{line['seq']} {line['event']}" for line in lines],
            [_source(path, line) for line in lines],
        )
        for other, mine in decisions:
            if mine != log.records[: len(mine)]:
                raise ValueError(f"{other.name}: its decisions differ from {path.name}'s, on the same all-gathers")
        logs.append(log)
    return logs


@dataclass
class Run:
    """One run's daemons (a folder of traces): their logs, by rank, and what their check shares."""

    folder: Path
    logs: list[DaemonLog]
    num_layers: int
    engines: set[str]
    older: set[str]
    standbys: set[str]
    lacking: set[int]
    restarts: bool
    repair_may_fail: bool
    auto_repair: bool
    rejoins: bool
    engine_logs: list[EngineLog] = field(default_factory=list)
    durable: bool = False

    @property
    def steps(self) -> int:
        return sum(len(log.records) for log in self.logs) + sum(len(log.records) for log in self.engine_logs)


def model(run: Run) -> Model:
    """The constants of the run's check (TLC's generated .cfg, the oracle's search): its engines, the
    chunks and begins, auto repair, whether a daemon restarted or a repair failed, whether the engines
    have daemons behind rejoin (a daemon is behind after a loss, or after a commit it did not record:
    no restart needed). ``OperatorRepairs`` and ``ReplyFaults`` are TRUE: every real daemon takes an
    operator's repair, and a real socket may lose a commit or its reply."""
    chunks = frozenset(c for log in run.logs for c in log.chunks)
    return Model(
        name=str(run.folder),
        num_ranks=len(run.logs),
        num_layers=run.num_layers,
        engines=tuple(sorted(run.engines)),
        older=frozenset(run.older),
        may_lack_record=frozenset(run.lacking),
        chunks=tuple(sorted(chunks, key=lambda c: (len(c), sorted(c)))),
        max_moves=max_moves(run.logs),
        daemon_restarts=run.restarts,
        repairs=run.auto_repair,
        repair_may_fail=run.repair_may_fail,
        operator_repairs=True,
        standbys=frozenset(run.standbys),
        rejoins=run.rejoins,
        reply_faults=True,  # a real socket loses replies, and a daemon refuses rows it cannot take
        durable=run.durable and run.rejoins,
    )


def max_moves(logs: Sequence[DaemonLog]) -> int:
    """The chunks the run's engines began (the spec's ``moves``): an engine's k-th begin on each daemon
    is its k-th chunk, and a chunk may reach only some daemons (a rank lost before its begin)."""
    engines = {engine for log in logs for engine in log.begins}
    return sum(max(log.begins.get(engine, 0) for log in logs) for engine in engines)


def runs(paths: Sequence[Path]) -> list[Run]:
    """Each folder's run: its daemons' logs (one per socket, by rank) and the constants of its check."""
    found = []
    for folder in sorted({p.parent for p in trace_files(paths)}):
        daemons = {p: read_trace(p) for p in trace_files([folder]) if p.parent == folder}
        engines = {p: read_trace(p) for p in trace_files([folder], "engine-*.ndjson") if p.parent == folder}
        probes = {p: read_trace(p) for p in trace_files([folder], "probe-*.ndjson") if p.parent == folder}
        probe_ids = {lines[0].get("engine_id", "") for lines in probes.values() if lines} - {""}
        ranks: dict[str, int] = {}
        standbys: set[str] = set()
        rejoins = True
        for lines in engines.values():
            start = lines[0] if lines else {}
            if start.get("kind") == "start":
                ranks.setdefault(start["socket"], start["rank"] + 1)
                if start.get("standby"):
                    standbys.add(start["engine_id"])
                rejoins = rejoins and bool((start.get("layout") or {}).get("rejoins", True))
        sockets = by_socket(daemons)
        for n, socket in enumerate(sorted(sockets)):
            ranks.setdefault(socket, n + 1)
        logs = sorted((daemon_log(s, ranks[s], r, probe_ids) for s, r in sockets.items()), key=lambda log: log.rank)
        if [log.rank for log in logs] != list(range(1, len(logs) + 1)):
            raise ValueError(
                f"{folder}: the daemons' ranks are {[log.rank for log in logs]}: a rank's trace is missing"
            )
        auto = all(log.auto_repair for log in logs)
        restarted = any(log.restarted for log in logs)
        decided = engine_logs(engines, probe_ids)
        found.append(
            Run(
                folder=folder,
                logs=logs,
                num_layers=max((log.num_layers for log in logs), default=1) or 1,
                engines=set().union(*(log.engines | set(log.older) for log in logs), (log.engine for log in decided)),
                older=set().union(*(set(log.older) for log in logs)),
                standbys=standbys | set().union(*(log.standbys for log in logs)),
                lacking={log.rank for log in logs if log.lacks_record},
                restarts=restarted,
                repair_may_fail=any(log.repair_failed for log in logs),
                auto_repair=auto,
                rejoins=rejoins,
                engine_logs=decided,
                durable=any(log.durable for log in logs),
            )
        )
    return found
