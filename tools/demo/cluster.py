"""``python -m tools.demo.cluster [--out DIR]``: ``make demo-cluster``, the protocol across two nodes on
real sglang servers.

The cases are the two-node real-server tests (``tests/realserver/test_two_nodes.py``), run here by
pytest: a case went as designed when its test's assertions held, so the demo and ``make test`` judge
with one set of checks. Each test's docstring says what is designed. The terminal gets pytest's line
per case; ``DIR`` gets the results table (``results.md``, ``results.json``) and ``rejoin.png``: after
a node is lost whole, the time until every daemon serves the record again and the bytes read, with
the rejoin beside a restart of every daemon of both nodes, measured in the same run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

from tools.demo import results

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "realserver" / "test_two_nodes.py"
# The figures the tests write for the results (tests/realserver/test_two_nodes.py).
FIGURES = {
    "standby_tp4": REPO / "build" / "two-node-standby-tp4.json",
    "rejoin_tp4": REPO / "build" / "two-node-rejoin-tp4.json",
}

INTRO = (
    "Two nodes on one machine, as two hosts would run them: each node its own daemon sockets, ready",
    "files, logs and processes, TCP between them. Servers are `python -m sglang.launch_server --nnodes 2",
    "--node-rank K` (sglang 0.5.23, a tiny Qwen3-MoE built here, on CPU through the test-only CPU",
    "bridge), in client mode on each node's `python -m daemon_adapter --nnodes 2 --node-rank K`, or in",
    "daemon mode. Each case is a test of `tests/realserver/test_two_nodes.py`; *expected* is its",
    "docstring, and the case is as designed when every assertion of the test held.",
)


class CaseCollector:
    """A pytest plugin that keeps each case's docstring, outcome, time and failure."""

    def __init__(self) -> None:
        self.docs: dict[str, str] = {}
        self.outcomes: dict[str, dict[str, Any]] = {}

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            self.docs[item.nodeid] = " ".join((inspect.getdoc(item.function) or "").split())

    def pytest_runtest_logreport(self, report: Any) -> None:
        seen = self.outcomes.setdefault(report.nodeid, {"passed": True, "seconds": 0.0, "failure": ""})
        seen["seconds"] += report.duration
        if report.failed:
            seen["passed"] = False
            seen["failure"] = seen["failure"] or str(report.longrepr).strip().splitlines()[-1][:600]


def _title(nodeid: str) -> str:
    """``test_a_case[tp4-two-ranks-per-node]`` as ``a case, tp4 two ranks per node``."""
    name, _, param = nodeid.rsplit("::", 1)[-1].removeprefix("test_").partition("[")
    words = name.replace("_", " ")
    return f"{words}, {param.rstrip(']').replace('-', ' ')}" if param else words


def _tp(nodeid: str) -> int | None:
    """The TP size of a case's parameters (``[tp4-...]``), if it has them."""
    for tp in (2, 4):
        if f"[tp{tp}-" in nodeid:
            return tp
    return None


def _figures(name: str) -> dict[str, Any]:
    path = FIGURES[name]
    return json.loads(path.read_text()) if path.exists() else {}


def rejoin_row(tp: int, figures: dict[str, Any], case_passed: bool) -> results.Row:
    """The node's loss in figures: rejoin against a restart of every daemon, from the same run; as
    designed when its case was."""
    title = f"TP{tp}: rejoin against a full restart"
    if not figures:
        return results.Row(f"R{tp}", title, "figures of the rejoin case", "none written", {})
    observed = (
        f"{figures['topology']}: node 1's daemons started alone in {figures['node_alone_start_s']} s and "
        f"rejoined at version {figures['version']} in {figures['rejoin_in_daemon_s']} s inside each daemon, "
        f"reading {figures['rejoin_bytes_read']:,} bytes in all (the checkpoint: {figures['checkpoint_bytes']:,}); "
        f"node 0's daemons reloaded nothing; the next server served in {figures['server_ready_with_rejoin_s']} s. "
        f"Every daemon of both nodes SIGKILLed and started again took {figures['full_restart_both_nodes_s']} s, "
        f"each from its durable copy at version {figures['version']}; the next server adopted it and served in "
        f"{figures.get('server_ready_after_full_restart_s', '?')} s"
    )
    expected = (
        "the rejoin reloads only the lost node's routed experts and keeps the record; a full restart starts "
        "every daemon from its durable copy"
    )
    return results.Row(f"R{tp}", title, expected, observed, dict(figures), case_passed)


def draw(path: Path, figures: dict[str, Any]) -> bool:
    """Bars: seconds until every daemon serves again after the node's loss, each way."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    alone, rejoin = figures["node_alone_start_s"], figures["rejoin_in_daemon_s"]
    full = figures["full_restart_both_nodes_s"]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.barh([1], [alone], color="#7a9cc6", label="node 1's daemons: load from disk, alone")
    ax.barh([1], [rejoin], left=[alone], color="#2b6cb0", label="its rejoin (every layer's experts)")
    ax.barh([0], [full], color="#c0504d", label="every daemon of both nodes, from its durable copy")
    ax.set_yticks(
        [0, 1],
        [
            f"full restart\n(durable copies: version {figures['version']})",
            f"rejoin\n(record kept: version {figures['version']})",
        ],
    )
    ax.set_xlabel("seconds until every daemon serves again, after node 1 is lost whole")
    ax.text(alone + rejoin, 1, f"  +{rejoin} s, {figures['rejoin_bytes_read']:,} bytes", va="center", fontsize=8)
    ax.set_xlim(0, max(alone + rejoin, full) * 1.45)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo.cluster", description=__doc__)
    parser.add_argument("--out", default="demo-results/cluster", help="results and picture go here")
    parser.add_argument("-k", dest="select", default=None, help="only the cases pytest's -k selects (debugging)")
    args = parser.parse_args(argv)
    import pytest

    for path in FIGURES.values():  # a case that fails early must not leave an older run's figures
        path.unlink(missing_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    collector = CaseCollector()
    started = time.monotonic()
    res = results.Results(intro=INTRO, expected_from="the test's docstring")  # its run time counts from here
    pytest_args = ["-v", "-p", "no:cacheprovider", str(CASES), *(["-k", args.select] if args.select else [])]
    code = pytest.main(pytest_args, plugins=[collector])
    for number, (nodeid, outcome) in enumerate(collector.outcomes.items(), start=1):
        observed = "as designed" if outcome["passed"] else f"failed: {outcome['failure']}"
        numbers = {"seconds": round(outcome["seconds"], 1)}
        standby = _figures(f"standby_tp{_tp(nodeid)}") if "standby" in nodeid and _tp(nodeid) else {}
        if standby:
            numbers["first_token_after_sigkill_s"] = standby["first_token_after_sigkill_s"]
        title, expected = _title(nodeid), collector.docs.get(nodeid, "")
        res.add(results.Row(f"N{number}", title, expected, observed, numbers, outcome["passed"]))
    figures = {name: _figures(name) for name in FIGURES}
    case = [o["passed"] for nodeid, o in collector.outcomes.items() if "rejoins" in nodeid and _tp(nodeid) == 4]
    res.add(rejoin_row(4, figures["rejoin_tp4"], case == [True]))
    res.meta["figures"] = figures
    rejoin = figures["rejoin_tp4"]
    res.meta["wall_s"] = round(time.monotonic() - started, 1)
    files = results.write(res, str(out))
    if rejoin and draw(out / "rejoin.png", rejoin):
        files.append(str(out / "rejoin.png"))
    print()
    print(results.text_table(res))
    print(f"\n[demo-cluster] wrote {', '.join(files)}; {res.meta['wall_s']} s wall")
    passed = code == 0 and res.all_passed
    print("[demo-cluster] every case as designed" if passed else "[demo-cluster] SOME CASES DID NOT GO AS DESIGNED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
