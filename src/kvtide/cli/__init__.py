"""The `kvtide` command: one module per subcommand, each exposing `register(subparsers)`.

Every subcommand turns a KvtideError into one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from kvtide import __version__
from kvtide.errors import KvtideError
from kvtide.quantities import argparse_message

# Subcommand modules, imported lazily so that `kvtide cost` does not pay for the simulator.
# A module that does not exist yet is simply not offered.
_SUBCOMMANDS: dict[str, str] = {
    "replay": "kvtide.cli.replay",
    "simulate": "kvtide.cli.simulate",
    "study": "kvtide.cli.study",
    "sweep": "kvtide.cli.sweep",
    "cost": "kvtide.cli.cost",
    "calibrate": "kvtide.cli.calibrate",
    "serve": "kvtide.cli.serve",
    "engine": "kvtide.cli.engine",
    "load": "kvtide.cli.load",
    "alerts": "kvtide.cli.alerts",
    "demo": "kvtide.cli.demo",
    "profile": "kvtide.cli.profile",
    "doctor": "kvtide.cli.doctor",
}


def _available() -> dict[str, str]:
    found = {}
    for name, module in _SUBCOMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = module
    return found


class _Parser(argparse.ArgumentParser):
    """argparse's errors as one line naming the flag, exit 2, as a KvtideError reads:
    ``kvtide: error: --gpu-cache-tokens: not a token count ..., got 'x'``."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"kvtide: error: {argparse_message(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvtide",
        description="KV-cache reuse and eviction across an LLM serving fleet: replay traces "
        "through the cache, simulate fleets and routers, price reload against recompute.",
    )
    parser.add_argument("--version", action="version", version=f"kvtide {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in _available().values():
        importlib.import_module(module).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C while the subcommands import (a second or more on a cold start) is an interrupt
    # like any other: one line and 130, not a traceback from deep inside an import
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("kvtide: interrupted", file=sys.stderr)
        return 130


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a bad flag (2), --help or --version (0): a code, in-process too
        return exc.code if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KvtideError as exc:
        print(f"kvtide: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
