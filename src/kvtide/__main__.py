"""`python -m kvtide` is the `kvtide` command; ``run`` is also its console script's entry."""

import sys


def run() -> int:
    try:
        from kvtide.cli import main
    except KeyboardInterrupt:  # Ctrl-C while the CLI's own modules import (argparse and up)
        print("kvtide: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
