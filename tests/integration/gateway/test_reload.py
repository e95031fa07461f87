"""SIGHUP with a changed ``policy:`` in the config file: a real `kvtide serve` routes the next
requests with the new policy (its decisions' reasons change), /ready names it, flags still win
over the file, and a bad spec keeps the running policy."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from tests.integration.gateway.procs import backend, free_port, gateway, openai_client

pytestmark = pytest.mark.timeout(90)


def _ready(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
        return json.load(resp)


def _reasons(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("kvtide_gateway_route_decisions_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = out.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _wait_policy(url: str, policy: str) -> None:
    deadline = time.monotonic() + 10
    while _ready(url)["policy"] != policy:
        assert time.monotonic() < deadline, _ready(url)["policy"]
        time.sleep(0.05)


def test_sighup_swaps_the_policy_and_keeps_serving(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    backends = [backend(p, "m", "--token-delay", "0.001") for p in ports]
    config = tmp_path / "gw.yaml"
    replicas = "".join(f"  - url: http://127.0.0.1:{p}\n" for p in ports)
    config.write_text(f"policy: round_robin\nreplicas:\n{replicas}")
    port = free_port()
    gw = gateway(port, "--config", str(config))
    url = f"http://127.0.0.1:{port}"
    client = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=10)

    def send(n: int) -> None:
        for i in range(n):
            client.completions.create(model="m", prompt=f"question {i} " * 20, max_tokens=2)

    try:
        send(4)
        assert _reasons(url) == {"round_robin": 4.0}
        stream = client.completions.create(model="m", prompt="long " * 20, stream=True)
        next(iter(stream))  # in flight across the swap: it finishes with round_robin
        config.write_text(f"policy: least_load\nreplicas:\n{replicas}")
        gw.signal(signal.SIGHUP)
        _wait_policy(url, "least_load")
        for _ in stream:
            pass
        send(4)
        assert _reasons(url) == {"round_robin": 5.0, "load": 4.0}

        config.write_text(f"policy: no_such_router\nreplicas:\n{replicas}")
        gw.signal(signal.SIGHUP)
        time.sleep(0.5)
        send(2)
        assert _ready(url)["policy"] == "least_load"
        assert _reasons(url) == {"round_robin": 5.0, "load": 6.0}
    finally:
        gw.stop()
        for b in backends:
            b.stop()


def test_a_policy_flag_wins_over_the_file_on_reload(tmp_path: Path) -> None:
    bport = free_port()
    b = backend(bport, "m")
    config = tmp_path / "gw.yaml"
    config.write_text(f"policy: least_load\nreplicas:\n  - url: http://127.0.0.1:{bport}\n")
    port = free_port()
    gw = gateway(port, "--config", str(config), "--policy", "round_robin")
    url = f"http://127.0.0.1:{port}"
    try:
        assert _ready(url)["policy"] == "round_robin"
        config.write_text(f"policy: random\nreplicas:\n  - url: http://127.0.0.1:{bport}\n")
        gw.signal(signal.SIGHUP)
        time.sleep(0.5)
        assert _ready(url)["policy"] == "round_robin"
        assert [r["up"] for r in _ready(url)["replicas"]] == [True]
    finally:
        gw.stop()
        b.stop()
