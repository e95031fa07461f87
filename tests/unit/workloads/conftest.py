"""Fixtures for the workload tests: small trace files written to tmp_path."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

WriteLines = Callable[[str, Sequence[object]], Path]


@pytest.fixture
def write_lines(tmp_path: Path) -> WriteLines:
    """Writes one line per item (dicts as JSON, strings verbatim) and returns the path."""

    def write(name: str, lines: Sequence[object]) -> Path:
        path = tmp_path / name
        text = [line if isinstance(line, str) else json.dumps(line) for line in lines]
        path.write_text("\n".join(text) + "\n")
        return path

    return write
