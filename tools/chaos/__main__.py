"""``python -m tools.chaos``: seeded fault schedules on the harness (``tools.chaos.campaign``), then on
real servers (``tools.chaos.real``), every trace checked against the protocol.

Schedule n's seed is ``--seed`` plus n; a failing one is printed with the command that replays it
alone. Results: ``<out>/schedules.ndjson`` (one line per schedule) and ``<out>/summary.md``. The exit
status says whether every schedule held; the time budget is reported beside it.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tools.chaos import campaign
from tools.chaos.campaign import Outcome
from tools.chaos.rank_scripts import FAULT_KINDS
from tools.mirror.check_spec import find_jar

LIMIT_S = 20 * 60  # the campaign's time budget on this machine, reported (not enforced)


def _worker(seeds: list[int], root: Path, model_dir: str, cfg: Any, keep: bool, tlc: str, queue: Any) -> None:
    """Run ``seeds`` one after the other (a worker forked after the imports; it forks the ranks)."""
    for seed in seeds:
        out = campaign.run_schedule(seed, root / f"s{seed}", model_dir, cfg, tlc)
        if out.ok and not keep:
            campaign.cleanup(root / f"s{seed}")
        queue.put(out)


def harness_schedules(seeds: list[int], jobs: int, root: Path, keep: bool, tlc: str) -> Iterator[Outcome]:
    """Each schedule's outcome as it ends, ``jobs`` workers at once."""
    model_dir, cfg = campaign.model(root)
    fork = multiprocessing.get_context("fork")
    queue: Any = fork.SimpleQueue()
    workers = [
        fork.Process(target=_worker, args=(seeds[k::jobs], root, model_dir, cfg, keep, tlc, queue)) for k in range(jobs)
    ]
    for worker in workers:
        worker.start()
    for _ in seeds:
        yield queue.get()
    for worker in workers:
        worker.join()


def real_schedules(seeds: list[int], root: Path, keep: bool, tlc: str) -> Iterator[Outcome]:
    from tools.chaos import real
    from tools.realserver.server import DiskReferences

    references = DiskReferences(root / "references", real.START_TIMEOUT_S, real.PROMPT_TIMEOUT_S)
    for seed in seeds:
        checked = tlc == "all" or (tlc == "sample" and campaign.tlc_sampled(seed))
        out = real.run_real_schedule(seed, root / f"real{seed}", references, checked)
        if out.ok and not keep:
            campaign.cleanup(root / f"real{seed}")
        yield out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed (default 1)")
    parser.add_argument("--schedules", type=int, default=500, help="harness schedules (default 500)")
    parser.add_argument("--real", type=int, default=5, help="schedules on real servers after them (default 5)")
    parser.add_argument("--out", type=Path, default=Path("chaos-results"), help="results folder")
    parser.add_argument("--jobs", type=int, default=3, help="harness schedules run at once (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep each schedule's folder (traces, logs)")
    tlc = parser.add_mutually_exclusive_group()
    tlc.add_argument(
        "--tlc",
        action="store_true",
        help="TLC on every schedule's traces (spec/TraceLayoutProtocol.tla; needs TLA2TOOLS_JAR); by default "
        "TLC checks a seeded one in ten schedules and every failing harness schedule, where its jar is found",
    )
    tlc.add_argument("--no-tlc", action="store_true", help="no TLC at all, only the Python checkers")
    args = parser.parse_args(argv)
    jar, why = find_jar()
    if args.tlc and jar is None:
        print(f"--tlc: TLC is not here: {why}", file=sys.stderr)
        return 2
    tlc_mode = "off" if args.no_tlc or jar is None else "all" if args.tlc else "sample"
    tlc_flag = " --tlc" if args.tlc else " --no-tlc" if args.no_tlc else ""
    args.out.mkdir(parents=True, exist_ok=True)
    campaign.warm_imports()
    root = campaign.workdir()
    started = time.monotonic()
    failed: list[tuple[str, Outcome]] = []
    kills: collections.Counter[str] = collections.Counter()
    faults: collections.Counter[str] = collections.Counter()  # reply faults injected, by kind
    anomalies: collections.Counter[str] = collections.Counter()  # the last engine's restarts and refusals, by cause
    notes: collections.Counter[str] = collections.Counter()
    timings: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    steps: dict[str, collections.Counter[str]] = {"harness": collections.Counter(), "real": collections.Counter()}
    runs = [
        (
            "harness",
            "--schedules 1 --real 0",
            args.schedules,
            harness_schedules,
            (args.jobs, root, args.keep, tlc_mode),
        ),
        ("real", "--schedules 0 --real 1", args.real, real_schedules, (root, args.keep, tlc_mode)),
    ]
    with open(args.out / "schedules.ndjson", "w") as log:
        for kind, replay, count, schedules, extra in runs:
            part_started = time.monotonic()
            for n, out in enumerate(schedules([args.seed + n for n in range(count)], *extra)):
                kills[kind] += out.kills
                faults.update(out.faults)
                anomalies.update(out.anomalies)
                if out.oracle:
                    kills["oracle checked"] += 1
                timings.update(out.timings)
                steps[kind].update(out.daemon_steps)
                if out.tlc_ok is not None:
                    kills["tlc checked"] += 1
                    kills["tlc accepted"] += out.tlc_ok
                notes.update(re.sub(r"^E\d+ ", "an engine ", note).split(":")[0] for note in out.notes)
                log.write(json.dumps({"kind": kind, **out.__dict__}) + "\n")
                log.flush()
                print(
                    f"[{time.monotonic() - started:7.1f}s] {kind} {n + 1}/{count} seed {out.seed}: "
                    f"{'ok' if out.ok else 'FAILED'} ({len(out.ops)} operations, {out.kills} kills inside "
                    f"protocol steps, {out.seconds:.1f} s)",
                    flush=True,
                )
                if not out.ok:
                    failed.append((f"--seed {out.seed} {replay}{tlc_flag}", out))
                    print("  " + "\n  ".join(out.ops + out.notes + out.problems), flush=True)
            seconds[kind] = time.monotonic() - part_started
    elapsed = time.monotonic() - started
    if jar is None:
        tlc_said = f" TLC did not run: its jar is not here ({why.splitlines()[0]})."
    elif tlc_mode == "off":
        tlc_said = " TLC did not run (--no-tlc)."
    else:
        sample = "every schedule" if tlc_mode == "all" else "a seeded one in ten and every failing one"
        checked = f"{kills['tlc accepted']} of {kills['tlc checked']} schedules"
        tlc_said = f" TLC accepted the traces of {checked} ({sample})."
    oracle_said = f" The independent oracle (tools.oracle) checked {kills['oracle checked']} schedules."
    fault_kinds = ", ".join(f"{faults[k]} {k}" for k in FAULT_KINDS)
    lines = [
        "# make chaos",
        "",
        f"{args.schedules} harness schedules in {seconds['harness']:.0f} s ({kills['harness']} kills inside protocol "
        f"steps) and {args.real} on real servers in {seconds['real']:.0f} s ({kills['real']} kills), seeds from "
        f"{args.seed}: {elapsed:.0f} s in all, {'within' if elapsed <= LIMIT_S else 'OVER'} the "
        f"{LIMIT_S // 60}-minute budget; {len(failed)} failed.{tlc_said}{oracle_said}",
        "",
        f"Reply faults on a rank's request: {sum(faults.values())} ({fault_kinds}).",
        "",
        "| the last engine's daemons restarted, or a rejoin refused, by cause | schedules |",
        "| --- | ---: |",
        *(f"| {cause} | {count} |" for cause, count in sorted(anomalies.items())),
        "",
        "| what happened | times |",
        "| --- | ---: |",
        *(f"| {what} | {count} |" for what, count in notes.most_common()),
        "",
        "| the daemons' traced steps, by event | harness | real servers |",
        "| --- | ---: | ---: |",
        *(
            f"| {event} | {steps['harness'][event]} | {steps['real'][event]} |"
            for event, _ in (steps["harness"] + steps["real"]).most_common()
        ),
        "",
        "| where the harness's time went (summed over its workers) | seconds |",
        "| --- | ---: |",
        *(f"| {what} | {s:.1f} |" for what, s in timings.most_common()),
    ]
    for replay, out in failed:
        lines += ["", f'## seed {out.seed}: replay with `make chaos CHAOS_ARGS="{replay} --keep"`', ""]
        lines += [f"- {p}" for p in out.problems]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print(lines[2])
    print(lines[4])
    if anomalies:
        causes = ", ".join(f"{n} {c}" for c, n in sorted(anomalies.items()))
        print(f"the last engine's daemons restarted, or a rejoin refused: {causes}")
    for replay, out in failed:
        print(f'seed {out.seed} failed; replay: make chaos CHAOS_ARGS="{replay} --keep"')
    if not failed and not args.keep:
        campaign.cleanup(root)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
