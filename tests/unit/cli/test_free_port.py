"""free_port picks a loopback port below the kernel's ephemeral range (where no outgoing
connection's source port can take it before the child binds), free when picked, never twice."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from kvtide.cli import processes
from kvtide.cli.processes import LOOPBACK, free_port


def _ephemeral_low() -> int:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    if low < 12_000:
        pytest.skip(f"the ephemeral range starts at {low}: no room below it")
    return low


def _bindable(port: int) -> bool:
    """A listener can take ``port`` now (the child's own bind, as a test sees it)."""
    try:
        socket.create_server((LOOPBACK, port), reuse_port=False).close()
    except OSError:
        return False
    return True


def test_picks_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low = _ephemeral_low()
    picks = [free_port() for _ in range(300)]
    assert len(set(picks)) == len(picks)
    assert all(10_000 <= p < low for p in picks)
    assert all(_bindable(p) for p in picks)


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    low = _ephemeral_low()
    first = random.Random(7).randrange(max(10_000, low - 12_288), low)
    with socket.socket() as held:
        try:
            held.bind((LOOPBACK, first))
        except OSError:
            pytest.skip(f"port {first} is taken on this machine already")
        held.listen()
        monkeypatch.setattr(processes, "_RANDOM", random.Random(7))
        monkeypatch.setattr(processes, "_PICKED", set())
        port = free_port()
    assert port != first
    assert 10_000 <= port < low


def test_without_the_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(processes, "_EPHEMERAL", str(tmp_path / "absent"))
    port = free_port()
    assert port > 0 and _bindable(port)
    assert port != free_port()
