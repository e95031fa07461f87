"""One request's output as it is produced: token texts pushed by an engine, taken by its HTTP
handler, with the request's latency metrics recorded on the way."""

from __future__ import annotations

import asyncio

from kvtide.clock import WallClock
from kvtide.engine_server.metrics import EngineMetrics

_WALL = WallClock()


class RequestStream:
    """Pushed by one engine task, taken by one handler (both on the event loop's thread).

    ``cached_tokens`` is set with the first token, as vLLM reports it in ``usage``;
    ``finish_reason`` ("length", "stop", "abort") once the engine is done with the request.
    """

    __slots__ = (
        "_metrics",
        "_waiter",
        "arrival_wall_s",
        "cached_tokens",
        "finish_reason",
        "last_token_wall_s",
        "max_tokens",
        "num_generated",
        "pending",
        "prompt_tokens",
        "request_id",
    )

    def __init__(
        self, request_id: str, prompt_tokens: int, max_tokens: int, metrics: EngineMetrics
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self._metrics = metrics
        self.arrival_wall_s = _WALL.now()
        self.last_token_wall_s: float | None = None
        self.cached_tokens = 0
        self.num_generated = 0
        self.finish_reason: str | None = None
        self.pending: list[str] = []
        self._waiter: asyncio.Future[None] | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def first_token(self, cached_tokens: int) -> None:
        self.cached_tokens = cached_tokens

    def push(self, text: str) -> None:
        """One generated token."""
        if self.finish_reason is not None:
            return
        now = _WALL.now()
        if self.last_token_wall_s is None:
            self._metrics.first_token(now - self.arrival_wall_s)
        else:
            self._metrics.inter_token(now - self.last_token_wall_s)
        self.last_token_wall_s = now
        self.num_generated += 1
        self.pending.append(text)
        self._wake()

    def finish(self, reason: str) -> None:
        """The engine is done with the request (once; later calls are ignored)."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        self._metrics.finished(
            reason,
            self.prompt_tokens,
            self.num_generated,
            self.cached_tokens,
            _WALL.now() - self.arrival_wall_s,
        )
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[str]:
        """The token texts produced since the last call, waiting for at least one unless the
        request is finished (then possibly none)."""
        while not self.pending and self.finish_reason is None:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
            self._waiter = None
        out, self.pending = self.pending, []
        return out
