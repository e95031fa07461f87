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


# The engine server's real-model backend may use kvtide.tensors (the layering allows it), but
# not torch or gguf themselves: those stay behind the tensors package's own API.
TENSORS_USERS = ("engine_server",)


def test_only_the_tensors_package_imports_torch_or_gguf() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        top = path.relative_to(SRC).parts[:1]
        if "tensors" in top:
            continue
        heavy = HEAVY[:2] if any(u in top for u in TENSORS_USERS) else HEAVY
        for name in imported_modules(path):
            if any(name == h or name.startswith(h + ".") for h in heavy):
                offenders.append(f"{path.relative_to(SRC)} imports {name}")
    assert offenders == []


def test_core_imports_without_loading_torch() -> None:
    code = (
        "import sys, kvtide, kvtide.core.cache, kvtide.core.hashing, kvtide.core.block_pool; "
        "print(sorted(m for m in ('torch', 'gguf') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
