"""``python -m tools.demo.real [--out DIR]``: ``make demo`` on real sglang servers.

Every server is ``python -m sglang.launch_server`` (TP2/EP2, a tiny Qwen3-MoE built here, on
CPU through the test-only CPU bridge), requests go over HTTP with greedy sampling, daemons are
spawned (``--weight-cache-mode daemon``) or standalone (``python -m daemon_adapter``). The
terminal gets one line per step; sglang's logs go to ``DIR/logs/``; ``DIR`` gets the results
table (``results.md``, ``results.json``), ``status.md`` (every ``expert-layout status`` run) and
``layout.png``. The run's wall time and the peak memory of its process tree (PSS; the RSS sum
beside it) are measured against the limits (10 minutes, 16 GB) and reported in the table.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

LIMIT_S = 600.0
LIMIT_GB = 16.0

INTRO = (
    "Real servers: `python -m sglang.launch_server` (sglang 0.5.23, TP2/EP2 with 2 redundant experts,",
    "`--enable-eplb`, a tiny Qwen3-MoE built here) on CPU through the test-only CPU bridge; greedy",
    "requests over HTTP; weight cache daemons spawned by a server (`--weight-cache-mode daemon`) or",
    "standalone (`python -m daemon_adapter`, engines in `client` mode). A slot is *wrong* when the",
    "daemon's memory (read with sglang's own `fetch_state`, each slot matched against the checkpoint)",
    "holds another expert than the engine's map says. `status.md` has every `expert-layout status`",
    "run between the steps; sglang's logs are in `logs/`.",
)


def trace_row(logs: Any) -> Any:
    """Every daemon and engine rank of the run wrote its protocol trace (``RunDir``); each must replay on
    the protocol's machines, and every answer a rank took must be its daemon's (``tools.trace_check``).
    Where TLC is here, it must give each run's daemon traces the same verdict (``tools.mirror.trace_tla``)."""
    from tools.demo import results
    from tools.mirror.trace_tla import compare
    from tools.trace_check import check_all, reports, summary

    verdicts = check_all([logs])
    daemons = [v for v in verdicts if v.kind == "daemon"]
    engines = [v for v in verdicts if v.kind == "engine"]
    bad = [v for v in verdicts if not v.ok]
    observed = summary(verdicts) + ("" if not bad else "\n" + reports(bad))
    expected = (
        "every trace is a behaviour of the protocol (python -m tools.trace_check), and TLC says so too "
        "where it is here (make check-traces)"
    )
    runs, why = compare([logs], verdicts=verdicts)
    checked = [c for c in runs if c.tlc is not None]
    if checked:
        observed += (
            f"; TLC on the daemon traces of {len(checked)} runs: "
            + ("the same verdict, a behaviour" if all(c.ok for c in checked) else "NOT all a behaviour")
            + f" ({sum(c.tlc.distinct or 0 for c in checked if c.tlc)} distinct states, "
            f"{sum(c.tlc.seconds for c in checked if c.tlc):.1f} s)"
        )
        for c in checked:
            if c.tlc is not None and c.tlc.report:
                observed += "\n" + c.tlc.report
    else:
        observed += f"; TLC not run here ({why.splitlines()[0]})"
    disagree = [c for c in runs if not c.ok]
    numbers = {
        "traces": len(daemons),
        "steps": sum(v.steps for v in daemons),
        "fetches_served": sum(v.fetches_served for v in daemons),
        "notices_sent": sum(v.notices_sent for v in daemons),
        "engine_traces": len(engines),
        "engine_steps": sum(v.steps for v in engines),
        "answers_matched": sum(v.matched for v in verdicts),
        "check_s": round(sum(v.seconds for v in verdicts), 3),
        "tlc_runs": len(checked),
        "tlc_s": round(sum(c.tlc.seconds for c in checked if c.tlc), 1),
    }
    return results.Row("T", "protocol traces", expected, observed, numbers, bool(daemons) and not bad and not disagree)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo.real", description=__doc__)
    parser.add_argument("--out", default="demo-results", help="results, picture and logs go here")
    parser.add_argument("--no-picture", action="store_true")
    known = ("off", "noeplb", "aware", "repairoff")
    parser.add_argument("--chains", default=",".join(known), help=f"a subset of {','.join(known)} (debugging)")
    args = parser.parse_args(argv)
    chains = [c.strip() for c in args.chains.split(",") if c.strip()]
    unknown = sorted(set(chains) - set(known))
    if unknown:
        parser.error(f"unknown chains {unknown}; known: {', '.join(known)}")

    from tools.demo import picture, results
    from tools.demo.procmon import ResourceMeter
    from tools.demo.real import cases
    from tools.demo.real.lab import Lab

    meter = ResourceMeter().start()
    os.makedirs(args.out, exist_ok=True)
    lab = Lab(args.out)
    lab.step(f"expert-layout demo on real sglang servers: model {lab.model.name}; sglang's logs in {lab.logs}/")
    res = results.Results(intro=INTRO)  # its clock is the run's (the results file's run time)
    try:
        rows, ev = cases.run_all(lab, chains)
    finally:
        lab.close()
        meter.stop()
    for row in rows:
        res.add(row)
    res.add(trace_row(lab.logs))
    usage = meter.to_json()
    # Memory is judged on PSS (each shared page divided among the processes that map it: the
    # physical memory the tree takes); the RSS sum counts torch's libraries once per process.
    within = usage["wall_s"] <= LIMIT_S and usage["peak_pss_gb"] <= LIMIT_GB
    load = os.getloadavg()
    res.add(
        results.Row(
            "limits",
            "time and memory on 2 cores",
            f"at most {LIMIT_S / 60:.0f} minutes and {LIMIT_GB:.0f} GB peak",
            f"{usage['wall_s']} s wall; peak memory of the process tree {usage['peak_pss_gb']} GB PSS "
            f"(the RSS sum, shared pages counted in every process, peaked at {usage['peak_rss_gb']} GB; "
            f"{usage['peak_processes']} processes at most); CPU {usage['cpu_busy_s']} s busy, "
            f"{usage['cpu_use']:.0%} of {os.cpu_count()} cores over the run; load average at the end "
            f"{load[0]:.1f}/{load[2]:.1f} (1/15 min)",
            {
                "wall_s": usage["wall_s"],
                "peak_pss_gb": usage["peak_pss_gb"],
                "peak_rss_gb": usage["peak_rss_gb"],
                "cpu_busy_s": usage["cpu_busy_s"],
                "load_15min": round(load[2], 1),
            },
            within,
            judged=False,
        )
    )
    res.meta["usage"] = usage
    res.meta["servers"] = lab.timings()
    files = results.write(res, args.out)
    files.append(os.path.join(args.out, "status.md"))
    if not args.no_picture and {"before", "after"} <= set(ev):
        png = os.path.join(args.out, "layout.png")
        (b_believed, b_held), (a_believed, a_held) = ev["before"], ev["after"]
        if picture.draw(png, b_believed, b_held, a_believed, a_held):
            files.append(png)
        else:
            lab.step("picture skipped: matplotlib is not installed (make demo installs it)")
    print()
    print(results.text_table(res))
    print()
    lab.step(f"wrote {', '.join(files)}")
    lab.step(
        f"wall {usage['wall_s']} s, peak PSS {usage['peak_pss_gb']} GB (RSS sum {usage['peak_rss_gb']} GB) "
        f"(limits {LIMIT_S:.0f} s, {LIMIT_GB:.0f} GB)"
    )
    for row in res.limits_exceeded:
        lab.step(f"warning: {row.title} exceeded ({row.expected}): {row.observed.split(';')[0]}; not a failure")
    lab.step("every protocol case as designed" if res.all_passed else "SOME CASES DID NOT GO AS DESIGNED")
    return 0 if res.all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
