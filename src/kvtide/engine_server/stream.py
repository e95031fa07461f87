"""One request's output as it is produced: token texts pushed by an engine, taken by its HTTP
handler, with the request's metrics recorded on the way and its stop strings matched token by
token (so that the token completing one is the request's last)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvtide.clock import WallClock
from kvtide.engine_server.metrics import EngineMetrics

_WALL = WallClock()


class StopMatcher:
    """Stop strings over the text generated so far, as vLLM's detokenizer checks them: the
    text ends before the first match (after it with ``include_stop_str``). ``hold_chars`` is
    how much of the text's end a stream must hold back until the request ends (vLLM's
    ``stop_buffer_length``): the start of a stop string that a later token completes.

    It keeps only a window of the text: what ``release`` has not handed out yet and the
    last ``longest - 1`` characters a stop string could start in, so a long output costs
    each token the window's length, not the whole text's (appending to one string that
    grows with the output made a request's checks quadratic in its length)."""

    __slots__ = ("_lookback", "_sent", "hold_chars", "include_stop_str", "matched", "stops", "text")

    def __init__(self, stops: tuple[str, ...], include_stop_str: bool = False) -> None:
        self.stops = stops
        self.include_stop_str = include_stop_str
        self._lookback = max(max(map(len, stops), default=0) - 1, 0)
        self.hold_chars = 0 if include_stop_str else self._lookback
        self.matched: str | None = None
        self.text = ""  # the window: the generated text's end
        self._sent = 0  # how much of the window ``release`` has handed out

    def check(self, texts: list[str]) -> bool:
        """Appends the new tokens' texts; True (and the text cut at the match) when a stop
        string has appeared."""
        start = max(0, len(self.text) - self._lookback)
        self.text += "".join(texts)
        best: tuple[int, str] | None = None
        for s in self.stops:
            at = self.text.find(s, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return False
        at, stop = best
        self.text = self.text[: at + len(stop) if self.include_stop_str else at]
        self.matched = stop
        return True

    def release(self, final: bool = False) -> str:
        """The text not handed out yet, less the ``hold_chars`` a stop string could still
        start in (all of it when ``final``: the request has ended)."""
        upto = len(self.text) if final else len(self.text) - self.hold_chars
        if upto <= self._sent:
            return ""
        out = self.text[self._sent : upto]
        self._sent = upto
        drop = min(upto, len(self.text) - self._lookback)
        if drop > 0:  # nothing a match or a later release needs
            self.text = self.text[drop:]
            self._sent -= drop
        return out


def cache_writes(prompt_tokens: int, cached_tokens: int, block_tokens: int) -> int:
    """The prompt tokens a prefill wrote to the prefix cache, as vLLM 0.33 counts them
    (``PrefillStats.finalize``): the prompt's tokens in whole blocks, now cached, less those
    it found there. Its usage reports them as ``created_cache_tokens`` (chat),
    ``cache_write_tokens`` (Responses) and ``cache_creation_input_tokens`` (Messages)."""
    return max(0, prompt_tokens // block_tokens * block_tokens - cached_tokens)


class RequestStream:
    """Pushed by one engine task, taken by one handler (both on the event loop's thread).

    ``cached_tokens`` is set with the first token, as the engine counted it (vLLM's
    ``usage`` reports it unless a remote prefill names its own), and ``written_tokens``, the
    prompt tokens that prefill added to the prefix cache (``cache_writes``); ``finish_reason``
    ("length", "stop", "abort") once the engine is done with the request; ``stop_reason`` the
    stop string that ended it, if one did; ``is_length_capped`` whether the engine ended it at
    its output limit (vLLM's FINISHED_LENGTH_CAPPED), even where a stop string matched that
    last token.
    """

    __slots__ = (
        "_metrics",
        "_stop",
        "_waiter",
        "arrival_wall_s",
        "block_tokens",
        "cached_tokens",
        "finish_reason",
        "is_length_capped",
        "last_token_wall_s",
        "max_tokens",
        "num_generated",
        "on_first_token",
        "pending",
        "prompt_tokens",
        "request_id",
        "stop_reason",
        "written_tokens",
    )

    def __init__(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        metrics: EngineMetrics,
        block_tokens: int,
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.block_tokens = block_tokens
        self._metrics = metrics
        self.arrival_wall_s = _WALL.now()
        self.last_token_wall_s: float | None = None
        self.cached_tokens = 0
        self.written_tokens = 0
        self.on_first_token: Callable[[], None] | None = None
        """Called once the prefill is done (a decode engine's read of a remote KV)."""
        self.num_generated = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.is_length_capped = False
        self.pending: list[str] = []
        self._stop: StopMatcher | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def stop_at(self, stops: tuple[str, ...], include_stop_str: bool = False) -> None:
        """Ends the request with "stop" at the token that completes one of ``stops``; called
        by the handler right after ``submit``, before the engine can push a token. The owner
        of the request then sees ``stop_reason`` set and aborts it in its backend."""
        if stops:
            self._stop = StopMatcher(stops, include_stop_str)

    def first_token(self, cached_tokens: int, loaded_tokens: int = 0) -> None:
        """The prefill is done: the prompt counts as processed from now on
        (``loaded_tokens``: those of ``cached_tokens`` a remote prefill's KV brought)."""
        self.cached_tokens = cached_tokens
        self.written_tokens = cache_writes(self.prompt_tokens, cached_tokens, self.block_tokens)
        self._metrics.prefilled(self.prompt_tokens, cached_tokens, loaded_tokens)
        if self.on_first_token is not None:
            self.on_first_token()

    def push(self, text: str) -> None:
        """One generated token (ignored once the request is finished: a stop string ends it
        though the engine may have produced more in the same step)."""
        if self.finish_reason is not None:
            return
        now = _WALL.now()
        if self.last_token_wall_s is None:
            self._metrics.first_token(now - self.arrival_wall_s)
        else:
            self._metrics.inter_token(now - self.last_token_wall_s)
        self.last_token_wall_s = now
        self.num_generated += 1
        stop = self._stop
        if stop is None:
            self.pending.append(text)
        elif stop.check([text]):
            self.stop_reason = stop.matched
            self.finish("stop")
            return
        elif out := stop.release():
            self.pending.append(out)
        self._wake()

    def finish(self, reason: str) -> None:
        """The engine is done with the request (once; later calls are ignored); the text held
        back for stop strings goes out with it."""
        if self.finish_reason is not None:
            return
        self.finish_reason = reason
        if self._stop is not None and (out := self._stop.release(final=True)):
            self.pending.append(out)
        self._metrics.ended(reason, _WALL.now() - self.arrival_wall_s)
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
