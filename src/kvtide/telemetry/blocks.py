"""Per-block histograms over every block (not a sample): lifetime and idle time at eviction,
reuse gaps at each hit. The cache's hooks append to flat lists; ``flush`` buckets them in
bulk with numpy, so the hot path pays two list appends per node touched or trimmed."""

from __future__ import annotations

import numpy as np

from kvtide.core.cache import KVCache
from kvtide.core.hashing import BlockHashes
from kvtide.core.node import Node
from kvtide.telemetry.metrics import BLOCK_IDLE, BLOCK_LIFETIME, BLOCK_REUSE_GAP, Metric
from kvtide.telemetry.recorders import Recorder


class BlockTelemetry:
    """Attached to one ``KVCache`` as its store/remove observer and its touch listener.

    Every block of a node shares the node's times (the tree splits nodes on partial use), so a
    node of k blocks is one observation of weight k."""

    __slots__ = ("_clock", "_gap_w", "_gaps", "_idle", "_life", "_removed_w")

    def __init__(self, cache: KVCache) -> None:
        self._clock = cache.clock
        self._life: list[float] = []
        self._idle: list[float] = []
        self._removed_w: list[int] = []
        self._gaps: list[float] = []
        self._gap_w: list[int] = []
        cache.add_observer(self)
        cache.set_touch_listener(self)

    def stored(self, node: Node, hashes: BlockHashes) -> None:
        pass

    def removed(self, node: Node, hashes: BlockHashes) -> None:
        now = self._clock.now()
        self._life.append(now - node.created_s)
        self._idle.append(now - node.last_access_s)
        self._removed_w.append(len(hashes))

    def touched(self, path: list[Node], now_s: float) -> None:
        gaps, weights = self._gaps, self._gap_w
        for node in path:
            gaps.append(now_s - node.last_access_s)
            weights.append(len(node.key) >> 3)

    def flush(self, recorder: Recorder) -> None:
        """Adds everything buffered since the last flush to ``recorder`` and clears it."""
        if self._removed_w:
            weights = np.asarray(self._removed_w, dtype=np.float64)
            _record(recorder, BLOCK_LIFETIME, self._life, weights)
            _record(recorder, BLOCK_IDLE, self._idle, weights)
            self._life, self._idle, self._removed_w = [], [], []
        if self._gap_w:
            _record(recorder, BLOCK_REUSE_GAP, self._gaps, np.asarray(self._gap_w, np.float64))
            self._gaps, self._gap_w = [], []


def _record(recorder: Recorder, metric: Metric, values: list[float], weights: np.ndarray) -> None:
    v = np.asarray(values, dtype=np.float64)
    # Prometheus buckets are "less than or equal": the first bound >= v, as searchsorted left.
    idx = np.searchsorted(np.asarray(metric.buckets), v, side="left")
    counts = np.bincount(idx, weights=weights, minlength=len(metric.buckets) + 1)
    recorder.observe_buckets(metric, counts.astype(np.int64).tolist(), float(v @ weights))
