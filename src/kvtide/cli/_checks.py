"""What every command checks before it starts work (``--jobs``, output paths) and how it
writes its output file."""

from __future__ import annotations

import os
from pathlib import Path

from kvtide.errors import ConfigError
from kvtide.quantities import flag, integer

JOBS = flag(integer, minimum=1, maximum=256)
"""``--jobs`` of every command that runs in parallel processes."""
TP = flag(integer, minimum=1, maximum=64)
"""``--tp``, the tensor-parallel degree, wherever a command takes a cost model."""


def check_writable(path: Path | None, name: str, *, directory: bool = False) -> None:
    """Refuses, before any run, an output path that cannot be written: a missing or read-only
    parent folder, a folder where a file is wanted, or a file where a folder is."""
    if path is None:
        return
    if directory:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{name}: {path} exists and is not a folder")
        target = path if path.exists() else _existing_parent(path)
    else:
        if path.is_dir():
            raise ConfigError(f"{name}: {path} is a folder, not a file")
        if path.exists() and not os.access(path, os.W_OK):
            raise ConfigError(f"{name}: {path} is not writable")
        target = path.parent
        if not target.is_dir():
            raise ConfigError(f"{name}: {path}: folder {target} does not exist")
    if not os.access(target, os.W_OK | os.X_OK):
        raise ConfigError(f"{name}: {path}: folder {target} is not writable")


def _existing_parent(path: Path) -> Path:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(f"{path}: {parent} is not a folder")
            return parent
    return Path("/")


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc
