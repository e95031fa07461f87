"""bench/revision.py: the revision every benchmark reports is this checkout's, marked -dirty when
tracked files differ from it, wherever the script is started from, and "unknown" without git."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

import revision

ROOT = Path(__file__).resolve().parents[3]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def expected() -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    rev = git("rev-parse", "--short", "HEAD")
    return rev + "-dirty" if git("status", "--porcelain", "--untracked-files=no") else rev


@needs_git
def test_git_rev_is_this_checkouts_short_commit() -> None:
    assert revision.git_rev() == expected()


@needs_git
def test_git_rev_does_not_depend_on_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = expected()
    monkeypatch.chdir(tmp_path)
    assert revision.git_rev() == want


def test_git_rev_is_unknown_without_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no git on PATH
    assert revision.git_rev() == "unknown"


@needs_git
def test_git_rev_is_unknown_outside_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "revision.py"
    shutil.copy(revision.__file__, copy)
    spec = importlib.util.spec_from_file_location("revision_copy", copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delenv("GIT_DIR", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repo above tmp_path
    assert module.git_rev() == "unknown"
