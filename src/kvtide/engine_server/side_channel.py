"""The messages vLLM 0.33's NixlConnector sends between a decode engine and the prefill engine
whose KV it reads, between emulated engines over ZMQ.

A prefill engine keeps a finished ``do_remote_decode`` request's blocks (neither free nor
evictable) until the decode engine has read them, or until their lease runs out
(``kv_connector_extra_config.kv_lease_duration``, 30 s); the decode engine renews the lease of
requests still waiting to read every sixth of it (``HB:id1,id2``: each lease then runs two
thirds of its length from then, at least) and says when it has read one (``id:1``, one
consumer), which lets the prefill engine free them. vLLM sends these as NIXL notifications
(the read's own notification, over the transport that moved the KV); here they go over a
ZMQ ROUTER socket each prefill engine binds at the side channel its answers name
(``VLLM_NIXL_SIDE_CHANNEL_HOST`` and ``_PORT``), as ``[engine_id, message]``. A message for
another engine id, or for a request the engine does not hold (read after its lease ran out),
is dropped, as vLLM logs and drops it.

Differences from vLLM, all on the side of simplicity: the read is reported with the decode's
first token (one iteration after vLLM's, whose notification completes the transfer); the
decode engine sends no NIXL handshake and nothing fails to load (an unreachable prefill
engine's KV still "arrives"; its messages are dropped when the queue to it fills).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import zmq
import zmq.asyncio

from kvtide.clock import ScaledClock
from kvtide.engine_server.kv_transfer import KvTransferConfig, RemoteKv
from kvtide.engine_server.metrics import EngineMetrics
from kvtide.errors import ConfigError

log = logging.getLogger("kvtide.engine")

HEARTBEAT = "HB:"
_QUEUE = 1000
"""Messages queued to one unreachable prefill engine before more are dropped."""
_PEERS = 64
"""Prefill engines' sockets kept open, the least recently used closed past it."""


class HeldKv(Protocol):
    """The engine's held blocks (``engine_loop.EmulatedEngine``)."""

    def release_held(self, request_id: str) -> bool: ...

    def renew_held(self, request_id: str, until_s: float) -> None: ...

    def expire_held(self) -> list[str]: ...


class SideChannel:
    """This engine's end of the side channel: the prefill side (``serve``: heartbeats and
    reads received, expired leases let go) and the decode side (``reading``: a request's
    heartbeats until its read, then the read)."""

    def __init__(
        self, config: KvTransferConfig, engine: HeldKv, clock: ScaledClock, metrics: EngineMetrics
    ) -> None:
        self.config = config
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self.lease_s = config.kv_lease_s
        self._ctx = zmq.asyncio.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        endpoint = f"tcp://{_ip(config.side_channel_host)}:{config.side_channel_port}"
        try:
            self._router.bind(endpoint)
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise ConfigError(
                f"VLLM_NIXL_SIDE_CHANNEL_PORT: cannot bind the side channel {endpoint}: {exc} "
                "(each engine on a host needs its own port)"
            ) from None
        # the decode side's sockets are plain ones: a NOBLOCK send never waits
        self._dealers: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._peers: dict[tuple[str, int], zmq.Socket[bytes]] = {}
        self._waiting: dict[RemoteKv, int] = {}
        """Requests not read yet, by where their KV lies: heartbeats go on for them."""
        self.received = 0  # messages taken, for tests and diagnosis

    # --- decode side ----------------------------------------------------------------------

    def reading(self, remote: RemoteKv) -> Callable[[], None]:
        """A decode request will read ``remote``: heartbeats keep its lease until the
        returned call, which reports the read (later calls do nothing). Call it when the
        KV has arrived, or when the request ends without it (the prefill engine frees
        its blocks then too, as vLLM's decode notifies it of an aborted request)."""
        self._waiting[remote] = self._waiting.get(remote, 0) + 1
        done = False

        def read() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._waiting.pop(remote) - 1
            if left:
                self._waiting[remote] = left
            self._send(remote.engine_id, remote.host, remote.port, f"{remote.request_id}:1")

        return read

    def _send(self, engine_id: str, host: str, port: int, message: str) -> None:
        """Never raises: the host and port come from a request's ``kv_transfer_params``, and
        this runs in the engine's task (a read is reported from its first token)."""
        key = (host, port)
        sock = self._peers.pop(key, None)
        if sock is None:
            sock = self._dealers.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, _QUEUE)
            try:
                sock.connect(f"tcp://{_ip(host)}:{port}")
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                log.warning("side channel: cannot reach %r:%r (%s); dropped %s", host, port,
                            exc, message[:80])  # fmt: skip
                return
            if len(self._peers) >= _PEERS:
                self._peers.pop(next(iter(self._peers))).close(linger=0)
        self._peers[key] = sock  # the most recently used last
        try:
            frames = [engine_id.encode(errors="replace"), message.encode(errors="replace")]
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # zmq.Again: the queue to an unreachable engine is full
            log.warning("side channel to %r:%r: %s; dropped %s", host, port, exc, message[:80])

    def _heartbeats(self) -> None:
        by_engine: dict[tuple[str, str, int], list[str]] = {}
        for remote in self._waiting:
            key = (remote.engine_id, remote.host, remote.port)
            by_engine.setdefault(key, []).append(remote.request_id)
        for (engine_id, host, port), ids in by_engine.items():
            self._send(engine_id, host, port, HEARTBEAT + ",".join(ids))

    # --- prefill side ---------------------------------------------------------------------

    def take(self, engine_id: bytes, message: bytes) -> None:
        """One message from a decode engine."""
        self.received += 1
        if engine_id.decode(errors="replace") != self.config.engine_id:
            return  # meant for another engine (a restarted one, a misrouted read)
        text = message.decode(errors="replace")
        if text.startswith(HEARTBEAT):
            until = self.clock.now() + self.lease_s * 2 / 3  # vLLM's lease extension
            for request_id in text[len(HEARTBEAT) :].split(","):
                self.engine.renew_held(request_id, until)
            return
        request_id = text.rpartition(":")[0]
        if not self.engine.release_held(request_id):
            self.metrics.reads_after_expiry += 1
            log.warning("side channel: read of %s, which this engine no longer holds", request_id)

    async def run(self) -> None:
        """Takes messages as they come; every sixth of the lease (vLLM's heartbeat period)
        sends the heartbeats and lets expired leases go."""
        period_s = self.clock.to_wall_s(max(self.lease_s / 6, 1e-3))
        loop = asyncio.get_running_loop()
        due = loop.time() + period_s
        try:
            while True:
                try:
                    async with asyncio.timeout_at(due):
                        _, engine_id, message = await self._router.recv_multipart()
                    self.take(engine_id, message)
                    continue
                except TimeoutError:
                    pass
                except ValueError:
                    continue  # not [identity, engine id, message]: not ours
                due = loop.time() + period_s
                self._heartbeats()
                for request_id in self.engine.expire_held():
                    self.metrics.kv_expired += 1
                    log.warning("releasing the expired KV blocks of %s (never read)", request_id)
        finally:
            self.close()

    def close(self) -> None:
        self._dealers.destroy(linger=0)
        self._ctx.destroy(linger=0)


def _ip(host: str) -> str:
    """ZMQ binds an address or an interface, not a host name."""
    return "127.0.0.1" if host == "localhost" else host
