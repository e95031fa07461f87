"""The access log: one JSON line per completion request, what routing did with it and what the
engine said back, for an operator asking why one request was slow or missed the cache.

The metrics answer "how many": ``kvtide_gateway_predicted_cached_tokens_total`` against the
engines' reports, decisions by reason. They cannot say which request went where, predicted how
many cached tokens, got how many, waited how long. A line does::

    {"ts": 1764892741.123, "id": "gw-3fa09c11d2-17", "client_request_id": null,
     "endpoint": "chat", "status": 200, "error": null,
     "tenant": "acme", "model": "llama", "stream": true, "prompt_tokens": 2086,
     "tokenized": true, "engine_prompt_tokens": 2086, "completion_tokens": 120,
     "replica": "10.0.0.7:8000", "route": "affinity", "attempts": 1, "failures": [],
     "predicted_cached_tokens": 2048, "cached_tokens": 2048, "priority": null,
     "ttft_ms": 41.2, "duration_ms": 388.0}

``id`` is the gateway's (unique across gateway replicas and restarts): the engine gets it as
``X-Request-Id``, as does the client in the answer's headers, so a line joins the engine's
own log (vLLM uses it as its request id with ``--enable-request-id-headers``). A client's own
``X-Request-Id`` (up to 128 printable ASCII characters) is logged beside it, never forwarded:
it need not be unique, and an engine's request ids must be.
``prompt_tokens`` is the gateway's count (its tokenizer's where ``tokenized``, else text mode's
estimate of 4 bytes a token), ``engine_prompt_tokens`` and ``completion_tokens`` the engine's
``usage`` where it sent one: a tokenized count that differs from the engine's means the
gateway renders or tokenizes prompts otherwise than the engine, so it hashes other blocks than
the engine caches and its index cannot match them (``kvtide doctor --access-log`` counts them).
``cached_tokens`` is the engine's ``usage.prompt_tokens_details.cached_tokens`` where it sent
one (every answer: the gateway asks for a stream's usage where the client did not), else null;
``ttft_ms`` is the first streamed output chunk (null for a non-streamed answer, whose first
byte is its last); ``failures`` what went wrong on the way, in order: an attempt that failed
before its first byte (``connect``, ``timeout``, ``read``, ``http_503``...: retried on another
replica, ``attempts`` counts both), ``priority_refused`` (an engine refused the router's
priority: routed again without one), ``mid_stream`` (the engine failed after the first byte:
the client got an SSE error event under status 200). A request refused before routing (401,
400, 413, 429...) has its status and OpenAI error code and no replica; a client that went
away, status 499.

Serving never waits for the disk: ``record`` appends the line to a list, and a task in the
gateway's lifespan writes the lines gathered in a thread every ``flush_s``. Past
``max_pending`` lines unwritten (a stalled disk), lines are dropped and counted
(``kvtide_gateway_access_log_dropped_total``), so memory stays bounded. ``-`` writes to
standard output (containers); a file is opened for appending and reopened on SIGHUP, so
logrotate can move it away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

import orjson

from kvtide.errors import ConfigError

STDOUT = "-"

log = logging.getLogger("kvtide.gateway")


@dataclass(slots=True)
class Exchange:
    """What the log says of one completion request, filled in as the request goes: the
    handler knows the endpoint, ``Gateway.complete`` the tenant and prompt, the proxy the
    replica, the route and the engine's answer."""

    endpoint: str
    ts: float
    """Arrival, Unix seconds."""
    arrival_s: float
    """Arrival on the gateway's clock (what durations are measured on)."""
    request_id: str | None = None
    client_request_id: str | None = None
    """The client's ``X-Request-Id``, when it sent a well-formed one."""
    tenant: str | None = None
    model: str | None = None
    stream: bool | None = None
    prompt_tokens: int | None = None
    tokenized: bool | None = None
    """Whether ``prompt_tokens`` is the gateway's tokenizer's count (else text mode's
    estimate)."""
    engine_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    replica: str | None = None
    """The engine that answered or, for a disaggregated request, prefilled it."""
    decode_replica: str | None = None
    """The engine that decoded a disaggregated request."""
    route: str | None = None
    predicted_cached_tokens: int | None = None
    cached_tokens: int | None = None
    priority: int | None = None
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
    first_token_s: float | None = None
    """When the first output chunk went back, on the gateway's clock."""
    answered_s: float | None = None
    """When the client had its whole answer (a stream up to its ``data: [DONE]``), on the
    gateway's clock: a disconnect after it is the client closing its connection, not a
    request cancelled, and the line's ``duration_ms`` ends here, not after the engine's end
    of body (read afterwards, for the connection's sake)."""
    hide_usage: bool = False
    """The gateway asked the engine for this stream's usage, the client did not: the usage
    event is read and dropped from the client's stream (``gateway.usage``)."""
    count_output: bool = False
    """The tenant is held to tokens per minute: the stream's output events are counted, for
    the charge of a stream cut before the engine's usage (``gateway.usage.OutputCounter``)."""
    stored: bool = False
    """A Responses request the engine may keep the answer of (``store`` not false): where
    the answer goes is noted, for the requests naming it (``gateway.response_homes``)."""

    @property
    def answered(self) -> bool:
        return self.answered_s is not None

    @property
    def request_id_bytes(self) -> bytes:
        return (self.request_id or "").encode()

    def prefilled(self) -> None:
        """A disaggregated request's prefill leg answered: its one token is not the client's
        output (the decode's usage gives that); what it reused stays the request's
        ``cached_tokens`` (vLLM's decode reports the same, told it by the prefill)."""
        self.completion_tokens = None

    @property
    def upstream_headers(self) -> bytes:
        """The header lines the engine gets with the request (the gateway's ids are header-safe:
        hex digits, digits and dashes)."""
        return b"X-Request-Id: %s\r\n" % self.request_id_bytes if self.request_id else b""

    def line(self, status: int, error: str | int | None, now_s: float) -> bytes:
        start = self.arrival_s
        ttft = self.first_token_s
        end = now_s if self.answered_s is None else self.answered_s
        return orjson.dumps(
            {
                "ts": round(self.ts, 3),
                "id": self.request_id,
                "client_request_id": self.client_request_id,
                "endpoint": self.endpoint,
                "status": status,
                "error": error,
                "tenant": self.tenant,
                "model": self.model,
                "stream": self.stream,
                "prompt_tokens": self.prompt_tokens,
                "tokenized": self.tokenized,
                "engine_prompt_tokens": self.engine_prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "replica": self.replica,
                "decode_replica": self.decode_replica,
                "route": self.route,
                "attempts": self.attempts,
                "failures": self.failures,
                "predicted_cached_tokens": self.predicted_cached_tokens,
                "cached_tokens": self.cached_tokens,
                "priority": self.priority,
                "ttft_ms": None if ttft is None else round((ttft - start) * 1e3, 1),
                "duration_ms": round((end - start) * 1e3, 1),
            },
            option=orjson.OPT_APPEND_NEWLINE,
        )


class AccessLog:
    """Lines gathered on the event loop, written by ``run`` (a lifespan task) off it. The
    file is touched only in worker threads, under one lock: a write, a reopen, the close."""

    def __init__(
        self,
        path: str,
        flush_s: float = 0.5,
        max_pending: int = 65_536,
        on_drop: Callable[[int], object] | None = None,
    ) -> None:
        self.path = path
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.on_drop = on_drop
        """Told of lines lost (past ``max_pending`` unwritten, or a failed write), from the
        loop or a worker thread: a Prometheus counter's ``inc`` is safe from both."""
        self._pending: list[bytes] = []
        self._lock = threading.Lock()
        self._reopen = False
        self._file: IO[bytes] = self._open()  # at start: a bad path is a config error

    def _open(self) -> IO[bytes]:
        if self.path == STDOUT:
            return sys.stdout.buffer
        try:
            # unbuffered: a failed write (disk full) leaves nothing behind to fail again at
            # the next write or at close
            return open(self.path, "ab", buffering=0)  # held open until close
        except OSError as exc:
            raise ConfigError(f"access_log: cannot open {self.path}: {exc.strerror}") from exc

    def record(
        self, exchange: Exchange, status: int, error: str | int | None, now_s: float
    ) -> None:
        if len(self._pending) >= self.max_pending:
            if self.on_drop is not None:
                self.on_drop(1)
            return
        self._pending.append(exchange.line(status, error, now_s))

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        """Writes what gathered every ``flush_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.flush_s)
            await self.flush()

    async def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            await asyncio.to_thread(self._write, lines)

    def _write(self, lines: list[bytes]) -> None:
        with self._lock:
            if self._reopen:
                self._reopen = False
                self._swap()
            try:
                data = memoryview(b"".join(lines))
                while data:  # a raw file may take part of it
                    data = data[self._file.write(data) or 0 :]
                self._file.flush()
            except (OSError, ValueError) as exc:  # disk full, a closed stdout: serving goes on
                if self.on_drop is not None:
                    self.on_drop(len(lines))
                log.error("access log: %d lines lost: %s", len(lines), exc)

    def _swap(self) -> None:
        try:
            new = self._open()
        except ConfigError as exc:
            log.error("%s; writing on to the old file", exc)
            return
        old, self._file = self._file, new
        old.close()

    def reopen(self) -> None:
        """SIGHUP: the path opened again at the next write (logrotate moved the old file
        away); a path that no longer opens keeps the old file."""
        if self.path != STDOUT:
            self._reopen = True

    async def close(self) -> None:
        """The last lines written (after the drain), the file closed."""
        await self.flush()
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            if self.path != STDOUT:
                self._file.close()
