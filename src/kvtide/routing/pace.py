"""PrefillPace: how much longer the engines take to prefill than the router's TTFT model says.

The routing policies compare replicas in the TTFT model's seconds, and a constant error in the
model (another GPU or model size than it assumes, engines slowed by their decode batches, an
emulated engine's ``--speedup``) scales every replica's cost alike and changes no choice. A
deadline does not compare replicas: it is added to a wall-clock arrival (``cost``'s
``deadline_k``), so it must be in the engines' own seconds. The router learns the factor from
what it already sees: a request dispatched to a replica with no prefill of this router's
queued there has its predicted TTFT = its own predicted prefill (``RouteDecision.ttft_s``),
and its first token comes back after the engine's real one. The pace is the ratio of the
sums of observed to predicted over the recent such requests (exponentially decayed, so a
fleet that slows down under load is followed), the long prefills weighing the most: a fully
cached prompt's few milliseconds are mostly the HTTP round trip and the engine's iteration,
which would make the ratio of each request noisy.
"""

from __future__ import annotations

import math

from kvtide.errors import ConfigError


class PrefillPace:
    """``factor``: observed over predicted prefill seconds, 1.0 until ``min_samples`` first
    tokens were observed. ``decay`` is each sample's weight in the running sums (1/32: about
    the last 32 samples count)."""

    __slots__ = ("_observed", "_predicted", "decay", "min_samples", "samples")

    def __init__(self, decay: float = 1.0 / 32.0, min_samples: int = 4) -> None:
        if not 0.0 < decay <= 1.0:
            raise ConfigError(f"PrefillPace decay must be in (0, 1], got {decay!r}")
        if min_samples < 1:
            raise ConfigError(f"PrefillPace min_samples must be >= 1, got {min_samples!r}")
        self.decay = decay
        self.min_samples = min_samples
        self.samples = 0
        self._observed = 0.0
        self._predicted = 0.0

    def observe(self, predicted_s: float, observed_s: float) -> None:
        """One first token: the model predicted ``predicted_s`` of prefill, it took
        ``observed_s`` from dispatch. Non-finite or non-positive values are ignored."""
        if not (0.0 < predicted_s < math.inf and 0.0 <= observed_s < math.inf):
            return
        keep = 1.0 - self.decay
        self._observed = self._observed * keep + observed_s
        self._predicted = self._predicted * keep + predicted_s
        self.samples += 1

    @property
    def factor(self) -> float:
        if self.samples < self.min_samples or self._predicted <= 0.0:
            return 1.0
        return self._observed / self._predicted
