"""``python -m tools.mirror.trace_tla PATH...``: TLC on a run's traces, beside ``tools.trace_check``.

For each daemon socket of a run (its traces, one per process, in the order they started), a TLA+
module is generated that holds the daemon's steps as a sequence of records, and for each engine its
decisions (agreements, chunks' decisions, final checks, promotions, rebalances' ends), and TLC checks
``spec/TraceLayoutProtocol.tla`` on it: some behaviour of the whole protocol takes exactly those
steps, each log's in its order, each daemon's ending in the logged phase, version, pending move,
attachments, parked standbys and non-following flag, each engine's in its logged phase, version,
shared rebalancing and chunk step. The rest (moves, crashes, older engines) is left to the spec.
Only the standard modules are needed.

How a real trace becomes the spec's (``spec/README.md``, "Traces of real runs"):
- ranks: a socket's rank is the one the engine ranks' start lines give it (else its name's order);
- layers: real layer ``l`` is the spec's ``l + 1``; a begin's layers are its chunk;
- a daemon started again on the same socket is the spec's ``Lose`` (or ``Restart`` of a dirty
  daemon nobody uses): its record is back at version 0 with no attachment;
- a fetch without a claim (sglang without the plugin, or a plugin whose fetch hook is missing) is a
  fetch by an older engine of its own, or by an engine attached at the time: TLC chooses;
- the memory probe (its ``probe-*.ndjson`` names its engine) reads the spec's ``truth``: its
  attach, fetch and detach are an instrument's, not the protocol's, and are left out with its
  attachment; ``tools.trace_check`` holds its readings against the record;
- ``fetch_served`` and ``notice_sent`` lines are no steps of the spec (``tools.trace_check`` checks
  that each was owed);
- the maps are not logged: the spec's maps are two permutations a layer, a real map is what EPLB
  chose, and ``tools.trace_check`` holds the digests.

The constants come from the run: its engines (the standbys from their start lines or their parks),
the chunks and the number of begins, auto repair, and whether a daemon restarted or a repair failed;
``OperatorRepairs`` is TRUE, as every real daemon takes an operator's repair.

TLC's "invariant TraceAccepted is violated" is the verdict "a behaviour". Otherwise every state TLC
reached is dumped, and the report gives one that took the most logged steps with the step each
daemon had next: none of them is a step of the spec from there. Exit status 0 when both checkers
accept every trace, 1 when either rejects one or they disagree, 2 when TLC is missing (the Python
checker's verdict is still printed).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools import REPO_DIR
from tools.mirror.check_spec import find_jar, parse_stdout
from tools.mirror.system import SPEC_STEP
from tools.mirror.values import ModelValue, Record, Value, tlc_text
from tools.trace_check import Verdict, _by_socket, _read, check_all, step_engine, trace_files

SPEC = REPO_DIR / "spec"
NONE = ModelValue("NONE")


@dataclass
class DaemonLog:
    """One socket's steps in the spec's terms, with where each came from."""

    socket: str
    rank: int  # the spec's rank, from 1
    records: list[Record] = field(default_factory=list)  # each step, as TLA+ values
    origins: list[str] = field(default_factory=list)  # "file:seq event" of each record
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
                after = {"phase": "clean" if line.get("rows") is not None else "no_record", "version": 0}
                log.records.append(_record("restart", "", (), "", after, probes))
                log.origins.append(f"{path.name}:{line['seq']} start")
                attached = set()
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
        log = EngineLog(engine, decisions[longest][1], [f"{path.name}:{line['seq']} {line['event']}" for line in lines])
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

    @property
    def steps(self) -> int:
        return sum(len(log.records) for log in self.logs) + sum(len(log.records) for log in self.engine_logs)


def module(run: Run) -> tuple[str, str]:
    """The generated root module and its configuration."""
    logs = []
    for log in run.logs:
        steps = [tlc_text(record) for record in log.records]
        logs.append("<<\n      " + ",\n      ".join(steps) + "\n    >>" if steps else "<<>>")
    chunks = frozenset(c for log in run.logs for c in log.chunks)
    elogs = [
        f"[eng |-> {tlc_text(log.engine)}, steps |-> <<"
        + ("\n      " + ",\n      ".join(tlc_text(record) for record in log.records) if log.records else "")
        + ">>]"
        for log in run.engine_logs
    ]
    tla = (
        "---- MODULE TraceRun ----\n"
        f"\\* Generated by tools.mirror.trace_tla from the traces in {run.folder}.\n"
        "EXTENDS TraceLayoutProtocol\n"
        f"RunEngines == {tlc_text(frozenset(run.engines))}\n"
        f"RunOlder == {tlc_text(frozenset(run.older))}\n"
        f"RunStandbys == {tlc_text(frozenset(run.standbys))}\n"
        f"RunLacking == {tlc_text(frozenset(run.lacking))}\n"
        f"RunChunks == {tlc_text(chunks)}\n"
        "RunLog == <<\n    " + ",\n    ".join(logs) + "\n  >>\n"
        "RunELog == <<\n    " + ",\n    ".join(elogs) + "\n  >>\n"
        "====\n"
    )
    cfg = (
        "CONSTANTS\n"
        f"    NumRanks = {len(run.logs)}\n    NumLayers = {run.num_layers}\n"
        "    Engines <- RunEngines\n    Older <- RunOlder\n    MayLackRecord <- RunLacking\n"
        f"    Chunks <- RunChunks\n    MaxMoves = {max_moves(run.logs)}\n"
        f"    DaemonRestarts = {tlc_text(run.restarts)}\n    Repairs = {tlc_text(run.auto_repair)}\n"
        "    OperatorRepairs = TRUE\n"
        f"    RepairMayFail = {tlc_text(run.repair_may_fail)}\n    Standbys <- RunStandbys\n"
        f"    Rejoins = {tlc_text(run.rejoins)}\n    CommitFaults = TRUE\n"
        "    NONE = NONE\n    Log <- RunLog\n    ELog <- RunELog\n"
        "INIT TraceInit\nNEXT TraceNext\nINVARIANT TraceAccepted\n"
    )
    return tla, cfg


def max_moves(logs: Sequence[DaemonLog]) -> int:
    """The chunks the run's engines began (the spec's ``moves``): an engine's k-th begin on each daemon
    is its k-th chunk, and a chunk may reach only some daemons (a rank lost before its begin)."""
    engines = {engine for log in logs for engine in log.begins}
    return sum(max(log.begins.get(engine, 0) for log in logs) for engine in engines)


def runs(paths: Sequence[Path]) -> list[Run]:
    """Each folder's run: its daemons' logs (one per socket, by rank) and the constants of its check."""
    found = []
    for folder in sorted({p.parent for p in trace_files(paths)}):
        daemons = {p: _read(p) for p in trace_files([folder]) if p.parent == folder}
        engines = {p: _read(p) for p in trace_files([folder], "engine-*.ndjson") if p.parent == folder}
        probes = {p: _read(p) for p in trace_files([folder], "probe-*.ndjson") if p.parent == folder}
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
        sockets = _by_socket(daemons)
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
                rejoins=rejoins and restarted,
                engine_logs=decided,
            )
        )
    return found


@dataclass
class TlcVerdict:
    folder: Path
    steps: int
    accepted: bool
    distinct: int | None
    seconds: float
    report: str = ""


_STATE = re.compile(r"^State \d+:\n(.*?)(?:\n\n|\Z)", re.M | re.S)
# The variables a report shows of the state TLC got furthest in: the daemons' and the engines' phases.
_SHOWN = ("pos", "epos", "dphase", "dver", "dpend", "datt", "dpark", "dnf", "ephase", "ever", "eshare", "reb")


def _values(state: str) -> dict[str, str]:
    """One state of TLC's dump: each variable's value, on one line."""
    return {
        name: " ".join(value.split())
        for name, value in (part.split(" = ", 1) for part in ("\n" + state.strip()).split("\n/\\ ")[1:])
    }


def _tlc(jar: Path, run: Run, work: Path) -> tuple[bool, str]:
    """TLC on the run's logs, every state it reached dumped: (accepted, TLC's stdout)."""
    tla, cfg = module(run)
    (work / "TraceRun.tla").write_text(tla)
    (work / "TraceRun.cfg").write_text(cfg)
    cmd = ["java", "-XX:+UseParallelGC", "-cp", str(jar), "tlc2.TLC", "-workers", "1", "-deadlock"]
    cmd += ["-config", "TraceRun.cfg", "-metadir", str(work / "states"), "-noGenerateSpecTE"]
    cmd += ["-dump", str(work / "reached"), "TraceRun.tla"]
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if "Invariant TraceAccepted is violated" in text:
        return True, text
    if "Model checking completed. No error has been found." not in text:
        raise RuntimeError(f"TLC did not run the traces of {run.folder}:\n" + "\n".join(text.splitlines()[-30:]))
    return False, text


def _furthest(run: Run, dump: Path) -> str:
    """Where no behaviour goes on: a reached state that took the most logged steps, and the step each
    log had next (none of them is enabled from any state with those positions)."""
    best: tuple[int, dict[str, str]] = (-1, {})
    for match in _STATE.finditer(dump.read_text()):
        values = _values(match.group(1))
        taken = sum(int(n) for name in ("pos", "epos") for n in re.findall(r"\d+", values.get(name, "")))
        if taken > best[0]:
            best = (taken, values)
    taken, values = best
    positions = [int(n) for n in re.findall(r"\d+", values.get("pos", ""))]
    due = [
        f"  rank {log.rank}'s step {n + 1} ({log.origins[n]}): {tlc_text(log.records[n])}"
        for log, n in zip(run.logs, positions, strict=False)
        if n < len(log.records)
    ]
    engine_positions = [int(n) for n in re.findall(r"\d+", values.get("epos", ""))]
    due += [
        f"  engine {log.engine}'s decision {n + 1} ({log.origins[n]}): {tlc_text(log.records[n])}"
        for log, n in zip(run.engine_logs, engine_positions, strict=False)
        if n < len(log.records)
    ]
    shown = "\n    ".join(f"{name} = {values[name]}" for name in _SHOWN if name in values)
    return (
        f"{run.folder}: no behaviour of the spec takes more than {taken} of the {run.steps} logged steps; "
        f"from every state that took these, none takes the step each log had next:\n"
        + "\n".join(due)
        + f"\n  a state TLC reached there:\n    {shown}"
    )


def check_with_tlc(jar: Path, run: Run) -> TlcVerdict:
    """TLC's verdict on one run's daemon logs; on a rejection, the steps due where it got furthest."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="trace-tla-") as tmp:
        work = Path(tmp)
        for name in ("LayoutProtocol.tla", "TraceLayoutProtocol.tla"):
            shutil.copy(SPEC / name, work / name)
        accepted, text = _tlc(jar, run, work)
        verdict = TlcVerdict(run.folder, run.steps, accepted, parse_stdout("TraceRun", text).distinct, 0.0)
        if not accepted:
            verdict.report = _furthest(run, work / "reached.dump")
    verdict.seconds = time.monotonic() - started
    return verdict


@dataclass
class Comparison:
    """One run: the Python checker's verdict on its traces, and TLC's."""

    run: Run
    python_ok: bool
    tlc: TlcVerdict | None  # None: TLC is not here

    @property
    def ok(self) -> bool:
        """Both say "a behaviour" (the Python checker alone where TLC is not here)."""
        return self.python_ok and (self.tlc is None or self.tlc.accepted)

    def line(self) -> str:
        run = self.run
        said = f"{run.folder}: {len(run.logs)} daemons, {len(run.engine_logs)} engines, {run.steps} steps; python: " + (
            "behaviour" if self.python_ok else "NOT"
        )
        if self.tlc is None:
            return said
        same = self.tlc.accepted == self.python_ok
        return (
            f"{said}; TLC: {'behaviour' if self.tlc.accepted else 'NOT'} ({self.tlc.distinct} distinct states, "
            f"{self.tlc.seconds:.1f} s)" + ("" if same else "  <- the checkers DISAGREE")
        )


def compare(
    paths: Sequence[Path], keep: Path | None = None, verdicts: Sequence[Verdict] | None = None
) -> tuple[list[Comparison], str]:
    """Both checkers on every run under ``paths``; ``keep``: write each generated module there;
    ``verdicts``: the Python checker's on ``paths``, where the caller has them. Also returns where TLC
    came from, or what is missing."""
    python = check_all(paths) if verdicts is None else list(verdicts)
    jar, why = find_jar()
    found = []
    for run in runs(paths):
        python_ok = all(v.ok for v in python if v.path == run.folder or v.path.parent == run.folder)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            tla_text, cfg = module(run)
            stem = "-".join(run.folder.parts[-2:])
            (keep / f"{stem}.tla").write_text(tla_text)
            (keep / f"{stem}.cfg").write_text(cfg)
        found.append(Comparison(run, python_ok, None if jar is None else check_with_tlc(jar, run)))
    return found, why


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.mirror.trace_tla", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders of a run's traces (daemon-*.ndjson ...)")
    parser.add_argument("--keep", type=Path, help="write each run's generated module and .cfg into this folder")
    args = parser.parse_args(argv)
    found, why = compare(args.paths, args.keep)
    if not found:
        print(f"trace_tla: no daemon trace under {', '.join(map(str, args.paths))}")
        return 1
    for comparison in found:
        print(comparison.line())
        if comparison.tlc is not None and comparison.tlc.report:
            print(comparison.tlc.report)
    if any(c.tlc is None for c in found):
        print(f"trace_tla: TLC not run: {why}")
        return 1 if not all(c.python_ok for c in found) else 2
    return 0 if all(c.ok for c in found) else 1


if __name__ == "__main__":
    sys.exit(main())
