"""A prefill engine keeps a finished ``do_remote_decode`` request's KV until the decode engine
has read it, as vLLM 0.33's NixlConnector does (``delay_free_blocks``, the KV lease, the
decode's heartbeats): two `kvtide engine` processes with ``--kv-transfer-config``, talking over
their side channels (real ZMQ), observed through the prefill engine's ``/metrics``
(``vllm:kv_cache_usage_perc`` counts held blocks as used; vLLM's
``vllm:nixl_num_kv_expired_reqs``). A lease here is 20 model seconds, 2 s of wall time at
``--speedup 10``."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from engine_process import Engine, engine_client, post_json, start_engine
from prometheus_client.parser import text_string_to_metric_families

from kvtide.gateway.dialects import PREFILL_LEG_PARAMS as TOY_PREFILL  # as vLLM's toy proxy

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3-8b"
SPEEDUP = 10
LEASE_S = 20  # model seconds: 2 s of wall time
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"kv_lease_duration": LEASE_S}}  # fmt: skip


def _engine(*args: str) -> Engine:
    return start_engine("--model", MODEL, "--speedup", str(SPEEDUP), "--kv-transfer-config",
                        json.dumps(NIXL), *args)  # fmt: skip


@pytest.fixture
def pair() -> Iterator[tuple[Engine, Engine]]:
    prefill = _engine()
    try:
        decode = _engine("--max-num-seqs", "1")
    except BaseException:
        prefill.stop()
        raise
    try:
        yield prefill, decode
    finally:
        prefill.stop()
        decode.stop()


def _metric(engine: Engine, name: str) -> float:
    with urllib.request.urlopen(engine.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


def _usage(engine: Engine) -> float:
    return _metric(engine, "vllm:kv_cache_usage_perc")


def _wait_for(check: object, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _prefill(engine: Engine, base: int) -> tuple[list[int], dict[str, object]]:
    prompt = [base + i for i in range(600)]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": TOY_PREFILL}
    status, answer = post_json(engine.url + "/v1/completions", body)
    assert status == 200, answer
    return prompt, answer["kv_transfer_params"]


def _decode(engine: Engine, prompt: list[int], kv: dict[str, object]) -> None:
    status, answer = post_json(engine.url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": kv})  # fmt: skip
    assert status == 200, answer


def test_the_prefill_holds_the_kv_until_the_decode_has_read_it(
    pair: tuple[Engine, Engine],
) -> None:
    prefill, decode = pair
    assert _usage(prefill) == 0.0
    prompt, kv = _prefill(prefill, 1000)
    held = _usage(prefill)
    assert held > 0.0  # nothing runs there: the finished request's blocks are held
    time.sleep(0.3)  # under the lease: still held
    assert _usage(prefill) == held
    _decode(decode, prompt, kv)
    assert _wait_for(lambda: _usage(prefill) == 0.0, 5.0), "the read did not free the blocks"
    assert _metric(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0.0
    # the prompt's blocks stay cached there: the same prompt prefilled again hits them
    status, again = post_json(prefill.url + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 1})  # fmt: skip
    assert status == 200 and again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_unread_kv_is_let_go_when_its_lease_ends(pair: tuple[Engine, Engine]) -> None:
    prefill, _ = pair
    _prefill(prefill, 2000)  # no decode ever reads it
    assert _usage(prefill) > 0.0
    assert _wait_for(lambda: _usage(prefill) == 0.0, 10.0), "the lease never ended"
    assert _metric(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 1.0


@contextlib.contextmanager
def _busy(decode: Engine) -> Iterator[None]:
    """The decode engine (one request at a time) busy with a long stream until the block
    ends, when its client goes away."""
    started, stop = threading.Event(), threading.Event()

    def hog() -> None:
        with engine_client(decode) as client:
            for _ in client.completions.create(
                model=MODEL, prompt="hold the engine", max_tokens=30_000, stream=True
            ):
                started.set()
                if stop.is_set():
                    break  # the client goes away: the engine aborts it

    hogger = threading.Thread(target=hog, daemon=True)
    hogger.start()
    assert started.wait(30)
    try:
        yield
    finally:
        stop.set()
        hogger.join(30)


def test_the_decode_engines_heartbeats_hold_the_kv_while_its_request_waits(
    pair: tuple[Engine, Engine],
) -> None:
    """A decode leg queued behind a long request waits past the lease; its engine's
    heartbeats keep the prefill's blocks held until it reads them."""
    prefill, decode = pair
    with _busy(decode):
        prompt, kv = _prefill(prefill, 3000)
        held = _usage(prefill)
        reader = threading.Thread(target=_decode, args=(decode, prompt, kv), daemon=True)
        reader.start()
        time.sleep(5)  # 50 model seconds: two and a half leases, the decode still queued
        assert reader.is_alive()
        assert _usage(prefill) == held
        assert _metric(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0.0
    reader.join(30)
    assert not reader.is_alive()
    assert _wait_for(lambda: _usage(prefill) == 0.0, 5.0)
    assert _metric(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0.0


def test_a_decode_request_that_ends_before_its_read_frees_the_kv(
    pair: tuple[Engine, Engine],
) -> None:
    """vLLM's decode engine tells the prefill engine of a request aborted before its KV was
    read, so the blocks go then, not at the lease's end."""
    prefill, decode = pair
    with _busy(decode):
        prompt, kv = _prefill(prefill, 4000)
        assert _usage(prefill) > 0.0
        client = openai.OpenAI(base_url=decode.url + "/v1", api_key="x", max_retries=0,
                               timeout=0.3)  # fmt: skip
        with pytest.raises(openai.APITimeoutError), client:  # queued: it never starts
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=2,
                                      extra_body={"kv_transfer_params": kv})  # fmt: skip
        # gone from the queue, its read never made: the blocks go now, well inside the
        # lease (the heartbeats would have held them for as long as it waited)
        assert _wait_for(lambda: _usage(prefill) == 0.0, 0.5), "freed only by the lease"
        assert _metric(prefill, "vllm:nixl_num_kv_expired_reqs_total") == 0.0


def test_a_decode_naming_an_address_no_socket_takes_is_served_and_the_engine_goes_on() -> None:
    """The side channel's address comes from the request: one ZMQ cannot connect to (a
    host with a space, a port past 65535) or one nothing listens on is logged and dropped;
    the request is answered and the engine serves the next one (it once raised in the
    engine's task, which stopped every request)."""
    engine = _engine()
    try:
        prompt = [5000 + i for i in range(100)]
        for host, port in (("no such host!", 99_999), ("127.0.0.1", 1), ("localhost", 70_000)):
            kv = {"do_remote_prefill": True, "remote_block_ids": [[0, 1]],
                  "remote_engine_id": "e", "remote_request_id": "r", "remote_host": host,
                  "remote_port": port}  # fmt: skip
            _decode(engine, prompt, kv)
        after = {"model": MODEL, "prompt": "still here?", "max_tokens": 2}
        status, answer = post_json(engine.url + "/v1/completions", after)
        assert status == 200, answer
        assert engine.proc.poll() is None
    finally:
        engine.stop()
