"""Import arrows: costs <- core <- routing | engine <- state | telemetry <- gateway | sim <- cli;
asgi (the servers' shared HTTP layer) imports only the leaves and sits below both servers.

Checked from the source with ast, so a wrong import fails here before it tangles anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "kvtide"

# package -> kvtide packages it may import (besides itself and the leaf modules)
ALLOWED: dict[str, set[str]] = {
    "costs": set(),
    "text": set(),
    "core": {"costs"},
    "workloads": set(),
    "routing": {"core", "costs"},
    "engine": {"core", "costs"},
    "state": {"core", "costs", "routing"},
    "telemetry": {"core", "costs", "routing", "engine"},
    "tensors": {"core", "costs", "text"},
    "sim": {"core", "costs", "routing", "engine", "state", "telemetry", "workloads"},
    "asgi": set(),
    "gateway": {"asgi", "core", "costs", "routing", "state", "telemetry", "text", "workloads"},
    "engine_server": {
        "asgi",
        "core",
        "costs",
        "routing",
        "engine",
        "state",
        "telemetry",
        "tensors",
        "text",
    },
    "loadgen": {"text", "workloads"},
}
LEAVES = {"errors", "types", "clock", "registry", "quantities", "display"}
# Third-party modules that must stay out of the synchronous, pure layers.
FORBIDDEN_THIRD_PARTY = {
    "costs": {"redis", "zmq", "httpx", "starlette", "prometheus_client", "torch", "asyncio"},
    "text": {"torch", "asyncio"},
    "core": {"redis", "zmq", "httpx", "starlette", "prometheus_client", "torch", "asyncio"},
    "routing": {"redis", "zmq", "httpx", "starlette", "prometheus_client", "torch", "asyncio"},
    "workloads": {"redis", "zmq", "torch"},
    "asgi": {"redis", "zmq", "torch", "aiohttp", "prometheus_client"},
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def package_files() -> list[tuple[str, Path]]:
    out = []
    for pkg in ALLOWED:
        for path in sorted((SRC / pkg).rglob("*.py")) if (SRC / pkg).exists() else []:
            out.append((pkg, path))
    return out


@pytest.mark.parametrize(("pkg", "path"), package_files(), ids=lambda v: str(v))
def test_imports_flow_one_way(pkg: str, path: Path) -> None:
    for name in imports_of(path):
        parts = name.split(".")
        if parts[0] == "kvtide" and len(parts) > 1:
            target = parts[1]
            if target in LEAVES or target == pkg:
                continue
            assert target in ALLOWED[pkg], f"{path.relative_to(SRC)} imports kvtide.{target}"
        else:
            banned = FORBIDDEN_THIRD_PARTY.get(pkg, set())
            assert parts[0] not in banned, f"{path.relative_to(SRC)} imports {parts[0]}"
