"""The run: requests sent open-loop at their arrival times (the trace's, scaled, or Poisson at a
rate), at most ``concurrency`` in flight when capped, every one streamed and timed, bounded by a
request count, a duration and a per-request timeout."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from kvtide.clock import WallClock
from kvtide.errors import ConfigError
from kvtide.loadgen.client import Outcome, stream
from kvtide.loadgen.metrics import Slo, summarize, tpot_of
from kvtide.loadgen.prompts import Prompt, PromptBuilder
from kvtide.text import Tokenizer
from kvtide.types import Request
from kvtide.workloads import Workload
from kvtide.workloads.registry import BUILTIN_PREFIX

APIS = ("chat", "completions", "responses", "messages")
"""OpenAI's chat and text completions and Responses API (``/v1/responses``); Anthropic's
Messages API (``/v1/messages``)."""
PROMPT_FORMATS = ("text", "tokens")


@dataclass(frozen=True, slots=True)
class LoadConfig:
    url: str
    """Base URL of an OpenAI-compatible server (``/v1`` optional)."""
    more_urls: tuple[str, ...] = ()
    """Further base URLs (gateway replicas): request ``i`` of the plan goes to URL ``i mod n``
    of ``(url, *more_urls)``, a client-side round robin."""
    api: str = "chat"
    prompt_format: str = "text"
    """``text`` (words, chat turns for sessions) or ``tokens``: /v1/completions with the
    trace's token ids as ``prompt`` and ``ignore_eos``, so the server gets the trace's
    requests as they are (``PromptBuilder.token_ids``)."""
    model: str | None = None
    api_key: str | None = None
    rate: float | None = None
    """Poisson arrivals at this many requests/s instead of the trace's times."""
    concurrency: int | None = None
    """At most this many requests in flight; alone (no rate) it sends as fast as that allows."""
    duration_s: float | None = None
    seed: int = 0
    slo: Slo = field(default_factory=Slo)
    timeout_s: float = 300.0
    ignore_eos: bool = False
    temperature: float | None = 0.0

    def __post_init__(self) -> None:
        if self.prompt_format not in PROMPT_FORMATS:
            raise ConfigError(
                f"prompt format must be one of {', '.join(PROMPT_FORMATS)}, "
                f"got {self.prompt_format!r}"
            )
        if self.api not in APIS:
            raise ConfigError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.prompt_format == "tokens" and self.api != "completions":
            raise ConfigError(
                f"a token-id prompt needs the completions API (a {self.api} request has no "
                "token-id prompt)"
            )

    @property
    def is_exact(self) -> bool:
        """Token-id prompts replay the trace exactly: its output lengths too (``ignore_eos``)."""
        return self.prompt_format == "tokens"

    @property
    def base_url(self) -> str:
        return _base(self.url)

    @property
    def endpoint(self) -> str:
        return self.endpoints[0]

    @property
    def endpoints(self) -> tuple[str, ...]:
        path = _PATHS[self.api]
        return tuple(f"{_base(url)}/v1/{path}" for url in (self.url, *self.more_urls))


_PATHS = {
    "chat": "chat/completions",
    "completions": "completions",
    "responses": "responses",
    "messages": "messages",
}


def _base(url: str) -> str:
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def schedule(requests: Iterable[Request], config: LoadConfig) -> list[tuple[float, Request]]:
    """Send times in seconds from the start, and the requests, within ``duration_s``."""
    out: list[tuple[float, Request]] = []
    rng = random.Random(f"kvtide-loadgen-arrivals:{config.seed}")
    first: float | None = None
    at = 0.0
    for request in requests:
        if config.rate is not None:
            at = at + rng.expovariate(config.rate) if out else 0.0
        elif config.concurrency is not None:
            at = 0.0
        else:
            first = request.arrival_s if first is None else first
            at = request.arrival_s - first
        if config.duration_s is not None and at > config.duration_s:
            break
        out.append((at, request))
    return out


def payload(config: LoadConfig, model: str, prompt: Prompt, request: Request) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max(1, request.output_tokens),
        "stream": True,
    }
    if config.api == "messages":  # Anthropic's: the system prompt apart, usage always sent
        system = "".join(text for role, text in prompt.messages if role == "system")
        if system:
            body["system"] = system
        body["messages"] = [{"role": r, "content": t} for r, t in prompt.messages if r != "system"]
        if config.temperature is not None:
            body["temperature"] = config.temperature
        return body
    if config.api == "responses":  # the system prompt as instructions, usage always sent
        del body["max_tokens"]
        body["max_output_tokens"] = max(1, request.output_tokens)
        system = "".join(text for role, text in prompt.messages if role == "system")
        if system:
            body["instructions"] = system
        body["input"] = [{"role": r, "content": t} for r, t in prompt.messages if r != "system"]
        body["store"] = False  # the whole conversation is sent each turn
        if config.temperature is not None:
            body["temperature"] = config.temperature
        if config.ignore_eos or config.is_exact:
            body["ignore_eos"] = True
        return body
    body["stream_options"] = {"include_usage": True}
    if prompt.token_ids is not None:
        body["prompt"] = list(prompt.token_ids)
    elif config.api == "chat":
        body["messages"] = [{"role": role, "content": text} for role, text in prompt.messages]
    else:
        body["prompt"] = prompt.text
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.ignore_eos or config.is_exact:
        body["ignore_eos"] = True  # vLLM / SGLang extension: generate exactly max_tokens
    return body


def row(
    request: Request,
    prompt: Prompt,
    scheduled_s: float,
    sent_s: float,
    out: Outcome,
    count_tokens: Callable[[str], int],
) -> dict[str, Any]:
    """One request's line in the report (all times in seconds)."""
    output_tokens = 0
    if out.ok:
        output_tokens = (
            out.completion_tokens if out.completion_tokens is not None else count_tokens(out.text)
        )
    tpot = None
    if out.ok and out.ttft_s is not None and out.e2e_s is not None:
        tpot = tpot_of(out.e2e_s, out.ttft_s, output_tokens)
    return {
        "request_id": request.request_id,
        "session_id": request.session_id,
        "tenant": str(request.tenant),
        "scheduled_s": scheduled_s,
        "sent_s": sent_s,
        "error": out.error,
        "status": out.status,
        "detail": out.detail,
        "ttft_s": out.ttft_s,
        "tpot_s": tpot,
        "e2e_s": out.e2e_s,
        "itl_s": out.itl_s,
        "messages": len(prompt.messages),
        "trace_prompt_tokens": request.prompt_tokens,
        "trace_output_tokens": request.output_tokens,
        "prompt_tokens": out.prompt_tokens,
        "output_tokens": output_tokens,
        "cached_tokens": out.cached_tokens,
        "finish_reason": out.finish_reason,
    }


async def discover_model(session: aiohttp.ClientSession, config: LoadConfig) -> str:
    """The first model ``GET /v1/models`` lists, when ``--model`` is not given."""
    url = f"{config.base_url}/v1/models"
    try:
        async with session.get(
            url, headers=_headers(config), timeout=aiohttp.ClientTimeout(total=10.0)
        ) as resp:
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"--model not given and GET {url} failed: {exc}") from exc
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise ConfigError(f"--model not given and GET {url} lists no model")
    return str(models[0].get("id"))


def _headers(config: LoadConfig) -> dict[str, str]:
    # Anthropic's servers read X-Api-Key; vLLM's /v1/messages and kvtide's the bearer token
    return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}


Progress = Callable[[dict[str, Any]], None]


async def run_load(
    config: LoadConfig,
    workload: Workload,
    tokenizer: Tokenizer,
    on_done: Progress | None = None,
    planned: list[tuple[float, Request]] | None = None,
) -> dict[str, Any]:
    """Runs the load and returns the report: ``config``, ``workload``, ``summary``, ``requests``."""
    plan = planned if planned is not None else schedule(workload, config)
    # a built-in workload's ids are synthetic: words, not their detokenized glue
    builder = PromptBuilder(tokenizer, config.seed, ids_as_words=workload.format == BUILTIN_PREFIX)
    build = builder.token_ids if config.prompt_format == "tokens" else builder.build
    clock = WallClock()
    headers = _headers(config)
    limit = asyncio.Semaphore(config.concurrency) if config.concurrency else None
    rows: list[dict[str, Any]] = []
    not_sent = 0

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        model = config.model or await discover_model(session, config)
        start = clock.now()

        endpoints = config.endpoints

        async def one(
            at: float, request: Request, prompt: Prompt, body: bytes, target: int
        ) -> None:
            nonlocal not_sent
            if limit is not None:
                await limit.acquire()
            try:
                sent = clock.now() - start
                if config.duration_s is not None and sent > config.duration_s:
                    not_sent += 1  # queued behind the cap until the run's time was up
                    return
                out = await stream(session, endpoints[target], body, headers, config.timeout_s)
            finally:
                if limit is not None:
                    limit.release()
            result = row(request, prompt, at, sent, out, count_tokens)
            if len(endpoints) > 1:
                result["target"] = target
            rows.append(result)
            if on_done is not None:
                on_done(result)

        async with asyncio.TaskGroup() as group:
            for i, (at, request) in enumerate(plan):
                # in arrival order (sessions build up in order), and encoded before the send
                # time so that neither delays the request nor counts in its TTFT
                prompt = build(request)
                body = orjson.dumps(payload(config, model, prompt, request))
                delay = at - (clock.now() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                group.create_task(one(at, request, prompt, body, i % len(endpoints)))
        duration = clock.now() - start
    rows.sort(key=lambda r: (r["scheduled_s"], r["sent_s"]))
    return {
        "config": {
            **asdict(config),
            "api_key": None if config.api_key is None else "(given)",  # never the secret itself
            "model": model,
            "endpoint": config.endpoint,
            "endpoints": list(config.endpoints),
        },
        "workload": workload.description,
        "summary": {**summarize(rows, duration, config.slo), "not_sent": not_sent},
        "requests": rows,
    }
