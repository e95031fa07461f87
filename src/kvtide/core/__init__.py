"""The prefix-cache core: synchronous, pure, no I/O; everything else stands on it."""

# Registers the eviction policies beyond LRU by name (they import kvtide.core.eviction).
from kvtide.core import policies as policies
