"""A real Prometheus (Debian's, on loopback, temporary config and data dir) scrapes two real
`kvtide engine` processes and the `kvtide serve` gateway in front of them (fed by the engines'
KV events) under a bounded load from the official openai client through the gateway: every
panel query of the Grafana dashboard returns data through Prometheus's HTTP API (the
kvtide_router_* ones from the gateway), the alert rules `kvtide alerts` writes load,
`kvtide doctor --prometheus URL` diagnoses the pair, and each engine's /metrics and the
gateway's kvtide_* families pass `promtool check metrics`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import openai
import pytest
from engine_process import SRC, free_port, start_engine
from tests.integration.gateway.procs import gateway

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "kvtide.json"
ROUTER_PREFIX = "kvtide_router_"
"""Router panels: the gateway exports these, not an engine."""

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PROMTOOL is None, reason="Debian's prometheus package not installed"
)


def _get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return bytes(resp.read())


@contextmanager
def prometheus(tmp: Path, targets: list[str], gateways: list[str]) -> Iterator[str]:
    rules = tmp / "rules.yml"
    subprocess.run(
        [sys.executable, "-m", "kvtide", "alerts", "--out", str(rules)],
        check=True,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
        timeout=60,
        capture_output=True,
    )
    config = tmp / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: [{json.dumps(str(rules))}]\n"
        "scrape_configs:\n"
        "  - job_name: kvtide-engine\n"
        f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        "  - job_name: kvtide-gateway\n"
        f"    static_configs: [{{targets: {json.dumps(gateways)}}}]\n"
    )
    port = free_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(f"{url}/-/ready", 1.0)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp / "prometheus.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()  # by PID
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def query(url: str, expr: str, at: float) -> list[dict[str, object]]:
    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    doc = json.loads(_get(f"{url}/api/v1/query?{q}"))
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def load(base_url: str, rounds: int) -> None:
    """Prompts sharing a system prefix (hits), distinct tails (misses, evictions in a small
    pool), the first ones asked again after the pool turned over (evicted, then wanted)."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", timeout=30, max_retries=0)
    system = "You are a careful assistant for the tide tables of the northern coast. " * 6
    # (i - 5) comes back after five others: evicted from 64 blocks, inside the ghost memory.
    asks = [
        a for r in range(rounds) for i in range(10) for a in [(i, r), (i - 5, r)][: 1 + (i >= 5)]
    ]
    for i, r in asks:
        tail = f"Question {i} about harbour {i * 7 % 13}, round {r}. " * 12
        client.completions.create(
            model="llama-3-8b",
            prompt=system + tail,
            max_tokens=6,
            extra_body={"cache_salt": "t1"} if i % 3 == 0 else None,
        )


def panel_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"].replace("$instance", ".*")))
    return out


@pytest.mark.timeout(120)
def test_prometheus_scrapes_two_engines_and_a_gateway_and_every_panel_has_data(
    tmp_path: Path,
) -> None:
    args = ("--kv-cache-tokens", "1024", "--speedup", "20", "--served-model-name", "llama-3-8b")
    with ExitStack() as stack:
        engines = []
        for k in range(2):
            events = ("--kv-events-port", str(free_port()), "--kv-events-replay-port", "0")
            engines.append(start_engine(*args, *events, "--seed", str(k)))
            stack.callback(engines[-1].stop)
        replicas = [
            a
            for e in engines
            for a in ("--replica", f"{e.url}=llama-3-8b,events={e.events},replay={e.replay}")
        ]
        gw_port = free_port()
        gw = gateway(gw_port, "--tokenizer", "smollm2", *replicas)
        stack.callback(gw.stop)
        gw_url = f"http://127.0.0.1:{gw_port}"
        url = stack.enter_context(
            prometheus(tmp_path, [f"127.0.0.1:{e.port}" for e in engines], [f"127.0.0.1:{gw_port}"])
        )
        load(gw_url, 6)
        time.sleep(4)  # a few scrapes after the load
        load(gw_url, 2)
        time.sleep(3)
        now = time.time()
        up = query(url, "up", now)
        assert len(up) == 3 and all(r["value"][1] == "1" for r in up)  # type: ignore[index]
        empty = []
        for title, expr in panel_queries():
            # A panel comparing against the 30 min before 2 min ago has, in a run of under
            # two minutes, data only when evaluated two minutes on (the lookback stays live).
            at = now + 130 if "offset" in expr else now
            if not query(url, expr, at):
                empty.append(f"{title}: {expr}")
        assert not empty, "\n".join(empty)
        router = [e for _, e in panel_queries() if ROUTER_PREFIX in e]
        print(f"panel queries: {len(panel_queries())}, router ones: {len(router)}, all with data")
        assert len(router) == 10
        # the gateway's index saw the engines' events and predicted hits the engines reported
        predicted = query(url, "kvtide_router_predicted_cached_tokens_total", now)
        reported = query(url, "kvtide_router_reported_cached_tokens_total", now)
        assert float(predicted[0]["value"][1]) > 0 and float(reported[0]["value"][1]) > 0  # type: ignore[index]
        rules = json.loads(_get(f"{url}/api/v1/rules"))
        assert rules["status"] == "success" and rules["data"]["groups"]

        doctor = subprocess.run(
            [sys.executable, "-m", "kvtide", "doctor", "--prometheus", url],
            env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert doctor.returncode == 0, doctor.stderr
        out = doctor.stdout
        print(out)
        assert "(2 instances)" in out and "hit ratio now:" in out and "could be:" in out
        assert "limit 1:" in out

        # The online detector's log line, beside its kvtide_alert_* metrics.
        logged = [line for e in engines for line in e.log if "kvtide engine: alert:" in line]
        assert logged, [line for e in engines for line in e.log][-5:]
        print(logged[0].strip())
        for e in engines:
            body = _get(f"{e.url}/metrics").decode()
            assert (
                "vllm:prefix_cache_hits_total" in body
                and "kvtide_cache_evicted_blocks_total" in body
            )
            check = subprocess.run(
                [str(PROMTOOL), "check", "metrics"], input=body, capture_output=True, text=True
            )
            problems = [p for p in (check.stdout + check.stderr).splitlines() if p.strip()]
            # kvtide_* families pass the linter outright; vLLM's own names carry a colon
            # (vllm:...), which the linter flags and nothing else.
            assert all(p.startswith("vllm:") and "should not contain ':'" in p for p in problems), (
                problems
            )
            kvtide_only = "\n".join(line for line in body.splitlines() if "kvtide_" in line) + "\n"
            check = subprocess.run(
                [str(PROMTOOL), "check", "metrics"],
                input=kvtide_only,
                capture_output=True,
                text=True,
            )
            assert check.returncode == 0, check.stdout + check.stderr
        body = _get(f"{gw_url}/metrics").decode()
        kvtide_only = "\n".join(line for line in body.splitlines() if "kvtide_" in line) + "\n"
        check = subprocess.run(
            [str(PROMTOOL), "check", "metrics"], input=kvtide_only, capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr
