"""ReplicaState: the router's view of one engine replica, kept current by the caller.

The simulator and the gateway call ``dispatch`` when they send a request, ``prefill_done`` when
its first token comes back, and ``complete`` when it ends; a gateway that scrapes engine metrics
may overwrite the fields instead. Policies only read them.
"""

from __future__ import annotations

from kvtide.types import ReplicaId


class ReplicaState:
    """Load and health of one replica.

    ``num_requests``: requests dispatched and not completed (the load that bounded-load hashing
    caps). ``queued_prefill_tokens``: prompt tokens still to prefill (uncached part as predicted
    at dispatch). ``decode_sequences`` / ``decode_tokens``: running sequences and their context
    tokens (the KV they keep busy). ``capacity_blocks``: the device KV (0: unknown);
    ``kv_usage``: the engine's own reported fraction in use (a scraped
    ``vllm:kv_cache_usage_perc``); where it is not set, utilisation is estimated from the
    decode tokens against the capacity.
    """

    __slots__ = (
        "block_tokens",
        "capacity_blocks",
        "decode_sequences",
        "decode_tokens",
        "healthy",
        "kv_usage",
        "num_requests",
        "queued_prefill_tokens",
        "replica_id",
    )

    def __init__(
        self,
        replica_id: ReplicaId | str,
        *,
        capacity_blocks: int = 0,
        block_tokens: int = 16,
        healthy: bool = True,
    ) -> None:
        self.replica_id = ReplicaId(str(replica_id))
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self.healthy = healthy
        self.num_requests = 0
        self.queued_prefill_tokens = 0
        self.decode_sequences = 0
        self.decode_tokens = 0
        self.kv_usage: float | None = None

    @property
    def kv_utilization(self) -> float:
        """Fraction of KV capacity in use, in [0, 1]; 0 when the capacity is unknown."""
        if self.kv_usage is not None:
            return min(max(self.kv_usage, 0.0), 1.0)
        if self.capacity_blocks <= 0:
            return 0.0
        return min(self.decode_blocks / self.capacity_blocks, 1.0)

    @property
    def decode_blocks(self) -> int:
        return -(-self.decode_tokens // self.block_tokens)

    def dispatch(self, prefill_tokens: int) -> None:
        """A request was sent here with ``prefill_tokens`` tokens left to compute."""
        self.num_requests += 1
        self.queued_prefill_tokens += prefill_tokens

    def prefill_done(self, prefill_tokens: int, context_tokens: int) -> None:
        """The request's prefill (``prefill_tokens`` as given to ``dispatch``) finished; it
        now decodes with ``context_tokens`` tokens of context."""
        self.queued_prefill_tokens = max(self.queued_prefill_tokens - prefill_tokens, 0)
        self.decode_sequences += 1
        self.decode_tokens += context_tokens

    def decode_progress(self, tokens: int = 1) -> None:
        self.decode_tokens += tokens

    def complete(self, context_tokens: int) -> None:
        """A decoding request ended; ``context_tokens`` is its final context length."""
        self.num_requests = max(self.num_requests - 1, 0)
        self.decode_sequences = max(self.decode_sequences - 1, 0)
        self.decode_tokens = max(self.decode_tokens - context_tokens, 0)

    def cancel(self, prefill_tokens: int) -> None:
        """A request ended (failed, aborted) before its prefill finished."""
        self.num_requests = max(self.num_requests - 1, 0)
        self.queued_prefill_tokens = max(self.queued_prefill_tokens - prefill_tokens, 0)

    def __repr__(self) -> str:
        return (
            f"ReplicaState({self.replica_id!r}, requests={self.num_requests}, "
            f"prefill={self.queued_prefill_tokens}, decode={self.decode_sequences})"
        )
