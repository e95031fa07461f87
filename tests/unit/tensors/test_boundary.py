"""torch stays inside kvtide.tensors: nothing else imports it, and the core works without it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch

pytest.importorskip("torch")

SRC = Path(__file__).resolve().parents[3] / "src" / "kvtide"
HEAVY = ("torch", "gguf", "kvtide.tensors")


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_tensors_package_imports_torch_or_gguf() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        if "tensors" in path.relative_to(SRC).parts[:1]:
            continue
        for name in imported_modules(path):
            if any(name == h or name.startswith(h + ".") for h in HEAVY):
                offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert offenders == []


def test_core_imports_without_loading_torch() -> None:
    code = (
        "import sys, kvtide, kvtide.core.cache, kvtide.core.hashing, kvtide.core.block_pool; "
        "print(sorted(m for m in ('torch', 'gguf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
