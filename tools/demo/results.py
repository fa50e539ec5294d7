"""The demo's results table: rows, the printed table, and the Markdown and JSON files."""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Row:
    """One case: what docs/protocol.md expects, what was observed, the numbers, and whether they agree."""

    case: str  # "0", "1", "2", "3a", "3b", "M1"...
    title: str
    expected: str
    observed: str
    numbers: dict[str, Any] = field(default_factory=dict)
    passed: bool = False
    # A limit (time, memory) is reported with its verdict beside it but never fails the run: the
    # exit status says whether the protocol's cases went as designed, not how fast the machine was.
    judged: bool = True

    @property
    def verdict(self) -> str:
        if self.judged:
            return "yes" if self.passed else "NO"
        return "within" if self.passed else "exceeded (warning)"


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    meta: dict[str, Any] = field(default_factory=dict)
    intro: tuple[str, ...] = ()  # the Markdown's opening paragraph; the harness's when empty
    expected_from: str = "docs/protocol.md"  # where the expected column comes from

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    @property
    def all_passed(self) -> bool:
        judged = [r for r in self.rows if r.judged]
        return bool(judged) and all(r.passed for r in judged)

    @property
    def limits_exceeded(self) -> list[Row]:
        return [r for r in self.rows if not r.judged and not r.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) for r in self.rows],
            "all_passed": self.all_passed,
            "seconds": round(time.monotonic() - self.started, 1),
            "machine": machine(),
            **self.meta,
        }


def machine() -> dict[str, Any]:
    """The machine's description, for the results files."""
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        from importlib.metadata import version

        info["sglang"] = version("sglang")
    except Exception:
        pass
    return info


def _numbers(numbers: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in numbers.items())


HARNESS_INTRO = (
    "Real daemon processes (one per rank) and 2-rank engine processes over gloo, sglang 0.5.23's",
    "EPLBManager and ExpertLocationUpdater, weights shared zero-copy through sglang's torch_ipc",
    "transport on CPU. A slot is *wrong* when its memory holds another logical expert than the",
    "engine's map says; outputs are the toy MoE's greedy tokens for fixed prompts.",
)


def markdown(results: Results) -> str:
    intro = results.intro or HARNESS_INTRO
    lines = [
        "# Expert-layout demo: results",
        "",
        *intro,
        "",
        f"| case | scenario | expected ({results.expected_from}) | observed | numbers | ok |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.rows:
        verdict = r.verdict if r.passed else f"**{r.verdict}**"
        cells = [r.case, r.title, r.expected, r.observed, _numbers(r.numbers), verdict]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    data = results.to_json()
    lines += ["", f"All as designed: {'yes' if results.all_passed else 'NO'}; run time {data['seconds']} s."]
    lines += ["", "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items())]
    return "\n".join(lines) + "\n"


def text_table(results: Results, width: int = 60) -> str:
    """The table printed at the end of the run: every cell in full, wrapped to its column."""
    import textwrap

    # The case column is as wide as its longest name: a name is never wrapped ("limits").
    case_width = max([4, *(len(r.case) for r in results.rows)])
    widths = {"case": case_width, "ok": 18, "scenario": 30, "observed": width, "numbers": 44}
    header = {k: k for k in widths}
    rows = [header] + [
        {
            "case": r.case,
            "ok": r.verdict,
            "scenario": r.title,
            "observed": r.observed,
            "numbers": _numbers(r.numbers),
        }
        for r in results.rows
    ]
    rule = "-" * (sum(widths.values()) + 2 * (len(widths) - 1))
    out = []
    for i, row in enumerate(rows):
        cells = {k: textwrap.wrap(str(row[k]), widths[k], break_on_hyphens=False) or [""] for k in widths}
        for line in range(max(len(c) for c in cells.values())):
            parts = [(cells[k][line] if line < len(cells[k]) else "").ljust(widths[k]) for k in widths]
            out.append("  ".join(parts).rstrip())
        out.append(rule if i == 0 else "")
    return "\n".join(out).rstrip()


def write(results: Results, outdir: str) -> list[str]:
    os.makedirs(outdir, exist_ok=True)
    md = os.path.join(outdir, "results.md")
    js = os.path.join(outdir, "results.json")
    with open(md, "w") as f:
        f.write(markdown(results))
    with open(js, "w") as f:
        json.dump(results.to_json(), f, indent=2)
        f.write("\n")
    return [md, js]
