"""Disaggregated prefill and decode between two `kvtide engine` processes run as vLLM runs with
``--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'``, driven by hand
as vLLM's toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) drives two
vLLMs: the prefill leg with ``do_remote_decode``, ``max_tokens: 1`` and ``stream: false``; its
answer's ``kv_transfer_params`` passed to the decode leg, streamed. The decode engine's TTFT
carries the NIC time of the KV it loads (a800: 100 Gb/s per GPU, so it shows), bounded from
both sides by the cost model's figures."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import zmq
from engine_process import SRC, Engine, engine_client, free_port, post_json, start_engine
from prometheus_client.parser import text_string_to_metric_families

from kvtide.costs.cost_model import CostModel, network_transfer_s
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.engine.timing import IterationTimer
from kvtide.gateway.dialects import PREFILL_LEG_PARAMS as TOY_PREFILL  # as vLLM's toy proxy
from kvtide.state.kv_wire import EngineBlockStored, decode_batch

pytestmark = pytest.mark.timeout(120)

MODEL = "llama-3-8b"
GPU = "a800"
SPEEDUP = 0.25  # the model plays out 4x slower than the GPU would: its NIC time shows
BT = 16
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
PROMPT_TOKENS = 2005  # 125 full blocks and 5 tokens


SIDE_HOST = "127.0.0.7"  # a loopback address of its own: the side channel binds it
SIDE_PORT = free_port()


def _prompt(base: int) -> list[int]:
    return [base + i % 5000 for i in range(PROMPT_TOKENS)]


def _engine(*args: str) -> tuple[str, ...]:
    return ("--model", MODEL, "--gpu", GPU, "--speedup", str(SPEEDUP), *args)


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Engine, Engine]]:
    """A prefill engine with a fixed engine id and vLLM's side-channel variables set, and a
    decode engine with KV events."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", SIDE_HOST)
        env.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(SIDE_PORT))
        prefill = start_engine(
            *_engine("--kv-transfer-config", json.dumps({**NIXL, "engine_id": "prefill-0"}))
        )
    decode = start_engine(
        *_engine("--kv-transfer-config", json.dumps(NIXL), "--kv-events-port", "0")
    )
    try:
        yield prefill, decode
    finally:
        prefill.stop()
        decode.stop()


def _prefill(client: openai.OpenAI, prompt: list[int]) -> tuple[Any, dict[str, Any]]:
    answer = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=1,
        stream=False,
        extra_body={"kv_transfer_params": TOY_PREFILL},
    )
    assert answer.model_extra is not None
    kv = answer.model_extra["kv_transfer_params"]
    assert isinstance(kv, dict)
    return answer, kv


def _streamed(
    client: openai.OpenAI, prompt: list[int], kv: dict[str, Any] | None
) -> tuple[float, list[Any]]:
    """The time to the first token and the chunks of a streamed completion."""
    extra = {} if kv is None else {"kv_transfer_params": kv}
    start = time.monotonic()
    ttft = None
    chunks = []
    for chunk in client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    ):
        if ttft is None and chunk.choices and chunk.choices[0].text:
            ttft = time.monotonic() - start
        chunks.append(chunk)
    assert ttft is not None
    return ttft, chunks


def _counters(engine: Engine) -> dict[str, float]:
    """The vllm:* counters, a ``source`` label appended to the name."""
    with urllib.request.urlopen(engine.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:") and sample.name.endswith("_total"):
                source = sample.labels.get("source")
                out[sample.name + ("" if source is None else f":{source}")] = sample.value
    return out


def test_the_toy_proxy_flow_loads_the_prompt_kv_and_pays_its_nic_time(
    pair: tuple[Engine, Engine],
) -> None:
    prefill, decode = pair
    cost = CostModel(resolve_model(MODEL), gpu_preset(GPU))
    timer = IterationTimer.from_cost_model(cost)
    transfer_s = network_transfer_s(cost, PROMPT_TOKENS) / SPEEDUP
    last_token_s = timer.iteration_s([(1, PROMPT_TOKENS - 1)], 0, 0) / SPEEDUP
    full_prefill_s = timer.iteration_s([(PROMPT_TOKENS, 0)], 0, 0) / SPEEDUP
    prompt = _prompt(1000)
    with engine_client(prefill) as p, engine_client(decode) as d:
        first, kv = _prefill(p, prompt)
        assert first.choices[0].finish_reason == "length"
        assert kv == {  # vLLM 0.33's request_finished, pull mode
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(126))],  # every block of the computed prompt
            "remote_engine_id": "prefill-0",
            "remote_request_id": first.id,
            "remote_host": SIDE_HOST,
            "remote_port": SIDE_PORT,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": PROMPT_TOKENS,
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 1,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": 0,  # a cold prefill engine
        }
        before = _counters(decode)
        remote_ttft, chunks = _streamed(d, prompt, kv)
        after = _counters(decode)
        hit_ttft, hit_chunks = _streamed(d, prompt, None)  # the loaded blocks are cached now

    assert "".join(c.choices[0].text for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # a decode engine answers no kv_transfer_params (vLLM: only a prefill's request_finished)
    assert all((c.model_extra or {}).get("kv_transfer_params") is None for c in chunks)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    # vLLM reports the prefill engine's hit for a remote-prefilled request
    assert usage.prompt_tokens_details.cached_tokens == kv["remote_prefill_cached_tokens"]
    hit_usage = hit_chunks[-1].usage
    assert hit_usage is not None and hit_usage.prompt_tokens_details is not None
    assert hit_usage.prompt_tokens_details.cached_tokens == PROMPT_TOKENS // BT * BT

    # the decode waits for the whole prompt's KV over its NIC, then computes one token
    assert remote_ttft >= 0.95 * (transfer_s + last_token_s)
    assert remote_ttft >= hit_ttft + 0.5 * transfer_s  # measurably longer than a local hit
    assert remote_ttft <= 0.5 * full_prefill_s  # much shorter than computing the prompt

    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert delta["vllm:prefix_cache_queries_total"] == PROMPT_TOKENS
    assert delta["vllm:prefix_cache_hits_total"] == 0
    assert delta["vllm:external_prefix_cache_queries_total"] == PROMPT_TOKENS
    assert delta["vllm:external_prefix_cache_hits_total"] == PROMPT_TOKENS
    assert delta["vllm:prompt_tokens_by_source_total:external_kv_transfer"] == PROMPT_TOKENS
    assert delta["vllm:prompt_tokens_by_source_total:local_compute"] == 0
    assert delta["vllm:prompt_tokens_cached_total"] == PROMPT_TOKENS


def test_without_the_prefills_hit_the_decode_reports_the_whole_prompt_cached(
    pair: tuple[Engine, Engine],
) -> None:
    """vLLM counts the loaded tokens as cached: local hit plus what the connector brought."""
    prefill, decode = pair
    prompt = _prompt(2000)
    with engine_client(prefill) as p, engine_client(decode) as d:
        _, kv = _prefill(p, prompt)
        kv.pop("remote_prefill_cached_tokens")
        _, chunks = _streamed(d, prompt, kv)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == PROMPT_TOKENS


def test_a_warm_prefill_names_its_hit_and_chat_carries_the_params_both_ways(
    pair: tuple[Engine, Engine],
) -> None:
    prefill, decode = pair
    messages = [{"role": "user", "content": "Name three harbours. " * 40}]
    with engine_client(prefill) as p, engine_client(decode) as d:
        answers = [
            p.chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=1,
                extra_body={"kv_transfer_params": TOY_PREFILL},
            )
            for _ in range(2)
        ]
        params = [(a.model_extra or {})["kv_transfer_params"] for a in answers]
        assert answers[1].usage is not None and answers[1].usage.prompt_tokens_details
        cached = answers[1].usage.prompt_tokens_details.cached_tokens
        assert cached and cached > 0
        assert params[0]["remote_prefill_cached_tokens"] == 0
        assert params[1]["remote_prefill_cached_tokens"] == cached
        out = d.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=3,
            extra_body={"kv_transfer_params": params[1]},
        )
    assert (out.model_extra or {}).get("kv_transfer_params") is None
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    assert out.usage.prompt_tokens_details.cached_tokens == cached
    assert out.choices[0].message.content


def test_the_loaded_blocks_are_published_as_stored_by_the_decode_engine(
    pair: tuple[Engine, Engine],
) -> None:
    prefill, decode = pair
    assert decode.events is not None
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(decode.events)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        prompt = _prompt(3000)
        with engine_client(prefill) as p, engine_client(decode) as d:
            _, kv = _prefill(p, prompt)
            _streamed(d, prompt, kv)
        stored: list[int] = []
        deadline = time.monotonic() + 10
        while len(stored) < PROMPT_TOKENS // BT * BT and time.monotonic() < deadline:
            if sub.poll(200):
                _topic, _seq, payload = sub.recv_multipart()
                for event in decode_batch(payload).events:
                    if isinstance(event, EngineBlockStored):
                        stored.extend(event.token_ids)
    finally:
        sub.close(linger=0)
    assert stored == prompt[: PROMPT_TOKENS // BT * BT]  # every full block, in order


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "params",
    [
        3,
        [],
        "do_remote_decode",
        {"do_remote_prefill": "yes"},
        {"remote_block_ids": "0,1"},
        {"remote_block_ids": [[0, 1], ["2"]]},
        {"remote_port": "5600"},
        {"remote_prefill_cached_tokens": -1},
    ],
)
def test_malformed_kv_transfer_params_get_a_400_naming_the_field(
    pair: tuple[Engine, Engine], route: str, params: object
) -> None:
    _, decode = pair
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 1, "kv_transfer_params": params}
    if route == "/v1/completions":
        body["prompt"] = "hello"
    else:
        body["messages"] = [{"role": "user", "content": "hello"}]
    status, answer = post_json(decode.url + route, body)
    assert status == 400, answer
    assert answer["error"]["param"] == "kv_transfer_params"
    assert "kv_transfer_params" in answer["error"]["message"]


def test_unknown_keys_pass_and_a_chats_forwarded_prompt_ids_are_checked(
    pair: tuple[Engine, Engine],
) -> None:
    _, decode = pair
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    status, _ = post_json(
        decode.url + "/v1/chat/completions",
        {**chat, "kv_transfer_params": {"transfer_mode": "pull", "future_key": [1, {"x": 2}]}},
    )
    assert status == 200
    status, answer = post_json(
        decode.url + "/v1/chat/completions",
        {**chat, "kv_transfer_params": {"prompt_token_ids": []}},
    )
    assert status == 400 and answer["error"]["param"] == "kv_transfer_params.prompt_token_ids"
    # the decode leg of a chat takes its prefill's rendering instead of its messages, as vLLM
    status, answer = post_json(
        decode.url + "/v1/chat/completions",
        {**chat, "kv_transfer_params": {"prompt_token_ids": [5, 6, 7, 8, 9]}},
    )
    assert status == 200 and answer["usage"]["prompt_tokens"] == 5


def test_a_prefill_answers_only_for_what_the_engine_finished(
    pair: tuple[Engine, Engine],
) -> None:
    """A stop string that ends a request before its output limit aborts it in the engine
    (vLLM matches stop strings after the engine core): no blocks are offered. On the token
    the engine finishes it anyway, it does offer them."""
    prefill, _ = pair
    body = {"model": MODEL, "prompt": "tides", "kv_transfer_params": TOY_PREFILL}
    status, cut = post_json(
        prefill.url + "/v1/completions", {**body, "max_tokens": 5, "stop": "the"}
    )
    assert status == 200 and cut["choices"][0]["finish_reason"] == "stop"
    assert cut["kv_transfer_params"] is None
    status, last = post_json(
        prefill.url + "/v1/completions", {**body, "max_tokens": 1, "stop": "the"}
    )
    assert status == 200 and last["choices"][0]["finish_reason"] == "stop"
    assert last["kv_transfer_params"]["do_remote_prefill"] is True


def test_messages_and_responses_take_the_params_as_vllm_does(
    pair: tuple[Engine, Engine],
) -> None:
    prefill, decode = pair
    message = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    status, answer = post_json(
        prefill.url + "/v1/messages", {**message, "kv_transfer_params": TOY_PREFILL}
    )
    assert status == 200 and answer["kv_transfer_params"]["remote_engine_id"] == "prefill-0"
    status, answer = post_json(
        decode.url + "/v1/messages", {**message, "kv_transfer_params": answer["kv_transfer_params"]}
    )
    assert status == 200 and "kv_transfer_params" not in answer  # vLLM leaves out nulls
    response = {"model": MODEL, "max_output_tokens": 16, "input": "hi"}
    status, answer = post_json(
        prefill.url + "/v1/responses", {**response, "kv_transfer_params": TOY_PREFILL}
    )
    assert status == 200 and answer["kv_transfer_params"]["do_remote_prefill"] is True
    status, answer = post_json(
        decode.url + "/v1/responses",
        {**response, "kv_transfer_params": answer["kv_transfer_params"]},
    )
    assert status == 200 and answer["kv_transfer_params"] is None


def test_an_engine_without_a_connector_reads_the_params_and_ignores_them() -> None:
    engine = start_engine(*_engine())
    try:
        prompt = _prompt(4000)
        with engine_client(engine) as client:
            answer = client.completions.create(
                model=MODEL,
                prompt=prompt,
                max_tokens=1,
                extra_body={"kv_transfer_params": TOY_PREFILL},
            )
            assert (answer.model_extra or {})["kv_transfer_params"] is None
            remote = {
                "do_remote_prefill": True,
                "remote_block_ids": [list(range(126))],
                **{k: "x" for k in ("remote_engine_id", "remote_request_id", "remote_host")},
                "remote_port": 5600,
            }
            _, chunks = _streamed(client, _prompt(4500), remote)
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 0  # nothing loaded
        status, _ = post_json(
            engine.url + "/v1/completions", {"prompt": "x", "kv_transfer_params": 3}
        )
        assert status == 400  # still checked
    finally:
        engine.stop()


def test_a_bad_kv_transfer_config_is_one_line_and_exit_2() -> None:
    configs = [
        '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}',  # not emulated
        '{"kv_connector": "NixlConnector"}',  # vLLM wants a role with a connector
        "[1]",
    ]
    for config in configs:
        argv = ["engine", "--port", str(free_port()), "--kv-transfer-config", config]
        proc = subprocess.run(
            [sys.executable, "-m", "kvtide", *argv],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert "--kv-transfer-config" in line
