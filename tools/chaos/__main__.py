"""``python -m tools.chaos``: run seeded fault schedules (``tools.chaos.campaign``) and report them.

Each schedule's seed is ``--seed`` plus its index; a failing one is printed with the command that
replays it alone. Results: ``<out>/schedules.ndjson`` (one line per schedule) and ``<out>/summary.md``.
The exit status says whether every schedule held; the time limit is reported beside it.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

from tools.chaos import campaign

LIMIT_S = 20 * 60  # the campaign's time budget on this machine, reported (not enforced)


def _worker(seeds: list[int], root: Path, model_dir: str, cfg: Any, keep: bool, queue: Any) -> None:
    """Run ``seeds`` one after the other (a worker forked after the imports; it forks the ranks)."""
    for seed in seeds:
        out = campaign.run_schedule(seed, root / f"s{seed}", model_dir, cfg)
        if out.ok and not keep:
            campaign.cleanup(root / f"s{seed}")
        queue.put(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=1, help="the first schedule's seed (default 1)")
    parser.add_argument("--schedules", type=int, default=500, help="how many schedules (default 500)")
    parser.add_argument("--out", type=Path, default=Path("chaos-results"), help="results folder")
    parser.add_argument("--jobs", type=int, default=2, help="schedules run at once (default 2)")
    parser.add_argument("--keep", action="store_true", help="keep each schedule's folder (traces, daemon logs)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    campaign.warm_imports()
    root, model_dir, cfg = campaign.workdir()
    started = time.monotonic()
    failed: list[campaign.Outcome] = []
    kills = 0
    notes: collections.Counter[str] = collections.Counter()
    timings: collections.Counter[str] = collections.Counter()
    seeds = [args.seed + n for n in range(args.schedules)]
    queue: Any = multiprocessing.get_context("fork").SimpleQueue()
    workers = [
        multiprocessing.get_context("fork").Process(
            target=_worker, args=(seeds[k :: args.jobs], root, model_dir, cfg, args.keep, queue)
        )
        for k in range(args.jobs)
    ]
    for worker in workers:
        worker.start()
    with open(args.out / "schedules.ndjson", "w") as log:
        for n in range(args.schedules):
            out = queue.get()
            kills += out.kills
            for what, seconds in out.timings.items():
                timings[what] += seconds
            notes.update(re.sub(r"^E\d+ ", "an engine ", note).split(":")[0] for note in out.notes)
            log.write(json.dumps(out.__dict__) + "\n")
            log.flush()
            verdict = "ok" if out.ok else "FAILED"
            print(
                f"[{time.monotonic() - started:7.1f}s] {n + 1}/{args.schedules} seed {out.seed}: {verdict} "
                f"({len(out.ops)} operations, {out.kills} kill points fired, {out.seconds:.1f} s)",
                flush=True,
            )
            if not out.ok:
                failed.append(out)
                print("  " + "\n  ".join(out.ops + out.notes + out.problems), flush=True)
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    lines = [
        "# make chaos",
        "",
        f"{args.schedules} schedules (seeds {args.seed}..{args.seed + args.schedules - 1}) in {elapsed:.0f} s "
        f"({'within' if elapsed <= LIMIT_S else 'OVER'} the {LIMIT_S // 60}-minute budget); "
        f"{kills} kill points fired inside protocol steps; {len(failed)} failed.",
        "",
        "| what happened | times |",
        "| --- | ---: |",
        *(f"| {what} | {count} |" for what, count in notes.most_common()),
        "",
        "| where the time went | seconds |",
        "| --- | ---: |",
        *(f"| {what} | {seconds:.1f} |" for what, seconds in timings.most_common()),
    ]
    for out in failed:
        lines += ["", f'## seed {out.seed}: replay with `make chaos CHAOS_ARGS="--seed {out.seed} --schedules 1"`', ""]
        lines += [f"- {p}" for p in out.problems]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[2:3]))
    for out in failed:
        print(f'seed {out.seed} failed; replay: make chaos CHAOS_ARGS="--seed {out.seed} --schedules 1 --keep"')
    if not failed:
        campaign.cleanup(root)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
