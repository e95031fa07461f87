"""bench/gateway_throughput.py's machinery, briefly: the stand-in backends, `kvtide serve` in
front of them, wrk's closed loop and the open-loop sender all produce a sane result (requests
answered, none failed, every backend used, CPU counted). No speed is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed"),
]


def test_throughput_bench_runs_briefly(tmp_path: Path) -> None:
    out = tmp_path / "rps.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gateway_throughput.py"),
         "--only", "direct,kvtide cost (text)", "--runs", "1", "--duration", "1",
         "--concurrency", "4", "--rate", "50", "--rate-duration", "1",
         "--conversations", "40", "--system-chars", "300", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["median"]) == {"direct", "kvtide cost (text)"}
    assert "kvtide cost (text)" in proc.stdout and "medians of 1 runs" in proc.stdout
    for name, runs in result["runs"].items():
        (run,) = runs
        closed = run["closed"]["4"]
        assert closed["requests"] > 0 and closed["rps"] > 0, name
        assert closed["errors"] == 0 and closed["non2xx"] == 0, name
        assert 0 < closed["p50_us"] <= closed["p99_us"], name
        assert run["open"]["requests"] > 0 and run["open"]["errors"] == 0, name
        assert run["open"]["p50_ms"] <= run["open"]["p99_ms"], name
    gateway = result["runs"]["kvtide cost (text)"][0]
    assert gateway["closed"]["4"]["cpu_us_per_request"] > 0
    # wrk's requests (and its warm-up's) reached the backends through the gateway
    assert len(gateway["served_per_backend"]) == 4
    assert sum(n > 0 for n in gateway["served_per_backend"]) >= 2
    assert sum(gateway["served_per_backend"]) >= gateway["closed"]["4"]["requests"]
