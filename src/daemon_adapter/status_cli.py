"""``expert-layout status``: the expert-layout state of weight cache daemons; ``expert-layout repair``.

Queries one socket (``--socket PATH``, repeatable) or every daemon socket that sglang's
``SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE`` matches (``{device_uuid}`` as a wildcard), with
``expert_layout_query``, and prints version, the version of its durable copy (``DURABLE``: "off",
or a copy it could not use at its start, with why, in ``DETAIL``), digest, pending move, dirty state
with its reason, attached engines and the non-following flag: a table, JSON with ``--json``, or
Prometheus's text exposition format with ``--prometheus``, for a node exporter's textfile
collector (``render_prometheus``; README, "Metrics").

Exit codes: 0 every daemon answered; 3 no daemon found; 4 a daemon was found but did not
answer (4 wins over 5); 5 a daemon answered as an older daemon without the layout requests.

``expert-layout repair`` asks each daemon (the same ``--socket`` or discovery) to reload, from the
checkpoint, the layers of an interrupted move (``expert_layout_repair``) and prints what each did:
layers, seconds, bytes read against the checkpoint's. Exit codes: 0 every daemon repaired; 6 one
refused or failed (a clean daemon refuses: nothing to repair); 3 and 4 as above.

``expert-layout export --out FILE`` asks each daemon (the same ``--socket`` or discovery) for its
record with the map, and writes the layout they all hold as sglang's ``--init-expert-location`` file
(``daemon_adapter.layout_file``): a plain sglang server started with ``--init-expert-location FILE``
routes with that layout. It writes nothing, and leaves an existing FILE as it was, unless every daemon
answered, is clean (no move pending, not dirty, not repairing) and keeps a record, and every record has
the same version and digest; otherwise it prints, per daemon, what is wrong and what to do. ``FILE``
must end in ``.json`` (sglang reads any other value as inline JSON or a ``.pt`` file). Exit codes: 0
written; 7 refused, nothing written (no daemon found or answering, an older daemon, a daemon dirty,
repairing, with a move pending or without a record, or records that differ); 8 the file could not be
written (the old one untouched); 2 a usage error (argparse's).

The command speaks sglang's framing through ``daemon_adapter.client``, the engine plugin's client
too, and imports no sglang module: importing sglang takes seconds, too long for a status command.
Replies are unpickled without any class (they are plain dicts).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import pickle
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from daemon_adapter.client import request
from layout_sm.record import LayoutRecord

EXIT_OK = 0
EXIT_NO_DAEMON = 3
EXIT_NOT_ANSWERING = 4
EXIT_OLDER_DAEMON = 5
EXIT_NOT_REPAIRED = 6
EXIT_EXPORT_REFUSED = 7
EXIT_EXPORT_NOT_WRITTEN = 8
# A repair reloads some layers from disk: seconds on a small model, minutes on a large one.
REPAIR_TIMEOUT_S = 1800.0

# sglang 0.5.23's default for SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE (sglang/srt/environ.py);
# a test checks that it still is.
SGLANG_DEFAULT_SOCKET_TEMPLATE = "/tmp/sglang_weight_cache_{device_uuid}.sock"
SOCKET_TEMPLATE_ENV = "SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"

ANSWERED = "answered"
NOT_ANSWERING = "not_answering"
OLDER_DAEMON = "older_daemon"


@dataclass(frozen=True)
class DaemonStatus:
    socket_path: str
    outcome: str  # ANSWERED, NOT_ANSWERING or OLDER_DAEMON
    state: dict[str, Any] | None = None  # the query reply, when answered
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"socket": self.socket_path, "outcome": self.outcome, "state": self.state, "detail": self.detail}


def socket_template() -> str:
    """sglang's socket template: its environment variable, or sglang's default."""
    return os.environ.get(SOCKET_TEMPLATE_ENV) or SGLANG_DEFAULT_SOCKET_TEMPLATE


def discover_sockets(template: str) -> list[str]:
    """Every existing socket file the template matches, ``{device_uuid}`` being any name."""
    pattern = "*".join(glob.escape(part) for part in template.split("{device_uuid}"))
    found = []
    for path in sorted(glob.glob(pattern)):
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            continue
    return found


def query_daemon(socket_path: str, timeout: float, include_map: bool = False) -> DaemonStatus:
    from layout_sm.messages import is_older_daemon_reply, query_request
    from layout_sm.reasons import Reply

    try:
        # Any owner's socket: an operator (root, say) may inspect other users' daemons, and the
        # reply is unpickled without classes.
        wire = request(socket_path, query_request(include_map=include_map), timeout, owner_only=False)
    except (OSError, ConnectionError, ValueError, pickle.UnpicklingError, EOFError) as error:
        return DaemonStatus(socket_path, NOT_ANSWERING, detail=f"{type(error).__name__}: {error}")
    try:
        reply = Reply.from_wire(wire)
    except ValueError:
        if is_older_daemon_reply(wire):
            return DaemonStatus(
                socket_path,
                OLDER_DAEMON,
                detail=f"daemon does not know the layout requests: {wire.get('message')}",
            )
        return DaemonStatus(socket_path, NOT_ANSWERING, detail=f"unexpected reply: {wire!r:.200}")
    if not reply.ok:
        return DaemonStatus(socket_path, NOT_ANSWERING, detail=str(reply))
    return DaemonStatus(socket_path, ANSWERED, state=reply.to_wire())


def exit_code(statuses: Sequence[DaemonStatus]) -> int:
    if not statuses:
        return EXIT_NO_DAEMON
    outcomes = {s.outcome for s in statuses}
    if NOT_ANSWERING in outcomes:
        return EXIT_NOT_ANSWERING
    if OLDER_DAEMON in outcomes:
        return EXIT_OLDER_DAEMON
    return EXIT_OK


def _describe_move(move: dict[str, Any] | None) -> str:
    if not move:
        return "-"
    return f"{move.get('engine_id')} layers {move.get('layers')} from v{move.get('base_version')}"


def _progress(progress: dict[str, Any] | None) -> str:
    """A running reload's progress, as the daemon reports it: tensors and bytes read of those it reads."""
    if not progress:
        return ""
    return (
        f" ({progress.get('tensors')}/{progress.get('tensors_expected')} tensors, "
        f"{progress.get('bytes')}/{progress.get('bytes_expected')} bytes read)"
    )


def _durable(state: Mapping[str, Any]) -> tuple[str, str]:
    """The durable copy's column (the version it holds, or "off" where the daemon keeps none), and
    what the detail says of it: a copy set aside at the start, a write that failed."""
    durable = state.get("durable")
    if not isinstance(durable, dict):
        return "off", ""  # a daemon without a durable copy (--expert-layout-no-copy, or no record) says none
    column = "none yet" if durable.get("version") is None else f"v{durable.get('version')}"
    notes = []
    at_start = durable.get("at_start") or {}
    if at_start.get("kind") not in (None, "whole", "missing"):
        notes.append(f"copy not used at start ({at_start.get('kind')}): {at_start.get('why')}")
    if durable.get("write_failure"):
        notes.append(f"copy not written: {durable.get('write_failure')}")
    return column, "; ".join(notes)


def _row(status: DaemonStatus) -> list[str]:
    state = status.state
    if state is None:
        return [status.socket_path, status.outcome, "-", "-", "-", "-", "-", "-", "-", status.detail]
    digest = state.get("digest")
    dirty, repairing, failure = state.get("dirty"), state.get("repairing"), state.get("repair_failed")
    if repairing and repairing.get("rejoin"):
        torn = (
            f"rejoining: started again from disk, asked by {repairing.get('engine_id')}; reloading every layer "
            f"at v{repairing.get('base_version')}{_progress(state.get('repair_progress'))}"
        )
    elif repairing:
        torn = (
            f"repairing: {_describe_move(repairing)} left mid-move; reloading layers {repairing.get('layers')} "
            f"back to v{repairing.get('base_version')}{_progress(state.get('repair_progress'))}"
        )
    else:
        torn = "-" if not dirty else f"yes: {_describe_move(dirty)} left mid-move"
    durable, durable_note = _durable(state)
    detail = "; ".join(part for part in ("" if not failure else f"repair failed: {failure}", durable_note) if part)
    return [
        status.socket_path,
        str(state.get("phase")),
        "-" if state.get("version") is None else str(state.get("version")),
        durable,
        "-" if digest is None else str(digest)[:16],
        _describe_move(state.get("pending")),
        torn,
        _attachments(state),
        "yes" if state.get("non_following_seen") else "no",
        detail,
    ]


def _attachments(state: Mapping[str, Any]) -> str:
    """Each attached engine and whether it is a parked warm standby; an unparked one counts for begins."""
    parked = set(state.get("parked") or ())
    names = [f"{e} (standby, parked)" if e in parked else f"{e} (unparked)" for e in state.get("attached") or []]
    return ",".join(names) or "-"


def render_table(statuses: Sequence[DaemonStatus]) -> str:
    header = [
        "SOCKET",
        "STATE",
        "VERSION",
        "DURABLE",
        "DIGEST",
        "PENDING",
        "DIRTY",
        "ATTACHED",
        "NON-FOLLOWING",
        "DETAIL",
    ]
    rows = [header, *(_row(s) for s in statuses)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


PROMETHEUS_PREFIX = "sglang:expert_layout_daemon_"  # sglang's prefix, as the engine's series (engine_adapter.metrics)


def render_prometheus(statuses: Sequence[DaemonStatus]) -> str:
    """Every daemon's state as gauges labelled by socket, in the text exposition format.

    ``up`` is 1 for a layout-aware daemon that answered (0: not answering, or an older daemon);
    the other series are there only for a daemon that answered. ``phase`` is 1 for its phase."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    def family(name: str, documentation: str, labels: Sequence[str] = ("socket",)) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PROMETHEUS_PREFIX}{name}", documentation, labels=list(labels))

    found = GaugeMetricFamily(f"{PROMETHEUS_PREFIX}found", "Weight cache daemon sockets found.", value=len(statuses))
    up = family("up", "1 when a layout-aware daemon answered the query.")
    phase = family(
        "phase", "1 for the daemon's phase (no_record, clean, pending, dirty, repairing).", ("socket", "phase")
    )
    version = family("record_version", "The version of the daemon's layout record.")
    durable = family("durable_version", "The version its durable copy holds (absent: none, or the copy is off).")
    attached = family("attached_engines", "Engines attached to the daemon.")
    pending = family("pending", "1 while a move is pending.")
    dirty = family("dirty", "1 when the layout is unknown (a mover left mid-move): the daemon refuses engines.")
    non_following = family("non_following_seen", "1 once an engine that does not follow moves was served.")
    for status in statuses:
        up.add_metric([status.socket_path], 1 if status.outcome == ANSWERED else 0)
        state = status.state
        if status.outcome != ANSWERED or state is None:
            continue
        phase.add_metric([status.socket_path, str(state.get("phase"))], 1)
        if state.get("version") is not None:
            version.add_metric([status.socket_path], int(state["version"]))
        copy = state.get("durable")
        if isinstance(copy, dict) and copy.get("version") is not None:
            durable.add_metric([status.socket_path], int(copy["version"]))
        attached.add_metric([status.socket_path], len(state.get("attached") or []))
        pending.add_metric([status.socket_path], 1 if state.get("pending") else 0)
        dirty.add_metric([status.socket_path], 1 if state.get("dirty") else 0)
        non_following.add_metric([status.socket_path], 1 if state.get("non_following_seen") else 0)
    families = [found, up, phase, version, durable, attached, pending, dirty, non_following]

    class _Snapshot:
        def collect(self) -> list[GaugeMetricFamily]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot())  # type: ignore[arg-type]
    return generate_latest(registry).decode()


@dataclass(frozen=True)
class RepairOutcome:
    socket_path: str
    reply: dict[str, Any] | None  # the daemon's reply, when it answered
    detail: str = ""

    @property
    def repaired(self) -> bool:
        from layout_sm.reasons import Reply

        if self.reply is None:
            return False
        try:
            return Reply.from_wire(self.reply).ok
        except ValueError:  # not a layout reply: nothing was repaired
            return False

    def to_json(self) -> dict[str, Any]:
        return {"socket": self.socket_path, "reply": self.reply, "detail": self.detail}

    def line(self) -> str:
        reply = self.reply
        if reply is None:
            return f"{self.socket_path}: not answering: {self.detail}"
        if not self.repaired:
            return f"{self.socket_path}: {reply.get('status')}({reply.get('reason')}): {reply.get('message')}"
        share = reply["bytes_read"] / reply["checkpoint_bytes"] if reply.get("checkpoint_bytes") else 0.0
        return (
            f"{self.socket_path}: repaired layers {reply.get('layers')} in {reply.get('seconds')} s: "
            f"{reply.get('bytes_read')} bytes read of {reply.get('checkpoint_bytes')} ({share:.1%}), "
            f"{reply.get('checkpoint_tensors_read')} checkpoint tensors into {len(reply.get('params_touched') or [])} "
            f"parameters; clean at version {reply.get('version')} (digest {str(reply.get('digest'))[:16]})"
        )


def repair_daemon(socket_path: str, timeout: float) -> RepairOutcome:
    from layout_sm.messages import repair_request

    try:
        wire = request(socket_path, repair_request(), timeout)
    except (OSError, ConnectionError, ValueError, pickle.UnpicklingError, EOFError) as error:
        return RepairOutcome(socket_path, None, f"{type(error).__name__}: {error}")
    if not isinstance(wire, dict):
        return RepairOutcome(socket_path, None, f"unexpected reply: {wire!r:.200}")
    return RepairOutcome(socket_path, wire)


def _sockets(named: Sequence[str] | None) -> tuple[list[str], str]:
    if named:
        # A named path that is not there is "not found", like a template that matches nothing.
        return [path for path in named if os.path.exists(path)], ", ".join(named)
    template = socket_template()
    return discover_sockets(template), f"SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE={template}"


def _repair_main(args: argparse.Namespace) -> int:
    sockets, where = _sockets(args.socket)
    if not sockets:
        print(f"no weight cache daemon found ({where})", file=sys.stderr)
        return EXIT_NO_DAEMON
    # The daemons of a server's ranks repair at once, each in its own process.
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(sockets)) as pool:
        outcomes = list(pool.map(lambda path: repair_daemon(path, args.timeout), sockets))
    if any(o.reply is None for o in outcomes):
        code = EXIT_NOT_ANSWERING
    else:
        code = EXIT_OK if all(o.repaired for o in outcomes) else EXIT_NOT_REPAIRED
    if args.json:
        print(json.dumps({"exit_code": code, "daemons": [o.to_json() for o in outcomes]}, indent=2))
    else:
        for outcome in outcomes:
            print(outcome.line(), file=sys.stdout if outcome.repaired else sys.stderr)
    return code


_THEN_EXPORT = "then run `expert-layout export` again"


@dataclass(frozen=True)
class ExportProblem:
    """Why one daemon keeps ``expert-layout export`` from writing the file, and what to do."""

    socket_path: str
    what: str
    advice: str

    def line(self) -> str:
        return f"{self.socket_path}: {self.what}; to do: {self.advice}"

    def to_json(self) -> dict[str, str]:
        return {"socket": self.socket_path, "what": self.what, "advice": self.advice}


def _exportable(index: int, status: DaemonStatus) -> LayoutRecord | ExportProblem:
    """A daemon's record, or why it cannot be exported (``layout_sm.export``)."""
    from layout_sm.export import exportable_record

    path = status.socket_path
    if status.outcome == NOT_ANSWERING:
        return ExportProblem(
            path,
            f"did not answer ({status.detail})",
            "if it crashed (its socket file stays), start it again with the servers' arguments (`python -m "
            "daemon_adapter ...`, with --expert-layout-start-alone beside running daemons) and start a server on "
            f"the set, whose startup has it rejoin at the others' layout, {_THEN_EXPORT}; or name only the "
            "daemons that run with --socket",
        )
    if status.outcome == OLDER_DAEMON:
        return ExportProblem(
            path,
            f"an older daemon, which keeps no layout record ({status.detail})",
            "run the daemons with `python -m daemon_adapter` and the servers' --enable-eplb",
        )
    assert status.state is not None
    found = exportable_record(index, status.state, path, _THEN_EXPORT)
    if isinstance(found, LayoutRecord):
        return found
    what, advice = found
    return ExportProblem(path, what, advice)


def _disagreements(records: Sequence[tuple[str, LayoutRecord]]) -> list[ExportProblem]:
    """The daemons whose record is not the one layout: version and digest both, as an engine's startup
    compares them (``StartupRules.records_differ``). Where the newest version is one record, the daemons
    behind it are the ones to fix (a server's startup has them rejoin at it); else every daemon is."""
    from layout_sm.reasons import RESTART_DAEMONS

    stamps = sorted({(record.version, record.digest) for _, record in records})
    if len(stamps) < 2:
        return []
    newest = stamps[-1][0]
    one_newest = len([stamp for stamp in stamps if stamp[0] == newest]) == 1
    held = " and ".join(f"version {version} (digest {digest[:16]})" for version, digest in stamps)
    not_one_set = "; if these daemons are not one server's set, name one set's sockets with --socket"
    problems = []
    for path, record in records:
        if one_newest and record.version == newest:
            continue
        what = f"its record differs: version {record.version} (digest {record.digest[:16]}); the daemons hold {held}"
        if one_newest:
            advice = (
                "start a server with the plugin on these daemons: its startup has the daemons behind rejoin at "
                f"version {newest}; {_THEN_EXPORT}{not_one_set}"
            )
        else:
            advice = RESTART_DAEMONS + not_one_set
        problems.append(ExportProblem(path, what, advice))
    return problems


def agreed_layout(statuses: Sequence[DaemonStatus]) -> tuple[LayoutRecord | None, list[ExportProblem]]:
    """The one record every daemon holds, or the problems that keep it from being exported (none when no
    daemon was asked: the caller says where it looked)."""
    records: list[tuple[str, LayoutRecord]] = []
    problems: list[ExportProblem] = []
    for index, status in enumerate(statuses):
        found = _exportable(index, status)
        if isinstance(found, ExportProblem):
            problems.append(found)
        else:
            records.append((status.socket_path, found))
    problems += _disagreements(records)
    if problems or not records:
        return None, problems
    return records[0][1], []


def _written(record: LayoutRecord, out: str, daemons: int) -> dict[str, Any]:
    return {
        "path": out,
        "version": record.version,
        "digest": record.digest,
        "layers": record.num_layers,
        "physical_slots": record.num_physical,
        "logical_experts": record.num_logical,
        # sglang's --ep-num-redundant-experts: it must match, and sglang does not check it (layout_file).
        "redundant_experts": record.num_physical - record.num_logical,
        "daemons": daemons,
    }


def _daemons(count: int) -> str:
    return "the daemon asked" if count == 1 else f"the {count} daemons asked"


def _export_main(args: argparse.Namespace) -> int:
    from daemon_adapter.layout_file import init_expert_location_json, write_atomically

    out = os.path.abspath(args.out)
    sockets, where = _sockets(args.socket)
    statuses = [query_daemon(path, args.timeout, include_map=True) for path in sockets]
    record, problems = agreed_layout(statuses)
    if record is None and not statuses:
        problems = [
            ExportProblem(
                where,
                "no weight cache daemon found",
                "start the daemons, or name their sockets (--socket, SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE)",
            )
        ]
    written: dict[str, Any] | None = None
    error = ""
    if record is None:
        code = EXIT_EXPORT_REFUSED
    else:
        try:
            write_atomically(out, init_expert_location_json(record.rows))
        except OSError as exc:
            code, error = EXIT_EXPORT_NOT_WRITTEN, f"{type(exc).__name__}: {exc}"
        else:
            code, written = EXIT_OK, _written(record, out, len(statuses))
    if args.json:
        report = {"exit_code": code, "out": out, "written": written, "problems": [p.to_json() for p in problems]}
        print(json.dumps({**report, "error": error or None}, indent=2))
    elif written is not None:
        print(
            f"wrote {out}: version {written['version']}, digest {written['digest']}, {written['layers']} layers x "
            f"{written['physical_slots']} physical slots ({written['logical_experts']} logical experts, "
            f"{written['redundant_experts']} redundant), held alike by {_daemons(written['daemons'])}\n"
            f"start a plain sglang server with it: python -m sglang.launch_server ... --ep-num-redundant-experts "
            f"{written['redundant_experts']} --init-expert-location {out}"
        )
    elif error:
        print(f"expert-layout export: could not write {out} ({error}); an existing file is as it was", file=sys.stderr)
    else:
        print(f"expert-layout export: refused, nothing written to {out}:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem.line()}", file=sys.stderr)
    return code


def _json_path(value: str) -> str:
    from daemon_adapter.layout_file import INIT_EXPERT_LOCATION_SUFFIX

    if not value.endswith(INIT_EXPERT_LOCATION_SUFFIX):
        raise argparse.ArgumentTypeError(
            f"{value!r} does not end in {INIT_EXPERT_LOCATION_SUFFIX}: sglang reads --init-expert-location as a "
            "JSON file only by that suffix (any other value as inline JSON, or as a .pt file)"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="expert-layout", description="Expert-layout tools for sglang's weight cache.")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        """A subcommand that asks daemons: the ones named by ``--socket``, else every one found."""
        sub = commands.add_parser(
            name, help=summary, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        sub.add_argument(
            "--socket",
            action="append",
            metavar="PATH",
            help="a daemon's socket (repeatable); default: every socket SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE matches",
        )
        return sub

    status = command("status", "show the expert-layout state of weight cache daemons")
    output = status.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print JSON instead of a table")
    output.add_argument(
        "--prometheus",
        action="store_true",
        help="print Prometheus's text format (for a node exporter's textfile collector) instead of a table",
    )
    status.add_argument("--include-map", action="store_true", help="with --json: include the full map")
    status.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each daemon (default 5)")
    repair = command("repair", "reload a dirty daemon's interrupted layers from the checkpoint; report what was done")
    repair.add_argument("--json", action="store_true", help="print JSON instead of one line per daemon")
    repair.add_argument(
        "--timeout",
        type=float,
        default=REPAIR_TIMEOUT_S,
        help=f"seconds to wait for each daemon (default {REPAIR_TIMEOUT_S:g})",
    )
    export = command("export", "write the daemons' expert layout as sglang's --init-expert-location file")
    export.add_argument("--out", required=True, type=_json_path, metavar="FILE", help="the file to write (*.json)")
    export.add_argument("--json", action="store_true", help="print JSON instead of lines")
    export.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each daemon (default 5)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "repair":
        return _repair_main(args)
    if args.command == "export":
        return _export_main(args)
    sockets, where = _sockets(args.socket)
    statuses = [query_daemon(path, args.timeout, include_map=args.include_map) for path in sockets]
    code = exit_code(statuses)
    if args.json:
        print(json.dumps({"exit_code": code, "daemons": [s.to_json() for s in statuses]}, indent=2))
    elif args.prometheus:
        print(render_prometheus(statuses), end="")
    elif not statuses:
        print(f"no weight cache daemon found ({where})", file=sys.stderr)
    else:
        print(render_table(statuses))
        for status in statuses:
            if status.outcome != ANSWERED:
                print(f"{status.socket_path}: {status.outcome}: {status.detail}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
