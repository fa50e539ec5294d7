"""``python -m tests.oracle.shrink SRC DST``: a run's traces cut down to what the logs read.

Why: a harness run's engine traces are tens of KB (every map they route with, every memory reading),
while the trace check reads a few fields of a few lines (``tools.mirror.trace_logs``). The fixture in
``tests/oracle/fixtures`` is such a run shrunk: the daemons' start and step lines, the engines' start
line, decisions and rebalances' ends, each with the fields the logs read, renumbered so that ``seq``
is still the line's number.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tools.mirror.trace_logs import DECISIONS, REBALANCE_END
from tools.trace_files import read_trace

_AFTER = ("phase", "version", "pending", "dirty", "repairing", "attached", "parked", "non_following_seen")
_ENGINE_AFTER = ("phase", "version", "shares", "rebalance", "role")


def _daemon_line(line: dict[str, Any]) -> dict[str, Any] | None:
    kind = line.get("kind")
    if kind == "start":
        kept = {k: line[k] for k in ("t_ns", "kind", "rows", "auto_repair") if k in line}
        return {**kept, "socket": Path(line["socket"]).name}  # the run's folder name is no part of it
    if kind != "step":
        return None
    payload = line.get("payload") or {}
    kept = {k: payload[k] for k in ("engine_id", "claim", "layers") if k in payload}
    if kept.get("claim"):
        kept["claim"] = {"engine_id": kept["claim"].get("engine_id", "")}
    answer = line["answer"]
    status = {"status": answer.get("status")} if isinstance(answer, dict) else answer
    after = {k: line["after"][k] for k in _AFTER if k in line["after"]}
    return {
        "t_ns": line["t_ns"],
        "kind": "step",
        "event": line["event"],
        "payload": kept,
        "answer": status,
        "after": after,
    }


def _engine_line(line: dict[str, Any], first: bool) -> dict[str, Any] | None:
    kind = line.get("kind")
    if first and kind == "start":
        kept = {k: line[k] for k in ("t_ns", "kind", "engine_id", "rank", "standby") if k in line}
        kept["socket"] = Path(line["socket"]).name
        if "layout" in line:
            kept["layout"] = {"rejoins": (line["layout"] or {}).get("rejoins", True)}
        return kept
    if kind == REBALANCE_END:
        return {"t_ns": line["t_ns"], "kind": kind}
    if kind == "step" and line["event"] in DECISIONS:
        after = {k: line["after"][k] for k in _ENGINE_AFTER if k in line["after"]}
        return {"t_ns": line["t_ns"], "kind": "step", "event": line["event"], "after": after}
    return None


def shrink(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.glob("*.ndjson")):
        lines = read_trace(path)
        if path.name.startswith("daemon-"):
            kept = [_daemon_line(line) for line in lines]
        elif path.name.startswith("engine-"):
            kept = [_engine_line(line, n == 0) for n, line in enumerate(lines)]
        else:
            kept = [{k: line[k] for k in ("t_ns", "kind", "engine_id") if k in line} for line in lines[:1]]
        out = [{"seq": n, **line} for n, line in enumerate((x for x in kept if x is not None), 1)]
        (dst / path.name).write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in out))


if __name__ == "__main__":
    shrink(Path(sys.argv[1]), Path(sys.argv[2]))
