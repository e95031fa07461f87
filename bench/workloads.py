"""How fast workloads stream: each trace read through kvtide's reader (orjson when installed,
then forced to the standard json) against a bare `json.loads` loop, and built-ins generated.

    python bench/workloads.py ../shared/traces/mooncake_conversation.jsonl \
        ../shared/traces/azure_conv_2023.csv --builtin builtin:mixed --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from unittest import mock

from kvtide.workloads import open_workload, rows
from revision import git_rev


def _median_s(run: Callable[[], int], runs: int) -> tuple[float, int]:
    times, count = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        count = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), count


def _bare_json(path: Path) -> int:
    with path.open("rb") as file:
        return sum(1 for line in file if line.strip() and json.loads(line) is not None)


def _count(spec: str) -> int:
    return sum(1 for _ in open_workload(spec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path)
    parser.add_argument("--builtin", action="append", default=[], metavar="SPEC")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rev = git_rev()
    fast = rows._loads is not json.loads
    print(f"git {rev}  runs {args.runs} (median)  orjson {'yes' if fast else 'no'}  seed 0")
    print(
        f"{'workload':32} {'requests':>9} {'kvtide s':>9} {'json s':>9} {'bare s':>9} {'req/s':>9}"
    )
    for path in args.traces:
        kvtide_s, count = _median_s(partial(_count, str(path)), args.runs)
        with mock.patch.object(rows, "_loads", json.loads):  # the fallback without orjson
            json_s, _ = _median_s(partial(_count, str(path)), args.runs)
        line = f"{path.name[:32]:32} {count:9d} {kvtide_s:9.3f}"
        if path.suffix == ".csv":  # no JSON in a CSV: only kvtide's time means something
            print(f"{line} {'-':>9} {'-':>9} {count / kvtide_s:9.0f}")
            continue
        bare_s, _ = _median_s(partial(_bare_json, path), args.runs)
        line = f"{line} {json_s:9.3f} {bare_s:9.3f} {count / kvtide_s:9.0f}"
        print(
            f"{line}   json fallback {json_s / kvtide_s:.2f}x, bare parse {bare_s / kvtide_s:.2f}x"
        )
    for spec in args.builtin:
        built_s, count = _median_s(partial(_count, spec), args.runs)
        print(f"{spec[:32]:32} {count:9d} {built_s:9.3f} {'-':>9} {'-':>9} {count / built_s:9.0f}")


if __name__ == "__main__":
    main()
