"""The built-in synthetic workloads: chat, agent, rag, tenants, burst and their mix.

Each is a frozen parameter dataclass (every field settable as ``builtin:NAME:key=value``) with
a ``generate(seed, block_tokens)`` method yielding timed, token-level requests in arrival order.
Token counts and times are means unless a name says otherwise; times are in seconds.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from kvtide.errors import ConfigError
from kvtide.types import Request, TenantId
from kvtide.workloads.synthetic import (
    ContentPool,
    ConversationShape,
    conversations,
    fresh_tokens,
    frozen,
    lognormal_int,
    merge,
    pick,
    stream_rngs,
    uniform_times,
    zipf_cum_weights,
    zipf_weights,
)

_DEFAULT_TENANT = TenantId("default")


class BuiltinParams(Protocol):
    """A built-in's parameters: a frozen dataclass of numbers that generates its requests."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    summary: ClassVar[str]
    may_be_zero: ClassVar[frozenset[str]]

    def generate(self, seed: int, block_tokens: int) -> Iterator[Request]: ...


def check_params(params: BuiltinParams) -> None:
    """Every parameter must be a finite number, positive unless ``may_be_zero`` names it, and
    within what a generator can plan (``limit_of``): sessions and pools are planned before
    the first request, so a billion sessions or a trillion-token prompt hung a run or ended
    it in a MemoryError."""
    name = type(params).__name__.lower()
    for field in dataclasses.fields(params):
        value = getattr(params, field.name)
        is_zero_ok = field.name in params.may_be_zero
        if not (math.isfinite(value) and (value >= 0 if is_zero_ok else value > 0)):
            sign = "non-negative" if is_zero_ok else "positive"
            raise ConfigError(f"{name} workload: {field.name} must be {sign}, got {value}")
        limit = limit_of(field.name)
        if value > limit:
            raise ConfigError(
                f"{name} workload: {field.name} must be at most {limit:,}, got {value}"
            )
    for count, tokens in (("system_prompts", "system_tokens"), ("documents", "doc_tokens")):
        pool = getattr(params, count, 0) * getattr(params, tokens, 0)
        if pool > MAX_POOL_TOKENS:
            raise ConfigError(
                f"{name} workload: {count} x {tokens} must be at most {MAX_POOL_TOKENS:,} "
                f"tokens (the shared pool is generated up front), got {pool:,.0f}"
            )


MAX_POOL_TOKENS = 1 << 27
"""Tokens of a shared pool (system prompts, documents) generated up front: 512 MiB of ids."""


def limit_of(field: str) -> float:
    """The largest value a built-in's parameter may take, by its name's kind: well past any
    real deployment (a 16Mi-token context, a million sessions, three years), short of what
    hangs a run."""
    if field.endswith("_tokens"):
        return 1 << 24
    if field in ("sessions", "requests", "burst_sessions"):
        return 1_000_000
    if field in ("documents", "system_prompts", "tenants", "max_docs"):
        return 100_000
    if field in ("turns", "steps"):
        return 10_000
    if field.endswith("_s"):
        return 1e8
    return 1e6  # rates, skews, scales


def _uniform_sessions(
    shape: ConversationShape,
    sessions: int,
    duration_s: float,
    seed: int,
    block_tokens: int,
    stream: str,
    tenant: TenantId,
) -> Iterator[Request]:
    """Sessions of ``shape`` starting uniformly over ``duration_s``, on the stream's own rngs."""
    rng, content_rng = stream_rngs(seed, stream)
    starts_s = uniform_times(rng, sessions, 0.0, duration_s)
    yield from conversations(
        shape, starts_s, rng, content_rng, stream=stream, tenant=tenant, block_tokens=block_tokens
    )


@dataclass(frozen=True, slots=True)
class Chat:
    """Multi-turn chat sessions over a few shared system prompts, with human think times."""

    summary: ClassVar[str] = "multi-turn chat sessions sharing a few system prompts"
    may_be_zero: ClassVar[frozenset[str]] = frozenset()
    sessions: int = 300
    turns: float = 5.0
    duration_s: float = 600.0
    system_prompts: int = 4
    system_tokens: float = 800.0
    user_tokens: float = 200.0
    output_tokens: float = 300.0
    think_s: float = 60.0
    max_prompt_tokens: int = 16384

    def __post_init__(self) -> None:
        check_params(self)

    def generate(
        self,
        seed: int,
        block_tokens: int,
        *,
        stream: str = "chat",
        tenant: TenantId = _DEFAULT_TENANT,
    ) -> Iterator[Request]:
        return _uniform_sessions(
            self.shape(), self.sessions, self.duration_s, seed, block_tokens, stream, tenant
        )

    def shape(self) -> ConversationShape:
        return ConversationShape(
            system_prompts=self.system_prompts,
            system_tokens=self.system_tokens,
            first_tokens=self.user_tokens,
            new_tokens=self.user_tokens,
            output_tokens=self.output_tokens,
            turns=self.turns,
            think_s=self.think_s,
            max_prompt_tokens=self.max_prompt_tokens,
            end_s=self.duration_s,
        )


@dataclass(frozen=True, slots=True)
class Agent:
    """Agent loops: a long tool-describing system prompt, a task, then steps that each append
    a short model action and a tool output to a growing scratchpad, seconds apart."""

    summary: ClassVar[str] = "agent loops with a growing scratchpad of tool outputs"
    may_be_zero: ClassVar[frozenset[str]] = frozenset()
    sessions: int = 60
    steps: float = 10.0
    duration_s: float = 600.0
    system_prompts: int = 3
    system_tokens: float = 2000.0
    task_tokens: float = 300.0
    tool_tokens: float = 300.0
    output_tokens: float = 80.0
    tool_s: float = 2.0
    max_prompt_tokens: int = 32768

    def __post_init__(self) -> None:
        check_params(self)

    def generate(
        self,
        seed: int,
        block_tokens: int,
        *,
        stream: str = "agent",
        tenant: TenantId = _DEFAULT_TENANT,
    ) -> Iterator[Request]:
        return _uniform_sessions(
            self.shape(), self.sessions, self.duration_s, seed, block_tokens, stream, tenant
        )

    def shape(self) -> ConversationShape:
        return ConversationShape(
            system_prompts=self.system_prompts,
            system_tokens=self.system_tokens,
            first_tokens=self.task_tokens,
            new_tokens=self.tool_tokens,
            output_tokens=self.output_tokens,
            turns=self.steps,
            think_s=self.tool_s,
            max_prompt_tokens=self.max_prompt_tokens,
            end_s=self.duration_s,
        )


@dataclass(frozen=True, slots=True)
class Rag:
    """Retrieval-augmented requests: system prompt + 1..max_docs documents drawn from a
    Zipf-popular set (document 0 the most popular) + a fresh question, Poisson arrivals.
    ``extra["documents"]`` lists the retrieved documents in prompt order."""

    summary: ClassVar[str] = "RAG over a Zipf-popular document set"
    may_be_zero: ClassVar[frozenset[str]] = frozenset({"zipf"})
    requests: int = 800
    duration_s: float = 600.0
    documents: int = 300
    doc_tokens: float = 600.0
    max_docs: int = 3
    zipf: float = 1.1
    system_prompts: int = 2
    system_tokens: float = 400.0
    question_tokens: float = 60.0
    output_tokens: float = 200.0

    def __post_init__(self) -> None:
        check_params(self)

    def generate(
        self,
        seed: int,
        block_tokens: int,
        *,
        stream: str = "rag",
        tenant: TenantId = _DEFAULT_TENANT,
    ) -> Iterator[Request]:
        rng, content_rng = stream_rngs(seed, stream)
        arrivals_s = uniform_times(rng, self.requests, 0.0, self.duration_s)
        systems = ContentPool(
            [lognormal_int(rng, self.system_tokens, 0.3) for _ in range(self.system_prompts)],
            content_rng,
        )
        docs = ContentPool(
            [lognormal_int(rng, self.doc_tokens, 0.5) for _ in range(self.documents)], content_rng
        )
        doc_cum = zipf_cum_weights(self.documents, self.zipf)
        max_docs = min(self.max_docs, self.documents)
        for index, arrival_s in enumerate(arrivals_s):
            system = rng.randrange(self.system_prompts)
            chosen: list[int] = []
            for _ in range(rng.randint(1, max_docs)):
                doc = pick(rng, doc_cum)
                while doc in chosen:
                    doc = pick(rng, doc_cum)
                chosen.append(doc)
            question = fresh_tokens(content_rng, lognormal_int(rng, self.question_tokens, 0.5))
            prompt = np.concatenate([systems[system], *(docs[doc] for doc in chosen), question])
            yield Request(
                request_id=f"{stream}/{index}",
                arrival_s=arrival_s,
                prompt_tokens=len(prompt),
                output_tokens=lognormal_int(rng, self.output_tokens),
                block_tokens=block_tokens,
                token_ids=frozen(prompt),
                tenant=tenant,
                extra={"documents": tuple(chosen)},
            )


@dataclass(frozen=True, slots=True)
class Burst:
    """Single-turn requests over a few shared system prompts, arriving in on/off bursts:
    ``on_rate`` requests/s for ``on_s``, then ``off_rate`` for ``off_s``, repeated."""

    summary: ClassVar[str] = "single-turn requests arriving in on/off bursts"
    may_be_zero: ClassVar[frozenset[str]] = frozenset({"on_rate", "off_rate"})
    duration_s: float = 600.0
    on_s: float = 30.0
    off_s: float = 90.0
    on_rate: float = 3.0
    off_rate: float = 0.3
    system_prompts: int = 4
    system_tokens: float = 800.0
    user_tokens: float = 300.0
    output_tokens: float = 200.0

    def __post_init__(self) -> None:
        check_params(self)

    def generate(
        self,
        seed: int,
        block_tokens: int,
        *,
        stream: str = "burst",
        tenant: TenantId = _DEFAULT_TENANT,
    ) -> Iterator[Request]:
        rng, content_rng = stream_rngs(seed, stream)
        systems = ContentPool(
            [lognormal_int(rng, self.system_tokens, 0.3) for _ in range(self.system_prompts)],
            content_rng,
        )
        system_cum = zipf_cum_weights(self.system_prompts, 1.0)
        for index, (arrival_s, is_on) in enumerate(self._arrivals(rng)):
            system = pick(rng, system_cum)
            message = fresh_tokens(content_rng, lognormal_int(rng, self.user_tokens))
            prompt = np.concatenate((systems[system], message))
            yield Request(
                request_id=f"{stream}/{index}",
                arrival_s=arrival_s,
                prompt_tokens=len(prompt),
                output_tokens=lognormal_int(rng, self.output_tokens),
                block_tokens=block_tokens,
                token_ids=frozen(prompt),
                tenant=tenant,
                extra={"is_burst": is_on},
            )

    def _arrivals(self, rng: random.Random) -> Iterator[tuple[float, bool]]:
        """A Poisson process whose rate switches between the on and the off rate; each phase
        restarts the clock at its start, which the process's memorylessness allows."""
        phase_start_s = 0.0
        is_on = True
        while phase_start_s < self.duration_s:
            rate = self.on_rate if is_on else self.off_rate
            phase_end_s = min(phase_start_s + (self.on_s if is_on else self.off_s), self.duration_s)
            t = phase_start_s
            while rate > 0.0:
                t += rng.expovariate(rate)
                if t >= phase_end_s:
                    break
                yield t, is_on
            phase_start_s = phase_end_s
            is_on = not is_on


@dataclass(frozen=True, slots=True)
class Tenants:
    """Several tenants running chat sessions, each over its own system prompts, with session
    counts skewed by Zipf(``skew``) over tenants t0, t1, ...; the smallest tenant adds
    ``burst_sessions`` sessions that all start within [burst_at_s, burst_at_s + burst_s)."""

    summary: ClassVar[str] = "skewed tenants with their own system prompts, one bursting"
    may_be_zero: ClassVar[frozenset[str]] = frozenset({"skew", "burst_sessions", "burst_at_s"})
    tenants: int = 4
    sessions: int = 240
    skew: float = 1.0
    duration_s: float = 600.0
    turns: float = 4.0
    burst_sessions: int = 80
    burst_at_s: float = 300.0
    burst_s: float = 60.0

    def __post_init__(self) -> None:
        check_params(self)
        if self.burst_at_s + self.burst_s > self.duration_s:
            raise ConfigError("tenants workload: the burst must end within duration_s")

    def generate(self, seed: int, block_tokens: int) -> Iterator[Request]:
        weights = zipf_weights(self.tenants, self.skew)
        shares = [weight / sum(weights) for weight in weights]
        shape = Chat(turns=self.turns, duration_s=self.duration_s).shape()
        streams = []
        for index, share in enumerate(shares):
            stream = f"t{index}"
            rng, content_rng = stream_rngs(seed, stream)
            starts_s = uniform_times(
                rng, max(1, round(share * self.sessions)), 0.0, self.duration_s
            )
            if index == self.tenants - 1:
                burst_end_s = self.burst_at_s + self.burst_s
                starts_s += uniform_times(rng, self.burst_sessions, self.burst_at_s, burst_end_s)
            streams.append(
                conversations(
                    shape,
                    starts_s,
                    rng,
                    content_rng,
                    stream=stream,
                    tenant=TenantId(stream),
                    block_tokens=block_tokens,
                )
            )
        return merge(streams)


@dataclass(frozen=True, slots=True)
class Mixed:
    """The default: chat, agent, rag and burst traffic side by side, each its own tenant
    (named after it); ``scale`` multiplies every component's request count."""

    summary: ClassVar[str] = "chat + agent + rag + burst, one tenant each (the default)"
    may_be_zero: ClassVar[frozenset[str]] = frozenset()
    scale: float = 1.0
    duration_s: float = 600.0

    def __post_init__(self) -> None:
        check_params(self)

    def generate(self, seed: int, block_tokens: int) -> Iterator[Request]:
        chat = Chat(duration_s=self.duration_s)
        agent = Agent(duration_s=self.duration_s)
        rag = Rag(duration_s=self.duration_s)
        burst = Burst(duration_s=self.duration_s)
        chat = replace(chat, sessions=_scaled(chat.sessions, self.scale))
        agent = replace(agent, sessions=_scaled(agent.sessions, self.scale))
        rag = replace(rag, requests=_scaled(rag.requests, self.scale))
        burst = replace(
            burst, on_rate=burst.on_rate * self.scale, off_rate=burst.off_rate * self.scale
        )
        return merge(
            (
                chat.generate(seed, block_tokens, tenant=TenantId("chat")),
                agent.generate(seed, block_tokens, tenant=TenantId("agent")),
                rag.generate(seed, block_tokens, tenant=TenantId("rag")),
                burst.generate(seed, block_tokens, tenant=TenantId("burst")),
            )
        )


def _scaled(count: int, scale: float) -> int:
    return max(1, math.ceil(count * scale))
