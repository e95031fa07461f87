"""Engines behind a key (vLLM's ``--api-key``): the emulated engine guards ``/v1`` as vLLM's
AuthenticationMiddleware does, and the gateway carries its ``engine_key`` to them on every
call. Without it the engine's 401 is an engine failure (a 502), never handed to a client whose
own key the gateway has accepted."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
from engine_process import running_engine
from peer_process import run_peer
from tests.integration.gateway.procs import free_port, gateway, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

KEY = "engine-secret"
PEER_SCRIPT = Path(__file__).parents[1] / "peer_auth_middleware.py"


def _get(url: str, authorization: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": authorization} if authorization else {}
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_emulated_engine_guards_v1_as_vllm_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)  # as vLLM reads it, where no --api-key is given
    with running_engine("--served-model-name", "emu", "--speedup", "50") as engine:
        models = f"{engine.url}/v1/models"
        for authorization in (None, "Bearer wrong", f"Basic {KEY}", "Bearer"):
            assert _get(models, authorization) == (401, {"error": "Unauthorized"})
        assert _get(models, f"Bearer {KEY}")[0] == 200
        assert _get(models, f"bearer {KEY}")[0] == 200  # the scheme in any case, as vLLM
        with urllib.request.urlopen(f"{engine.url}/health", timeout=5) as resp:
            assert resp.status == 200  # outside /v1: open, as vLLM's
        good = openai_client(base_url=f"{engine.url}/v1", api_key=KEY, max_retries=0)
        assert good.completions.create(model="emu", prompt="hi", max_tokens=2).choices
        bad = openai_client(base_url=f"{engine.url}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model="emu", prompt="hi", max_tokens=2)


def _wait_ready(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _get(f"{url}/ready")[0] != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.1)


def test_the_gateway_carries_its_engine_key_and_a_missing_one_is_an_engine_failure() -> None:
    with running_engine("--served-model-name", "emu", "--speedup", "50", "--api-key", KEY) as e:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gw = gateway(port, "--replica", f"{e.url}=emu", env={"KVTIDE_ENGINE_KEY": KEY})
        try:
            assert KEY.encode() not in Path(f"/proc/{gw.pid}/cmdline").read_bytes()
            _wait_ready(url)  # its /v1/models, read with the key
            client = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0)
            assert [m.id for m in client.models.list()] == ["emu"]
            chat = client.chat.completions.create(
                model="emu", messages=[{"role": "user", "content": "hi"}], max_tokens=3
            )
            assert chat.choices[0].message.content
            stream = client.completions.create(model="emu", prompt="p", max_tokens=3, stream=True)
            assert "".join(c.choices[0].text for c in stream if c.choices)
        finally:
            gw.stop()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gw = gateway(port, "--replica", f"{e.url}=emu")  # no key for the engine
        try:
            time.sleep(2.5)  # a health check's discovery has been refused by now
            assert _get(f"{url}/ready")[0] == 503  # the engine never answered the gateway
            client = openai_client(base_url=f"{url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.InternalServerError) as failed:
                client.completions.create(model="emu", prompt="p", max_tokens=3)
            assert failed.value.status_code == 502
            assert "Unauthorized" not in str(failed.value.body)
        finally:
            gw.stop()


def test_the_engine_refuses_what_vllms_own_middleware_refuses() -> None:
    """Differential: every (path, Authorization) case through vLLM 0.33's
    ``AuthenticationMiddleware`` (the peer-libraries venv) and through ``kvtide engine
    --api-key``: the same ones refused, with the same status and body."""
    paths = ["/v1/models", "/v1/nothing", "/v1", "/v1x", "/v2/models", "/inference/x",
             "/cohere/x", "/health", "/metrics", "/nothing", "/V1/models"]  # fmt: skip
    headers = [None, f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", "Bearer wrong",
               f"Basic {KEY}", KEY, f"Bearer {KEY}x", "Bearer", f"Bearer  {KEY}"]  # fmt: skip
    cases = [["GET", path, h] for path in paths for h in headers]
    vllm = run_peer(PEER_SCRIPT, stdin=json.dumps({"key": KEY, "cases": cases}), timeout_s=120)
    with running_engine("--served-model-name", "emu", "--speedup", "50", "--api-key", KEY) as e:
        for (_, path, authorization), (status, body) in zip(cases, vllm, strict=True):
            refused_by_vllm = (status, json.loads(body) if status == 401 else None)
            got = _get(f"{e.url}{path}", authorization) if path != "/metrics" else None
            if got is None:  # Prometheus text, not JSON: its status alone
                req = urllib.request.Request(
                    f"{e.url}{path}",
                    headers={"Authorization": authorization} if authorization else {},
                )
                with urllib.request.urlopen(req, timeout=10) as resp:
                    got = (resp.status, None)
            ours = (401, got[1]) if got[0] == 401 else (200, None)
            assert ours == refused_by_vllm, (path, authorization, got)
