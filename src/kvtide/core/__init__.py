"""The prefix-cache core: synchronous, pure, no I/O; everything else stands on it."""
