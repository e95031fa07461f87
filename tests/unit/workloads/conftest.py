"""Fixtures for the workload tests: small trace files written to tmp_path."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kvtide.types import Request

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


def fields(request: Request) -> tuple[object, ...]:
    """A request as a comparable tuple: Request compares by identity and may hold an array."""
    values = [getattr(request, field.name) for field in dataclasses.fields(request)]
    return tuple(tuple(v.tolist()) if hasattr(v, "tolist") else v for v in values)
