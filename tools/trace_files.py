"""Reading the traces of a run (``daemon-*.ndjson``, ``engine-*.ndjson``, ``probe-*.ndjson``): pure, no
``layout_sm``.

Why apart from ``tools.trace_check``: that checker replays the traces on ``layout_sm``, while the spec
oracle (``tools.oracle``) and TLC's trace check (``tools.mirror.trace_tla``) must read the same lines
without it. One reader, so that all three judge the same steps.

Every line has ``seq``, its number in the file from 1 (the trace writers count the lines they write).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

Lines = list[dict[str, Any]]


def read_lines(path: Path) -> tuple[Lines, bool]:
    """The trace's lines, and whether its last line was cut short (the process SIGKILLed while writing
    it), which is left out. A line that is not JSON before the last ends the reading, read as a line
    ``{"seq": -1, "kind": "not JSON", "text": ...}`` that no checker takes."""
    texts = [text for text in path.read_text(encoding="utf-8").splitlines() if text.strip()]
    lines: Lines = []
    for n, text in enumerate(texts):
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            if n != len(texts) - 1:
                lines.append({"seq": -1, "kind": "not JSON", "text": text[:200]})
                return lines, False
            return lines, True
    return lines, False


def read_trace(path: Path) -> Lines:
    """The trace's whole lines."""
    return read_lines(path)[0]


def by_socket(traces: Mapping[Path, Lines]) -> dict[str, list[tuple[Path, Lines]]]:
    """Traces by the socket their start line names, each socket's in the order they started."""
    found: dict[str, list[tuple[Path, Lines]]] = {}
    for path, lines in traces.items():
        if lines and lines[0].get("kind") == "start" and lines[0].get("socket"):
            found.setdefault(lines[0]["socket"], []).append((path, lines))
    for runs in found.values():
        runs.sort(key=lambda run: run[1][0]["t_ns"])
    return found


def step_engine(line: dict[str, Any]) -> str:
    """The engine a daemon's step names: a fetch's claim, any other request's payload ("": none)."""
    payload = line.get("payload") or {}
    if line["event"] == "fetch":
        return (payload.get("claim") or {}).get("engine_id", "")
    return payload.get("engine_id", "")


def trace_files(paths: Iterable[Path], pattern: str = "daemon-*.ndjson") -> list[Path]:
    """The traces under ``paths`` named as ``pattern`` (files, or folders searched recursively); a path
    that does not exist holds none."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(path.rglob(pattern)))
        elif path.is_file() and path.match(pattern):
            found.append(path)
    return found
