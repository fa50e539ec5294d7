"""Data-driven tests of the daemon machine, in the manner of etcd's raft ``testdata/*.txt``.

A file is a list of blocks: a command line, ``----``, the expected output, a blank line.
Run with ``REWRITE=1`` to regenerate the expected output on purpose, then review the diff.

Commands (values are Python literals):
  daemon map=[[0,1],[1,0]] logical=2   start a daemon with that initial record
  daemon none                          start a daemon that keeps no record
  attach A                             A attaches; its session is remembered
  detach A [session=stale]             A's connection reaches EOF (stale: A's previous session)
  begin A base=0 layers=[0] [session=…]
  commit A layers=[0] rows=[[1,0]] [session=…]
  abort A [session=…]
  fetch A [digest=initial|current] [version=N] [session=…]   an attached engine's fetch_state
  fetch older                          an engine without the plugin (no expert_layout field)
  query
  park A [session=…]                   a warm standby parks its attachment (issue 18)
  claim A [session=…]                  a parked standby claims the primary role
"""

from __future__ import annotations

import ast
import os
import shlex
from pathlib import Path
from typing import Any

from layout_sm import messages
from layout_sm.daemon import DaemonMachine, DaemonView, RepairDone, RepairFailed
from layout_sm.reasons import Reason, Reply, Status
from layout_sm.record import LayoutRecord

SEPARATOR = "----"


class ScenarioRunner:
    def __init__(self) -> None:
        self.daemon: DaemonMachine | None = None
        self.initial: LayoutRecord | None = None
        self.sessions: dict[str, list[str]] = {}

    def _session(self, engine: str, args: dict[str, object]) -> str:
        chosen = args.get("session")
        if chosen == "stale":
            return self.sessions[engine][-2]
        if isinstance(chosen, str):
            return chosen
        return self.sessions.get(engine, ["none"])[-1]

    def run(self, line: str) -> str:
        words = shlex.split(line)
        command, positional = words[0], [w for w in words[1:] if "=" not in w]
        args = {k: _literal(v) for k, v in (w.split("=", 1) for w in words[1:] if "=" in w)}
        if command == "daemon":
            self.initial = None if positional == ["none"] else LayoutRecord.initial(args["map"], args["logical"])
            self.daemon = DaemonMachine(self.initial, auto_repair=args.get("auto_repair", "on") == "on")
            self.sessions = {}
            return _render_state(self.daemon.view())
        daemon = self.daemon
        assert daemon is not None, "start with a 'daemon' command"
        engine = positional[0] if positional else ""
        if command == "attach":
            session = f"s{engine}{len(self.sessions.get(engine, [])) + 1}"
            reply = daemon.attach_engine(messages.AttachRequest(engine), session)
            if reply.ok:
                self.sessions.setdefault(engine, []).append(session)
            out = _render_reply(reply)
        elif command == "detach":
            effect = daemon.detach_engine(engine, self._session(engine, args))
            out = f"{'dropped' if effect.dropped else 'ignored'}: {effect.message}"
            if effect.notified:
                out += f"\nnotice to {list(effect.notified)}"
        elif command == "begin":
            req = messages.BeginRequest(engine, self._session(engine, args), args["base"], tuple(args["layers"]))
            out = _render_reply(daemon.begin_move(req))
        elif command == "commit":
            rows = tuple(tuple(r) for r in args["rows"])
            req = messages.CommitRequest(engine, self._session(engine, args), tuple(args["layers"]), rows)
            out = _render_reply(daemon.commit_move(req))
        elif command == "abort":
            out = _render_reply(daemon.abort_move(messages.AbortRequest(engine, self._session(engine, args))))
        elif command == "fetch":
            out = _render_reply(daemon.fetch_check(self._claim(engine, args)))
        elif command == "repair":
            out = _render_reply(daemon.begin_repair())
        elif command == "repair_done":
            out = _render_noticing(daemon.handle(RepairDone(tuple(args["layers"]), "reloaded")).reply)
        elif command == "repair_failed":
            out = _render_noticing(daemon.handle(RepairFailed(Reason.REPAIR_FAILED, str(args["why"]))).reply)
        elif command == "park":
            out = _render_noticing(daemon.park_engine(messages.ParkRequest(engine, self._session(engine, args))))
        elif command == "claim":
            out = _render_reply(daemon.claim_primary(messages.ClaimRequest(engine, self._session(engine, args))))
        elif command == "query":
            out = _render_reply(daemon.query_state())
        else:
            raise ValueError(f"unknown scenario command {command!r}")
        return f"{out}\n{_render_state(daemon.view())}"

    def _claim(self, engine: str, args: dict[str, object]) -> messages.FetchLayoutField | None:
        if engine == "older":
            return None
        view = self.daemon.view() if self.daemon else None
        record = view.record if view else None
        source = self.initial if args.get("digest") == "initial" else record
        digest = source.digest if source else "0" * 64
        version = args.get("version", source.version if source else 0)
        return messages.FetchLayoutField(engine, self._session(engine, args), int(version), digest)  # type: ignore[arg-type]


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _render_noticing(reply: Reply) -> str:
    """A reply, then the parked standbys it tells (a park, a repair's end)."""
    return _render_reply(reply) + (f"\nnotice to {reply.data['notified']}" if reply.data.get("notified") else "")


def _render_reply(reply: Reply) -> str:
    head = f"{reply.status.value}({reply.reason.value})"
    if reply.status is Status.OK:
        extra = {k: reply.data[k] for k in ("version", "session") if k in reply.data}
        return head + "".join(f" {k}={v}" for k, v in extra.items())
    return f"{head}: {reply.message}"


def _render_state(view: DaemonView) -> str:
    record = view.record
    version = "-" if record is None else f"v{record.version}"
    pending = (
        "-"
        if view.pending is None
        else (f"{view.pending.engine_id}{list(view.pending.layers)}@v{view.pending.base_version}")
    )
    dirty = "-" if view.dirty is None else f"{view.dirty.engine_id}{list(view.dirty.layers)}@v{view.dirty.base_version}"
    return (
        f"state: {view.phase} {version} pending={pending} dirty={dirty} "
        f"attached={sorted(view.attachments)} non_following={'yes' if view.non_following_seen else 'no'}"
        + ("" if view.repair_failed is None else f" repair_failed={view.repair_failed!r}")
        + ("" if not view.parked else f" parked={sorted(view.parked)}")
    )


def run_file(path: Path, runner: Any = None) -> tuple[str, str]:
    """Return (the file as written, the file with outputs as this code produces them).

    ``runner`` has ``run(command_line) -> output`` (a ``ScenarioRunner`` of a daemon by default)."""
    text = path.read_text()
    runner = ScenarioRunner() if runner is None else runner
    blocks, produced = text.strip("\n").split("\n\n"), []
    for block in blocks:
        lines = block.splitlines()
        comments = [line for line in lines if line.startswith("#")]
        body = [line for line in lines if not line.startswith("#")]
        if not body:
            produced.append("\n".join(comments))
            continue
        command = body[0]
        produced.append("\n".join([*comments, command, SEPARATOR, runner.run(command)]))
    return text, "\n\n".join(produced) + "\n"


def maybe_rewrite(path: Path, produced: str) -> bool:
    if os.environ.get("REWRITE") == "1":
        path.write_text(produced)
        return True
    return False
