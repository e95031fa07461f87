"""vLLM's tokenizer and pooling endpoints through `kvtide serve`: the official openai client's
embeddings, /rerank, /tokenize and /detokenize, with the tenant's key, salt and limits, the
least loaded replica, failover before the first byte and a client's hang-up.

The pooling answers come from the vLLM-shaped test backend (``backend.py``): a pooling model
needs vLLM on a GPU, which this machine has not; /tokenize and /detokenize also from a real
`kvtide engine`."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path
from typing import Any

import openai
import pytest
from peer_process import peer_python, run_peer
from tests.integration.gateway.backend import embedding
from tests.integration.gateway.conftest import KEYS, SECRET, write_keys
from tests.integration.gateway.procs import (
    Proc,
    access_log_lines,
    backend,
    backend_stats,
    emulated_engines,
    free_port,
    gateway,
    openai_client,
    wait_aborted,
)

pytestmark = pytest.mark.timeout(90)

PEER_SCRIPT = Path(__file__).parents[1] / "peer_pooling_requests.py"


def _post(url: str, body: Any, key: str | None = None) -> tuple[int, Message, Any]:
    """POST ``body`` as JSON: the status, the headers (any case) and the decoded answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, resp.headers, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, err.headers, json.load(err)


def _body_sent(backends: list[tuple[Proc, int]], request_id: str) -> dict[str, Any]:
    """The body a test backend got with the gateway's ``X-Request-Id``."""
    found = []
    for _, port in backends:
        stats = backend_stats(port)
        for body, rid in zip(stats["bodies"], stats["request_ids"], strict=True):
            if rid == request_id:
                found.append(body)
    (body,) = found
    return body


def test_embeddings_through_the_openai_client_carry_the_tenants_salt(
    keyed_gateway: tuple[str, list[tuple[Proc, int]]],
) -> None:
    url, backends = keyed_gateway
    client = openai_client(base_url=f"{url}/v1", api_key=KEYS["alpha"], max_retries=0)
    texts = ["the first document", "a second, longer document of several words"]
    # the client's default: base64, decoded by it; a cache_salt of the client's own
    got = client.embeddings.create(model="m", input=texts, extra_body={"cache_salt": "mine"})
    assert [d.embedding for d in got.data] == [embedding(t) for t in texts]
    assert got.usage.prompt_tokens == sum(len(t) // 4 + 1 for t in texts)
    floats = client.embeddings.create(model="m", input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == embedding(texts[0])
    beta = openai_client(base_url=f"{url}/v1", api_key=KEYS["beta"], max_retries=0)
    beta.embeddings.create(model="m", input=texts[0])
    salts = [s for _, port in backends for s in backend_stats(port)["salts"]]
    assert len(salts) == 3 and "mine" not in salts and None not in salts
    # one salt per tenant, the same for each of its requests wherever they went
    assert len(set(salts)) == 2
    with pytest.raises(openai.AuthenticationError):
        openai_client(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).embeddings.create(
            model="m", input="x"
        )
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="nope", input="x")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_vllms_own_request_classes_read_what_the_gateway_forwards(
    keyed_gateway: tuple[str, list[tuple[Proc, int]]],
) -> None:
    """Differential: each body the gateway sent the engines, parsed by vLLM 0.33's request
    class for its path (the peer-libraries venv): valid, with the tenant's salt where vLLM
    reads one (pooling) and none where it does not (the tokenizer)."""
    peer_python()  # skipped without it, before any request
    url, backends = keyed_gateway
    asked = [
        ("/v1/embeddings", {"model": "m", "input": "text", "cache_salt": "mine"}),
        ("/v1/embeddings", {"input": ["a", "b"], "encoding_format": "base64"}),
        ("/rerank", {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1}),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "cache_salt": "mine"}),
        ("/tokenize", {"model": "m", "prompt": "hello", "cache_salt": "mine"}),
    ]
    sent = []
    for path, body in asked:
        status, headers, answer = _post(f"{url}{path}", body, KEYS["alpha"])
        assert status == 200, answer
        sent.append([path, _body_sent(backends, headers["x-request-id"])])
    parsed = run_peer(PEER_SCRIPT, stdin=json.dumps(sent), timeout_s=120)
    assert [error for _, error in parsed] == [None] * len(asked)
    salts = [salt for salt, _ in parsed]
    tenant = hmac.new(SECRET.encode(), b"alpha", hashlib.sha256).hexdigest()[:32]
    assert salts == [tenant] * 4 + [None], salts
    # the rest of each body as the client sent it
    for (_, body), (_, got) in zip(asked, sent, strict=True):
        assert {k: v for k, v in got.items() if k != "cache_salt"} == {
            k: v for k, v in body.items() if k != "cache_salt"
        }


def test_rerank_and_tokenize_pass_through_and_a_model_may_go_unnamed(
    keyed_gateway: tuple[str, list[tuple[Proc, int]]],
) -> None:
    url, _ = keyed_gateway
    key = KEYS["alpha"]
    status, headers, body = _post(
        f"{url}/v1/rerank", {"query": "q", "documents": ["a", "bb"]}, key
    )  # no model: the one the gateway serves
    assert status == 200, body
    assert [r["relevance_score"] for r in body["results"]] == [
        embedding("a")[0],
        embedding("bb")[0],
    ]
    assert headers["x-request-id"].startswith("gw-")
    status, _, body = _post(f"{url}/tokenize", {"model": "m", "prompt": "héllo"}, key)
    assert status == 200 and body["tokens"] == list("héllo".encode())
    status, _, body = _post(f"{url}/tokenize", {"prompt": "x"}, None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", body
    status, _, body = _post(f"{url}/tokenize", b"{not json", key)
    assert status == 400 and body["error"]["type"] == "invalid_request_error", body
    status, _, body = _post(f"{url}/tokenize", {"model": 5, "prompt": "x"}, key)
    assert status == 400 and body["error"]["param"] == "model", body


def test_tokenize_and_detokenize_answer_as_the_engine_does() -> None:
    engines = emulated_engines(2)
    port = free_port()
    gw = None
    try:
        replicas = [a for e in engines for a in ("--replica", f"{e.url}=emu")]
        gw = gateway(port, *replicas)
        url = f"http://127.0.0.1:{port}"
        prompt = {"model": "emu", "prompt": "Prefix caching keeps TTFT low."}
        direct = _post(f"{engines[0].url}/tokenize", prompt)[2]
        status, _, via = _post(f"{url}/tokenize", prompt)
        assert status == 200 and via == direct and via["count"] > 0
        status, _, text = _post(f"{url}/detokenize", {"model": "emu", "tokens": via["tokens"]})
        assert status == 200 and text["prompt"] == prompt["prompt"]
        chat = {"model": "emu", "messages": [{"role": "user", "content": "hi"}]}
        assert _post(f"{url}/tokenize", chat)[2] == _post(f"{engines[1].url}/tokenize", chat)[2]
        # the engine's own refusal comes back as it gave it
        status, _, body = _post(f"{url}/detokenize", {"model": "emu", "tokens": [-1]})
        assert status == 400 and "error" in body, body
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()


def test_pooling_requests_go_to_the_least_loaded_replica_and_fail_over() -> None:
    slow = [free_port(), free_port()]
    failing = free_port()
    procs = [backend(p, "m", "--prefill-delay", "0.6") for p in slow]
    procs.append(backend(failing, "m", "--mode", "fail500"))
    port = free_port()
    gw = None
    try:
        replicas = [a for p in [*slow, failing] for a in ("--replica", f"http://127.0.0.1:{p}")]
        gw = gateway(port, *replicas)
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        answers: list[int] = []

        def one(i: int) -> None:
            answers.append(_post(url, {"model": "m", "input": f"text {i}"})[0])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert answers == [200] * 6
        # six at once over two working replicas: three each at most, never all on one (a
        # request the failing one got was retried on another)
        running = [backend_stats(p)["max_running"] for p in slow]
        assert sum(backend_stats(p)["requests"] for p in slow) == 6
        assert max(running) <= 4 and min(running) >= 2, running
        assert backend_stats(failing)["requests"] >= 1
    finally:
        if gw is not None:
            gw.stop()
        for p in procs:
            p.stop()


def test_when_every_replica_fails_the_client_gets_a_502_and_the_access_log_a_line(
    tmp_path: Path,
) -> None:
    ports = [free_port(), free_port()]
    procs = [backend(p, "m", "--mode", "fail500") for p in ports]
    port = free_port()
    log = tmp_path / "access.jsonl"
    gw = None
    try:
        replicas = [a for p in ports for a in ("--replica", f"http://127.0.0.1:{p}")]
        gw = gateway(port, *replicas, "--access-log", str(log))
        status, _, body = _post(f"http://127.0.0.1:{port}/rerank", {"query": "q", "documents": []})
        assert status == 502 and body["error"]["code"] == "upstream_error", body
        (line,) = access_log_lines(log, 1)
        assert line["endpoint"] == "rerank" and line["status"] == 502
        assert line["attempts"] == 2 and line["failures"] == ["http_500", "http_500"]
    finally:
        if gw is not None:
            gw.stop()
        for p in procs:
            p.stop()


def test_a_client_that_hangs_up_aborts_the_engines_pooling_request() -> None:
    stalled = free_port()
    proc = backend(stalled, "m", "--mode", "stall")
    port = free_port()
    gw = None
    try:
        gw = gateway(port, "--replica", f"http://127.0.0.1:{stalled}")
        body = json.dumps({"model": "m", "input": "x"}).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            deadline = time.monotonic() + 5
            while backend_stats(stalled)["running"] == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert backend_stats(stalled)["running"] == 1
        assert wait_aborted(stalled)["aborted"] == 1
    finally:
        if gw is not None:
            gw.stop()
        proc.stop()


def test_a_pooling_request_is_charged_its_prompt_tokens(tmp_path: Path) -> None:
    ports = [free_port()]
    procs = [backend(p, "m") for p in ports]
    keys = write_keys(tmp_path / "keys.yaml", {"alpha": KEYS["alpha"]}, tokens_per_minute=100)
    port = free_port()
    gw = None
    try:
        gw = gateway(port, "--replica", f"http://127.0.0.1:{ports[0]}", "--api-keys", str(keys))
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        status, _, body = _post(url, {"input": "x" * 400}, KEYS["alpha"])  # 101 tokens
        assert status == 200 and body["usage"]["prompt_tokens"] == 101
        status, headers, body = _post(url, {"input": "x"}, KEYS["alpha"])
        assert status == 429 and body["error"]["code"] == "rate_limit_exceeded", body
        assert int(headers["Retry-After"]) >= 1
    finally:
        if gw is not None:
            gw.stop()
        for p in procs:
            p.stop()
