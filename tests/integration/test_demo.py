"""`kvtide demo` as a real process: a short run writes both routers' results, and Ctrl-C
(SIGINT) during a run leaves no child process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(SRC)}


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid``, from /proc."""
    parent_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parent_of[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {c for c, p in parent_of.items() if p in frontier} - found
        found |= frontier
    return found


def is_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_short_demo_compares_both_routers(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    proc = subprocess.run(
        [sys.executable, "-m", "kvtide", "demo", "--replicas", "2", "--duration", "3",
         "--json", str(out)],
        env=_env(), capture_output=True, text=True, timeout=200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["router"] for r in runs] == ["cost", "round_robin"]
    for r in runs:
        assert set(r) == {"router", "requests", "errors", "cached_token_ratio", "ttft_s"}
        assert r["requests"] > 0 and r["errors"] == 0
        assert 0.0 < r["cached_token_ratio"] < 1.0  # system prompts are shared across sessions
        assert 0.0 < r["ttft_s"]["p50"] <= r["ttft_s"]["p99"]
    assert runs[0]["requests"] == runs[1]["requests"]  # one workload, replayed twice
    assert "round_robin" in proc.stdout and "cost" in proc.stdout


def test_sigint_stops_every_child() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtide", "demo", "--replicas", "2", "--duration", "60"],
        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        # two engines and the gateway running, and the load under way (the dashboard is live)
        while time.monotonic() < deadline and len(seen) < 3:
            seen |= children_of(proc.pid)
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        assert len(seen) >= 3, seen
        time.sleep(3.0)
        seen |= children_of(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130, err[-2000:]
        survivors = {pid for pid in seen if is_alive(pid)}
        assert not survivors, survivors
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        for pipe in (proc.stdout, proc.stderr):  # a timed-out communicate leaves them open
            if pipe is not None:
                pipe.close()
        for pid in seen:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
