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
from kvtide.costs.specs import model_preset
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


class CostAware(GreedyDual):
    """GDSF with the cost of recomputing a block: ``value = prefill FLOPs of the block given
    its prefix``, normalised to 1 for a first block.

    A block of ``t`` tokens after ``p`` cached ones costs ``2·P·t`` matmul FLOPs plus attention
    over ``t·p + t(t+1)/2`` (query, key) pairs (``ModelSpec`` of ``kvtide.costs.specs``), so deep
    blocks cost more: at ``llama-3-8b`` a 16-token block 32k tokens deep costs about 2.2× a
    first block. All blocks of a cache have one size in bytes, so GDSF's division by size is a
    constant factor and is left out.
    """

    name = "cost"

    def __init__(self, ctx: PolicyContext, model: str = "llama-3-8b") -> None:
        super().__init__(ctx)
        spec = model_preset(model)
        t = ctx.block_tokens
        linear = 2.0 * spec.matmul_params * t
        pair = float(spec.attention_flops_per_pair)
        first = linear + pair * t * (t + 1) / 2
        self.model = model
        self._base = 1.0
        self._per_block = pair * t * t / first

    def block_value(self, depth: int) -> float:
        return self._base + self._per_block * depth
