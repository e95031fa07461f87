"""Fixtures: vLLM-shaped backends and a `kvtide serve` process on free loopback ports."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.gateway.procs import (
    Proc,
    backend,
    close_openai_clients,
    free_port,
    gateway,
)

KEYS = {name: f"sk-{name}-0123456789" for name in ("alpha", "beta", "gamma", "delta", "eps")}
SECRET = "test-tenant-secret"


@pytest.fixture(autouse=True)
def _close_openai_clients() -> Iterator[None]:
    yield
    close_openai_clients()


@pytest.fixture
def backends() -> Iterator[list[tuple[Proc, int]]]:
    procs: list[tuple[Proc, int]] = []
    try:
        for _ in range(2):
            port = free_port()
            procs.append((backend(port, "m", "--token-delay", "0.002"), port))
        yield procs
    finally:
        for proc, _ in procs:
            proc.stop()


def write_keys(path: Path, keys: dict[str, str], **limits: int) -> Path:
    lines = ["tenants:"]
    for name, key in keys.items():
        lines.append(f"  - name: {name}")
        lines.append(f"    key_sha256: {hashlib.sha256(key.encode()).hexdigest()}")
        for k, v in limits.items():
            lines.append(f"    {k}: {v}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def keyed_gateway(
    backends: list[tuple[Proc, int]], tmp_path: Path
) -> Iterator[tuple[str, list[tuple[Proc, int]]]]:
    keys = write_keys(tmp_path / "keys.yaml", KEYS)
    port = free_port()
    replicas = [a for _, p in backends for a in ("--replica", f"http://127.0.0.1:{p}")]
    gw = gateway(
        port, *replicas, "--api-keys", str(keys), "--tenant-secret", SECRET, "--admin-key", "adm"
    )
    try:
        yield f"http://127.0.0.1:{port}", backends
    finally:
        gw.stop()


@pytest.fixture
def redis_client() -> Any:
    """The machine's Redis on 127.0.0.1:6379 (skip without one, or without the package)."""
    redis = pytest.importorskip("redis")
    client = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    return client
