"""`/metrics` of `kvtide engine`: vLLM's names and types, parsed by prometheus_client's own text
parser; the counters agree with the engine's own stats and with the `usage` clients saw."""

from __future__ import annotations

import asyncio
import random

import httpx2 as httpx
import openai
from engine_process import free_port, in_process_engine
from prometheus_client.parser import text_string_to_metric_families

from kvtide.engine_server.server import ServerConfig

MODEL = "emu"
TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:external_prefix_cache_hits": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:prompt_tokens_cached": "counter",
    "vllm:prompt_tokens_by_source": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def _scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics").text
    values: dict[str, float] = {}
    types: dict[str, str] = {}
    families = list(text_string_to_metric_families(text))
    # kvtide's own families follow the vLLM ones, with their own labels (kvtide.telemetry).
    assert any(f.name.startswith("kvtide_cache_") for f in families)
    assert any(f.name == "vllm:cache_config_info" for f in families)  # the router's capacity
    for family in families:
        if not family.name.startswith("vllm:"):
            continue
        if family.name == "vllm:cache_config_info":  # vLLM's CacheConfig as labels, no model
            (info,) = family.samples
            assert info.value == 1.0 and int(info.labels["num_gpu_blocks"]) > 0, info
            assert int(info.labels["block_size"]) > 0, info
            continue
        types[family.name] = family.type
        for sample in family.samples:
            assert sample.labels.get("model_name") == MODEL
            key = sample.name
            if "finished_reason" in sample.labels:
                key += ":" + sample.labels["finished_reason"]
            if "le" not in sample.labels:
                values[key] = values.get(key, 0.0) + float(sample.value)
    assert {k: types.get(k) for k in TYPES} == TYPES
    return values


def test_counters_agree_with_usage_and_engine_stats() -> None:
    config = ServerConfig(port=free_port(), speedup=300, served_model_name=MODEL)
    url = f"http://127.0.0.1:{config.port}"
    rng = random.Random(5)
    shared = [rng.randrange(100, 40_000) for _ in range(160)]
    prompts = [
        shared + [rng.randrange(100, 40_000) for _ in range(rng.randrange(1, 50))]
        for _ in range(30)
    ]

    async def drive() -> list[openai.types.CompletionUsage]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        sem = asyncio.Semaphore(6)

        async def one(ids: list[int], n: int) -> openai.types.CompletionUsage:
            async with sem:
                chunks = [
                    c
                    async for c in await client.completions.create(
                        model=MODEL,
                        prompt=ids,
                        max_tokens=n,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                ]
                assert chunks[-1].usage is not None
                return chunks[-1].usage

        out = await asyncio.gather(*(one(p, 1 + i % 9) for i, p in enumerate(prompts)))
        await client.close()
        return list(out)

    with in_process_engine(config) as server:
        before = _scrape(url)
        usages = asyncio.run(drive())
        after = _scrape(url)
        stats = server.built.scheduler.stats  # type: ignore[union-attr]
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    prompt = sum(u.prompt_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens or 0 for u in usages)  # type: ignore[union-attr]
    assert cached > 0
    assert delta["vllm:prompt_tokens_total"] == prompt == stats.prompt_tokens
    assert delta["vllm:generation_tokens_total"] == sum(u.completion_tokens for u in usages)
    assert delta["vllm:prefix_cache_queries_total"] == prompt
    assert delta["vllm:prefix_cache_hits_total"] == cached
    assert delta["vllm:prompt_tokens_cached_total"] == cached
    assert delta["vllm:prompt_tokens_by_source_total"] == prompt  # its sources, summed
    # no KV connector: nothing queried or loaded from another engine
    assert delta["vllm:external_prefix_cache_queries_total"] == 0
    assert delta["vllm:external_prefix_cache_hits_total"] == 0
    assert delta["vllm:request_success_total:length"] == len(prompts)
    assert delta["vllm:time_to_first_token_seconds_count"] == len(prompts)
    assert delta["vllm:e2e_request_latency_seconds_count"] == len(prompts)
    assert delta["vllm:inter_token_latency_seconds_count"] == sum(
        u.completion_tokens - 1 for u in usages
    )
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0.0  # nothing running holds blocks
