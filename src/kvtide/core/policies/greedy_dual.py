"""GreedyDual policies with dynamic aging: LFU-DA and a recompute-cost GDSF (``cost``).

A node's priority is ``H = L + freq × value`` where ``freq`` counts the requests that used it,
``value`` is what one of its blocks is worth, and ``L`` is an inflation value raised to the
priority of each evicted block, so long-unused blocks age out whatever their past frequency
(GreedyDual-Size, Cao and Irani, USITS'97; LFU-DA and GDSF, Arlitt et al., "Evaluating content
management techniques for Web proxy caches", ACM SIGMETRICS PER 27(4), 2000).
``L`` is the inflation at the node's last use; ties go to the least recent, then the deepest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtide.core.eviction import KeyedPolicy, PolicyContext
from kvtide.core.node import Node
from kvtide.errors import ConfigError
from kvtide.types import BlockHash


class GreedyDual(KeyedPolicy):
    """Smallest ``H`` of a leaf's tail block goes first; ``block_value`` defines the policy."""

    name = "greedy-dual"

    def __init__(self, ctx: PolicyContext) -> None:
        super().__init__(ctx)
        self.inflation = 0.0

    def block_value(self, depth: int) -> float:
        """The worth of the block at ``depth`` (blocks before it), per unit of frequency."""
        return 1.0

    def priority_of(self, node: Node, depth: int) -> float:
        base = node.policy_data
        assert isinstance(base, float)
        return base + (node.hits + 1) * self.block_value(depth)

    def key(self, node: Node) -> Any:
        return (self.priority_of(node, node.end_depth - 1), node.last_access, -node.end_depth)

    def on_insert(self, node: Node) -> None:
        node.policy_data = self.inflation
        super().on_insert(node)

    def on_access(self, node: Node) -> None:
        node.policy_data = self.inflation
        super().on_access(node)

    def on_split(self, head: Node, tail: Node) -> None:
        head.policy_data = tail.policy_data

    def on_evict(self, node: Node, num_blocks: int, hashes: Sequence[BlockHash]) -> None:
        # The deepest evicted block had the largest H of the run (values grow with depth).
        evicted = self.priority_of(node, node.end_depth + num_blocks - 1)
        if evicted > self.inflation:
            self.inflation = evicted
        super().on_evict(node, num_blocks, hashes)


class LFUDA(GreedyDual):
    """LFU with dynamic aging: every block is worth 1, so ``H = L + freq``."""

    name = "lfu"


# Prefill FLOPs per token at position p of a model of hidden size d: about b·d² for the linear
# layers and a·p·d for attention, a = 4, b = 22 (Mooncake, Qin et al., FAST'25, §2.2).
ATTENTION_COEF = 4.0
LINEAR_COEF = 22.0


class CostAware(GreedyDual):
    """GDSF with the cost of recomputing a block: ``value = (b·d + a·p) / (b·d)``.

    ``p`` is the position of the block's middle token, so a block 32k tokens deep costs about
    2.4× a first block at d = 4096. All blocks of a cache have the same size in bytes, so the
    division by size in GDSF is a constant factor and is left out; the value is normalised to
    1 for a block at position 0.
    """

    name = "cost"

    def __init__(self, ctx: PolicyContext, hidden_size: int = 4096) -> None:
        if hidden_size <= 0:
            raise ConfigError(f"cost hidden_size must be positive, got {hidden_size}")
        super().__init__(ctx)
        self.hidden_size = hidden_size
        self._per_block = ATTENTION_COEF * ctx.block_tokens / (LINEAR_COEF * hidden_size)
        self._offset = ATTENTION_COEF * ctx.block_tokens / 2 / (LINEAR_COEF * hidden_size)

    def block_value(self, depth: int) -> float:
        return 1.0 + self._offset + self._per_block * depth
