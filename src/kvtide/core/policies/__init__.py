"""The eviction policies beyond LRU, registered by name in ``kvtide.core.eviction.POLICIES``.

Imported by ``kvtide.core``'s package init, so any import of the core registers them.
"""

from kvtide.core.eviction import register_policy
from kvtide.core.policies.greedy_dual import LFUDA, CostAware, GreedyDual
from kvtide.core.policies.s3fifo import S3FIFO
from kvtide.core.policies.slru import SLRU
from kvtide.core.policies.tide import Tide

register_policy(LFUDA.name, LFUDA)
register_policy(S3FIFO.name, S3FIFO)
register_policy(SLRU.name, SLRU)
register_policy(CostAware.name, CostAware)
register_policy(Tide.name, Tide)

__all__ = ["LFUDA", "S3FIFO", "SLRU", "CostAware", "GreedyDual", "Tide"]
