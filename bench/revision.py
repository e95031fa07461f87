"""The git revision a benchmark reports with its results, in one place for every bench/ script.

The scripts used to carry their own copies of ``git rev-parse --short HEAD``, which disagreed:
some ran git in the current directory (another repository's revision, or none, when the script
was started from elsewhere), some marked uncommitted changes and some did not, and each had its
own placeholder for "no git". ``git_rev`` asks the repository that holds bench/, wherever the
script is run from, and never raises: a benchmark's header is no reason to fail a run.

The scripts are run as ``python bench/NAME.py`` (bench/ is then sys.path[0]) and import it as
``from revision import git_rev``; tests/conftest.py puts bench/ on sys.path the same way.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    """git's stripped stdout, run in bench/'s repository; None if git is missing or fails."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(HERE), *args], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def git_rev() -> str:
    """The short commit of the checkout that holds bench/, with "-dirty" when tracked files
    differ from it; "unknown" when git is not installed or bench/ is not in a checkout."""
    rev = _git("rev-parse", "--short", "HEAD")
    if not rev:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return rev + "-dirty" if dirty else rev
