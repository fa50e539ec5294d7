"""``python -m tools.oracle PATH...``: the spec oracle's verdict on each run's traces.

PATH: folders of a run's traces (``daemon-*.ndjson``, ``engine-*.ndjson``; each folder is one run), or
folders holding such folders. Prints one verdict per run, and on a rejection the logged steps no
behaviour of the spec takes, with their files and lines. Exit status 0 when every run is a behaviour of
the spec, 1 otherwise (or when there is no trace).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tools.oracle.traces import check_paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.oracle", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="folders of a run's traces")
    args = parser.parse_args(argv)
    verdicts = check_paths(args.paths)
    if not verdicts:
        print(f"oracle: no daemon trace under {', '.join(map(str, args.paths))}")
        return 1
    for verdict in verdicts:
        print(verdict.report())
    return 0 if all(v.accepted for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
