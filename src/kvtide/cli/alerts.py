"""`kvtide alerts`: the early-warning detector as Prometheus alerting rules (and their tests)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

from kvtide.errors import ConfigError
from kvtide.telemetry.detector import DetectorConfig
from kvtide.telemetry.rules import rules, unit_tests


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "alerts",
        help="write Prometheus alerting rules equivalent to the online early warning",
        description=(
            "Writes recording and alerting rules (pool undersized, cold start, fragmentation) "
            "that compute what kvtide's online detector computes, for Prometheus rule_files; "
            "with --tests also a unit-test file for promtool test rules, which checks the "
            "rules against the detector's verdicts on synthetic series."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, metavar="FILE", help="rules file")
    parser.add_argument(
        "--tests", type=Path, metavar="FILE", help="also write promtool unit tests here"
    )
    parser.add_argument(
        "--by",
        default="instance",
        metavar="LABELS",
        help="comma list of labels an alert is raised per (default instance: per engine; "
        "'job' for a fleet)",
    )
    for f in dataclasses.fields(DetectorConfig):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=float,
            default=f.default,
            metavar="X",
            help=f"detector setting (default {f.default:g})",
        )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = DetectorConfig(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(DetectorConfig)}
        )
    except ValueError as exc:
        raise ConfigError(f"--fast-s/--slow-s/--interval-s: {exc}") from exc
    by = [b.strip() for b in args.by.split(",") if b.strip()]
    if any(not b.isidentifier() for b in by):
        raise ConfigError(f"--by: not a list of label names: {args.by!r}")
    _write(args.out, rules(config, by))
    if args.tests is not None:
        rel = Path(args.out).resolve()
        with contextlib.suppress(ValueError):  # not below the tests' folder: keep it absolute
            rel = rel.relative_to(Path(args.tests).resolve().parent)
        _write(args.tests, unit_tests(config, str(rel), by[-1] if by else "job"))
    print(f"wrote {args.out}" + (f" and {args.tests}" if args.tests else ""), file=sys.stderr)
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc
