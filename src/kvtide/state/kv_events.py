"""KV events over ZMQ, wire-compatible with vLLM's ``ZmqEventPublisher``.

Publisher side: a PUB socket sends ``(topic, seq, payload)`` per batch; a ROUTER socket answers
a replay request (an 8-byte big-endian start sequence from a REQ/DEALER peer) with every
buffered batch from that sequence on, then an end marker ``(b"", -1, b"")``, as vLLM's does.
Subscriber side: SUB plus a DEALER for replays; batches go through a ``SequencedIngest``, so
gaps are detected, replayed when the publisher still buffers them, and otherwise repaired by
dropping the replica's entries and rebuilding from what comes next.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

import zmq

from kvtide.core.events import KVEvent
from kvtide.routing.ingest import Gap, SequencedIngest
from kvtide.state.kv_translate import to_engine_events
from kvtide.state.kv_wire import (
    Dialect,
    EngineEventBatch,
    KvEventFormatError,
    decode_batch,
    encode_batch,
    seq_bytes,
    seq_from_bytes,
)
from kvtide.types import ReplicaId

END_SEQ = -1


class KvEventPublisher:
    """Publishes batches as an engine would; ``endpoint`` may use port ``*`` (see
    ``bound_endpoint``). Replays are answered by ``serve_replay`` (call it from your loop) or
    by a thread started with ``start_replay_thread``; publishing is thread-safe with either."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:*",
        replay_endpoint: str | None = "tcp://127.0.0.1:*",
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        legacy_arrays: bool = False,
        dialect: Dialect = "vllm",
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self._ctx = context or zmq.Context.instance()
        self._topic = topic.encode()
        self._legacy = legacy_arrays
        self._dialect: Dialect = dialect
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket[bytes] | None = None
        self.bound_replay_endpoint: str | None = None
        try:  # a port still held (a restart right after a close) must not leak the sockets
            self._pub.set_hwm(hwm)
            self._pub.bind(endpoint)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.bind(replay_endpoint)
                self.bound_replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)
            raise
        self.bound_endpoint: str = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._seq = 0
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    @property
    def next_seq(self) -> int:
        return self._seq

    def publish(self, batch: EngineEventBatch, *, drop: bool = False) -> int:
        """Sends one batch and returns its sequence number. ``drop`` numbers and buffers it
        without sending (a lost message, for fault-injection tests)."""
        payload = encode_batch(batch, legacy_arrays=self._legacy, dialect=self._dialect)
        with self._lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
            if not drop:
                self._pub.send_multipart((self._topic, seq_bytes(seq), payload))
        return seq

    def publish_events(self, events: Sequence[KVEvent], ts_s: float, *, drop: bool = False) -> int:
        """kvtide events (e.g. ``KVCache.take_events()``) in the engines' wire format."""
        return self.publish(EngineEventBatch(ts_s, tuple(to_engine_events(events))), drop=drop)

    def serve_replay(self, timeout_s: float = 0.0) -> int:
        """Answers the replay requests waiting (or arriving within ``timeout_s``)."""
        sock = self._replay
        if sock is None:
            return 0
        served = 0
        timeout_ms = int(timeout_s * 1000)
        while sock.poll(timeout_ms):
            frames = sock.recv_multipart()
            timeout_ms = 0
            if len(frames) != 3:
                continue  # not a replay request; vLLM ignores these too
            client, _, start = frames
            first = seq_from_bytes(start)
            with self._lock:
                buffered = [(s, p) for s, p in self._buffer if s >= first]
            for s, payload in buffered:
                sock.send_multipart((client, b"", self._topic, seq_bytes(s), payload))
            sock.send_multipart((client, b"", b"", seq_bytes(END_SEQ), b""))
            served += 1
        return served

    def start_replay_thread(self, poll_s: float = 0.05) -> None:
        def loop() -> None:
            while not self._closing.is_set():
                self.serve_replay(poll_s)

        self._thread = threading.Thread(target=loop, name="kvtide-replay", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)


class KvEventSubscriber:
    """Receives one replica's batches and feeds them, in order, to ``ingest``."""

    def __init__(
        self,
        replica: ReplicaId,
        endpoint: str,
        ingest: SequencedIngest[EngineEventBatch],
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        replay_timeout_s: float = 1.0,
        bind: bool = False,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
    ) -> None:
        self.replica = replica
        self.ingest = ingest
        self.replay_timeout_s = replay_timeout_s
        self._ctx = context or zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        if bind:  # vLLM connects its PUB to non-wildcard endpoints: the subscriber binds
            self._sub.bind(endpoint)
        else:
            self._sub.connect(endpoint)
        self.bound_endpoint: str = self._sub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._replay_endpoint = replay_endpoint
        self._replay: zmq.Socket[bytes] | None = None
        self.num_malformed = 0
        self.num_replays = 0
        self.num_replay_timeouts = 0

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The SUB socket, to wait on beside others (a ``zmq.Poller``); read it through
        ``poll`` only."""
        return self._sub

    def poll(self, timeout_s: float = 0.0, max_messages: int = 10_000) -> int:
        """Takes the batches waiting (waiting up to ``timeout_s`` for the first); returns how
        many arrived. Gaps are repaired before it returns."""
        got = 0
        timeout_ms = int(timeout_s * 1000)
        while got < max_messages and self._sub.poll(timeout_ms):
            timeout_ms = 0
            frames = self._sub.recv_multipart()
            if len(frames) != 3:
                self.num_malformed += 1
                continue
            got += 1
            gap = self._receive(frames[1], frames[2])
            if gap is not None:
                self._repair(gap)
        return got

    def bootstrap(self, from_seq: int = 0) -> bool:
        """Asks the replay socket for every buffered batch from ``from_seq`` on (a subscriber
        that joins late, or that lost the first messages to ZMQ's slow-joiner window), and
        starts the replica over from them. False when the replay went unanswered within
        ``replay_timeout_s`` or stopped short: then what it knew of the replica is kept
        unless an answer had begun, and the caller may ask again later."""
        if self._replay_endpoint is None:
            return True
        # rewound at the first answer: a replay socket that is not there yet (an engine
        # still starting) must not cost what the live stream has given meanwhile
        done = self._replay_from(from_seq, on_answer=lambda: self.ingest.rewind(self.replica))
        if self.ingest.has_gap(self.replica):
            self.ingest.resync(self.replica, self._first_pending(None))
        return done

    def _receive(self, seq_raw: bytes, payload: bytes) -> Gap | None:
        seq = seq_from_bytes(seq_raw)
        try:
            batch = decode_batch(payload)
        except KvEventFormatError:
            self.num_malformed += 1
            batch = EngineEventBatch(0.0, ())  # keep the sequence whole; the content is lost
            return self.ingest.receive(self.replica, seq, batch)
        return self.ingest.receive(self.replica, seq, batch, batch.ts)

    def _repair(self, gap: Gap) -> None:
        if self._replay_endpoint is not None:
            self._replay_from(gap.first_missing)
        if self.ingest.has_gap(self.replica):
            # the publisher no longer buffers what was lost: drop and rebuild from here
            nxt = self.ingest.next_seq(self.replica)
            self.ingest.resync(self.replica, self._first_pending(nxt))

    def _first_pending(self, fallback: int | None) -> int:
        pending = self.ingest.pending_seqs(self.replica)
        return min(pending) if pending else (fallback or 0)

    def _replay_from(self, first: int, on_answer: Callable[[], None] | None = None) -> bool:
        """Replays the publisher's buffered batches from ``first`` on through ``_receive``;
        ``on_answer`` runs before the first of them. False on a timeout."""
        if self._replay is None:
            assert self._replay_endpoint is not None
            self._replay = self._ctx.socket(zmq.DEALER)
            self._replay.connect(self._replay_endpoint)
        sock = self._replay
        self.num_replays += 1
        sock.send_multipart((b"", seq_bytes(first)))
        timeout_ms = int(self.replay_timeout_s * 1000)
        while True:
            if not sock.poll(timeout_ms):
                # no answer: drop this socket so late replies cannot mix into the next replay
                self.num_replay_timeouts += 1
                sock.close(linger=0)
                self._replay = None
                return False
            frames = sock.recv_multipart()
            if len(frames) != 4:
                continue
            if on_answer is not None:
                on_answer()
                on_answer = None
            _, _, seq_raw, payload = frames
            if seq_from_bytes(seq_raw) == END_SEQ:
                return True
            self._receive(seq_raw, payload)

    def close(self) -> None:
        self._sub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
