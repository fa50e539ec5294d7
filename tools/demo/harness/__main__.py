"""``python -m tools.demo.harness [--quick] [--out DIR] [--cases 0,1,...]``: run the demo (``make demo``)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

CASES = ("M1", "0", "1", "2", "M2b", "3", "M2a", "M3")  # the order matters: see lab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo.harness", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer rebalances and prompts (the CI test)")
    parser.add_argument("--out", default="demo-results", help="where results.md/.json and the picture go")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--no-picture", action="store_true")
    parser.add_argument(
        "--keep-workdir",
        action="store_true",
        help="keep the work folder (sockets) for a post-mortem; logs are in OUT/logs",
    )
    args = parser.parse_args(argv)
    selected = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(selected) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")

    # Imports after argument parsing: they pull torch (and the engines pull sglang).
    from tools.demo import picture, results
    from tools.demo.harness import cases
    from tools.demo.harness.lab import Demo, Options

    opt = Options(
        quick=args.quick,
        outdir=args.out,
        rebalances=2 if args.quick else 3,
        num_tokens=32 if args.quick else 64,
        picture=not args.no_picture,
        keep_workdir=args.keep_workdir,
    )
    demo = Demo(opt)
    demo.step(f"expert-layout demo on CPU: toy MoE {demo.cfg.to_dict()}, cases {','.join(selected)}")
    # All daemons start at once: each forks from one preloaded forkserver.
    needs = {"P0": {"M1", "0"}, "P1": {"1", "2", "M2b", "3"}, "P3": {"M2a"}, "P4": {"M3"}}
    kinds = {"P0": "plain", "P1": "protocol", "P3": "protocol", "P4": "no_record"}
    for name, used_by in needs.items():
        if used_by & set(selected):
            demo.start_pair(name, kinds[name])
    runners = {
        "M1": cases.matrix_new_engine_old_daemon,
        "0": cases.case0_bug,
        "1": cases.case1_restart,
        "2": cases.case2_standby,
        "M2b": cases.matrix_old_engine_after_move,
        "3": cases.case3_kill,
        "M2a": cases.matrix_old_engine_before_move,
        "M3": cases.matrix_no_eplb_daemon,
    }
    failed = False
    try:
        for case in CASES:
            if case not in selected:
                continue
            try:
                runners[case](demo)
            except Exception as exc:  # one broken case must not hide the others' rows
                failed = True
                demo.step(f"case {case}: could not run: {type(exc).__name__}: {exc}")
                traceback.print_exc()
                demo.results.add(
                    results.Row(case, "could not run", "", f"{type(exc).__name__}: {exc}"[:300], {}, False)
                )
    finally:
        demo.results.meta["quick"] = opt.quick
        demo.results.meta["toy_moe"] = demo.cfg.to_dict()
        files = results.write(demo.results, opt.outdir)
        if opt.picture and {"before_believed", "after_believed"} <= set(demo.picture):
            png = os.path.join(opt.outdir, "layout.png")
            if picture.draw(png, **demo.picture):
                files.append(png)
            else:
                demo.step("picture skipped: matplotlib is not installed (make demo installs it)")
        demo.close()
    print()
    print(results.text_table(demo.results))
    print()
    demo.step(f"wrote {', '.join(files)}")
    ok = demo.results.all_passed and not failed
    demo.step("every case as designed" if ok else "SOME CASES DID NOT GO AS DESIGNED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
