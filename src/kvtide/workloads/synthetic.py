"""Building blocks of the seeded synthetic workloads: lengths, arrivals, content, conversations.

Every generator draws its plan (times, lengths, choices) from a ``random.Random`` and its token
content from a numpy ``Generator`` seeded by that Random, both derived from (seed, stream), so
a workload is a pure function of its parameters and seed.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from kvtide.types import Request, TenantId

TOKEN_IDS: Final = range(1000, 30000)
"""Where synthetic token ids lie: ordinary tokens in every common vocabulary (Llama 2's 32k,
GPT-2's 50k, SmolLM2's 49k, Llama 3's 128k), clear of special and byte tokens at the low end,
so a synthetic prompt can also be sent to a real engine."""

Tokens = npt.NDArray[np.int32]


def stream_rngs(seed: int, stream: str) -> tuple[random.Random, np.random.Generator]:
    """The plan and content generators of one stream (seeding a Random by str is stable)."""
    rng = random.Random(f"{seed}/{stream}")
    return rng, np.random.default_rng(rng.getrandbits(64))


def lognormal_int(rng: random.Random, mean: float, sigma: float = 0.8) -> int:
    """A positive integer with the given mean, heavy-tailed; clipped at 8x the mean."""
    mu = math.log(mean) - sigma * sigma / 2.0
    value = rng.lognormvariate(mu, sigma)
    return max(1, min(round(value), math.ceil(8.0 * mean)))


def lognormal_s(rng: random.Random, mean_s: float, sigma: float = 1.0) -> float:
    mu = math.log(mean_s) - sigma * sigma / 2.0
    return rng.lognormvariate(mu, sigma)


def zipf_weights(n: int, exponent: float) -> list[float]:
    """Weights of ranks 1..n with P(rank k) proportional to k**-exponent."""
    return [rank**-exponent for rank in range(1, n + 1)]


def zipf_cum_weights(n: int, exponent: float) -> list[float]:
    """Cumulative Zipf weights, for ``pick``."""
    return list(itertools.accumulate(zipf_weights(n, exponent)))


def pick(rng: random.Random, cum_weights: Sequence[float]) -> int:
    """An index drawn with the given cumulative weights (``random.choices`` minus its overhead)."""
    return bisect.bisect(cum_weights, rng.random() * cum_weights[-1])


def uniform_times(rng: random.Random, count: int, start_s: float, end_s: float) -> list[float]:
    """``count`` sorted arrival times spread uniformly over [start_s, end_s): a Poisson process
    conditioned on its count."""
    return sorted(rng.uniform(start_s, end_s) for _ in range(count))


def merge(streams: Iterable[Iterator[Request]]) -> Iterator[Request]:
    """Merges streams already in arrival order; ties go to the earlier stream."""
    return heapq.merge(*streams, key=lambda request: request.arrival_s)


class ContentPool:
    """Shared pieces of content (system prompts, documents), made on first use."""

    __slots__ = ("_content", "_lengths", "_rng")

    def __init__(self, lengths: Sequence[int], rng: np.random.Generator) -> None:
        self._lengths = lengths
        self._rng = rng
        self._content: dict[int, Tokens] = {}

    def __getitem__(self, index: int) -> Tokens:
        piece = self._content.get(index)
        if piece is None:
            piece = fresh_tokens(self._rng, self._lengths[index])
            self._content[index] = piece
        return piece


def fresh_tokens(rng: np.random.Generator, count: int) -> Tokens:
    return rng.integers(TOKEN_IDS.start, TOKEN_IDS.stop, count, dtype=np.int32)


def frozen(tokens: Tokens) -> Tokens:
    """A request's own token array, made read-only: requests are values."""
    tokens.flags.writeable = False
    return tokens


@dataclass(frozen=True, slots=True)
class ConversationShape:
    """How the sessions of a conversation workload look; token counts and times are means.

    Turn 1's prompt is a shared system prompt plus a first message; turn k+1's prompt is
    turn k's prompt plus turn k's output plus a new message (a user message in a chat, a tool
    output in an agent loop). A session ends after its turns, before a later prompt would exceed
    ``max_prompt_tokens``, or at ``end_s``, the workload's horizon.
    """

    system_prompts: int
    system_tokens: float
    first_tokens: float
    new_tokens: float
    output_tokens: float
    turns: float
    think_s: float
    max_prompt_tokens: int
    end_s: float


@dataclass(frozen=True, slots=True)
class _Turn:
    arrival_s: float
    new_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class _Session:
    system_prompt: int
    turns: tuple[_Turn, ...]


def conversations(
    shape: ConversationShape,
    starts_s: Sequence[float],
    rng: random.Random,
    content_rng: np.random.Generator,
    *,
    stream: str,
    tenant: TenantId,
    block_tokens: int,
) -> Iterator[Request]:
    """One multi-turn session per start time, their turns merged in arrival order.

    Request ids are ``{stream}-{session}/{turn}`` and session ids ``{stream}-{session}``;
    ``extra["turn"]`` counts from 1.
    """
    system_lengths = [
        lognormal_int(rng, shape.system_tokens, 0.5) for _ in range(shape.system_prompts)
    ]
    system_pool = ContentPool(system_lengths, content_rng)
    system_cum = zipf_cum_weights(shape.system_prompts, 1.0)
    sessions = [
        _plan_session(shape, start_s, system_lengths, system_cum, rng) for start_s in starts_s
    ]
    order = sorted(
        (turn.arrival_s, index, k)
        for index, session in enumerate(sessions)
        for k, turn in enumerate(session.turns)
    )
    histories: dict[int, Tokens] = {}
    for arrival_s, index, k in order:
        session = sessions[index]
        turn = session.turns[k]
        history = histories.pop(index) if k else system_pool[session.system_prompt]
        prompt = np.concatenate((history, fresh_tokens(content_rng, turn.new_tokens)))
        if k + 1 < len(session.turns):
            histories[index] = np.concatenate(
                (prompt, fresh_tokens(content_rng, turn.output_tokens))
            )
        yield Request(
            request_id=f"{stream}-{index}/{k + 1}",
            arrival_s=arrival_s,
            prompt_tokens=len(prompt),
            output_tokens=turn.output_tokens,
            block_tokens=block_tokens,
            token_ids=frozen(prompt),
            tenant=tenant,
            session_id=f"{stream}-{index}",
            extra={"turn": k + 1},
        )


def _plan_session(
    shape: ConversationShape,
    start_s: float,
    system_lengths: Sequence[int],
    system_cum: Sequence[float],
    rng: random.Random,
) -> _Session:
    system_prompt = pick(rng, system_cum)
    num_turns = _geometric(rng, shape.turns)
    context_tokens = system_lengths[system_prompt]
    arrival_s = start_s
    turns: list[_Turn] = []
    for k in range(num_turns):
        new_tokens = lognormal_int(rng, shape.new_tokens if k else shape.first_tokens)
        output_tokens = lognormal_int(rng, shape.output_tokens)
        context_tokens += new_tokens
        if turns and (context_tokens > shape.max_prompt_tokens or arrival_s >= shape.end_s):
            break
        turns.append(_Turn(arrival_s, new_tokens, output_tokens))
        context_tokens += output_tokens
        arrival_s += lognormal_s(rng, shape.think_s)
    return _Session(system_prompt, tuple(turns))


def _geometric(rng: random.Random, mean: float) -> int:
    """A count >= 1 with the given mean (geometric: many short sessions, a few long ones),
    capped at four times the mean."""
    if mean <= 1.0:
        return 1
    draw = math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / mean)
    return min(1 + int(draw), math.ceil(4.0 * mean))
