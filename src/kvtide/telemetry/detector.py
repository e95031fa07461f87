"""Early warning: flags an undersized KV pool before tail latency degrades, and tells it apart
from a cold start and from fragmentation. Each alert says why, with the numbers.

The detector compares a fast window (the last ``fast_s``) with a baseline (the ``slow_s``
before it) over cumulative counters, exactly as the Prometheus rules of ``rules.py`` do with
``increase(x[fast])`` and ``increase(x[slow] offset fast)``:

* **pool_undersized**: the share of the prefill work (prompt tokens not found on the device)
  spent on blocks that were evicted and wanted again (the *regret ratio*) rose by at least
  ``min_regret_rise`` over its baseline (and by ``regret_factor`` relative to it); eviction
  velocity did not fall (``evict_factor``: in a full pool evictions follow insertions, i.e.
  misses, so a few points of hit ratio move it by only a few percent); arrivals stayed within
  ``steady_tolerance`` of their baseline; and the pool was already evicting when the baseline
  began (a fleet still filling cannot trip it). Cold misses do not move the regret ratio, so a
  workload of mostly first uses (compulsory misses) does not trip it either. It also enters
  on the pool's *residence* (below): the prompt tokens that arrive while a block stays cached
  fell by ``residence_drop`` of the baseline's, while some evicted blocks are wanted again
  (a regret ratio above zero), arrivals were steady, the pool was already evicting before the
  baseline began (``is_full``) and the private blocks did not grow (that is fragmentation).
* **cold_start**: the pool has not been evicting for a whole baseline yet and most missed
  tokens are first uses (``max_cold_share``): misses a bigger pool would not fix; reported so
  that an operator does not mistake a warming fleet for a small one.
* **fragmentation**: eviction velocity did not fall with steady arrivals while the blocks held
  outside the prefix cache (partial last blocks, generated tokens, slots reserved ahead: used
  minus cached) grew by ``private_factor`` to at least ``min_private_share`` of the pool; it
  does not start while pool_undersized fires (a pool too small queues requests, and their
  reserved prompt room grows the private blocks as a consequence).

pool_undersized has hysteresis: once firing it holds while the regret ratio stays
``clear_regret_rise`` over its baseline or the residence stays ``clear_residence_drop`` under
its baseline's (and the pool warm), so one episode is one alert.

Why the regret ratio is over the prefill work, and ``min_regret_rise`` = 3 % of it: a regretted
token is recomputed, so the rise is the fraction by which the prefill work grew; with a high hit
ratio a small loss of hits is a large growth of work (hits 80 % -> 78 % is 10 % more work).
Queueing delay grows as rho / (1 - rho), so its logarithm moves by (d rho / rho) / (1 - rho): at
a utilisation of 0.7, 3 % more work lengthens the wait by 10 %, half of a 20 % degradation,
which leaves the margin to act. The windows follow the workload's time scales: the fast one
holds enough requests for a stable ratio, the baseline several reuse-gap medians (about 2 minutes on
production conversation traces).

Why the residence: the regret ratio counts the reuses a pool has already lost, a few requests
in a window, so on a slowly shrinking pool it rises late, and a rise against a trailing
baseline lags it further. What decides which reuses the pool loses next is how long it keeps
a block. By Little's law, the blocks cached over the blocks evicted per unit of time is the
mean time a block stays; measured per prompt token instead of per second (the blocks cached
over the blocks evicted per prompt token) it is the traffic that passes while a block stays,
which is what an LRU pool's hits depend on: a reuse after more traffic than that misses. Per
token it does not move when the same workload just arrives faster (twice the traffic evicts
twice the blocks per second, as many per token); it falls when the pool loses room (a smaller
pool, blocks taken by generation) or the working set grows per token of traffic. It averages
over every block evicted in the window (thousands), not over the few requests hurt, so it is
steady when the workload is: over ten steady simulated hours (Mooncake, four built-ins, two
more seeds of three of them; docs/telemetry.md) its 5-minute value stayed within 19 % of its
baseline's once the pool was full (its 150 s value within 24 %, under 0.8 at 7 of 690 ticks, none
with the other conditions met), while a pool losing 5 % every 90 s took it to 0.55-0.75 of
its baseline within minutes. ``residence_drop`` = 0.2 sits between. It needs some
evicted blocks wanted again (a pool whose reuses are all seconds apart can lose room without
harm) and a pool full for the whole baseline: right after a pool first evicts, the baseline's
evictions are diluted by minutes without any, and its residence is inflated.

Why a 150 s fast window (not 300 s): a change shows in a window's mean only in proportion to
the part of the window after it, so the detection delay grows with the window, while the
tail degrades 4-10 minutes after a pool starts losing room (docs/telemetry.md); the window only
has to hold enough traffic for its ratios to be stable, and the residence averages over the
thousands of blocks evicted in it. Replayed over the same simulated hours (Mooncake, four
built-ins, three seeds of three), 150 s added no false alarm to the steady runs and warned
earlier on every workload that degrades but one seed of chat; it was chosen on seed 0 and held
on seeds 1 and 2 (docs/telemetry.md has the table, 300 s beside it).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from kvtide.telemetry.metrics import (
    ALERT_ACTIVE,
    ALERT_FIRED,
    ALERTS,
    CACHED_BLOCKS,
    CAPACITY_BLOCKS,
    EVICTED_BLOCKS,
    HIT_TOKENS,
    LOOKUPS,
    MISS_TOKENS,
    PROMPT_TOKENS,
    USED_BLOCKS,
)
from kvtide.telemetry.recorders import MemoryRecorder, NullRecorder, Recorder

LOG = logging.getLogger("kvtide.alerts")


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    fast_s: float = 150.0
    """The fast window: short, because a rise shows in it after about half its length (see
    the module docstring, "Why a 150 s fast window")."""
    slow_s: float = 900.0
    interval_s: float = 30.0
    """How often the rules are evaluated (the detector should be updated as often)."""
    for_s: float = 60.0
    """How long a condition must hold before its alert fires (Prometheus ``for``)."""
    min_regret_rise: float = 0.03
    regret_factor: float = 1.2
    evict_factor: float = 1.0
    steady_tolerance: float = 0.25
    """Arrivals and prompt tokens per second must stay within this share of their baseline."""
    clear_regret_rise: float = 0.015
    """Hysteresis: once firing, pool_undersized holds while the regret ratio stays this far
    above its baseline (and warm), though it fell below ``min_regret_rise``."""
    residence_drop: float = 0.2
    """pool_undersized also enters when the residence time fell by this share of its
    baseline's (with the regret ratio rising, arrivals steady, the pool full)."""
    clear_residence_drop: float = 0.1
    """Hysteresis of the residence signal: half of ``residence_drop``."""
    max_cold_share: float = 0.5
    private_factor: float = 1.25
    min_private_share: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.interval_s <= self.fast_s < self.slow_s:
            raise ValueError("windows must satisfy 0 < interval <= fast < slow")
        if not 0 <= self.clear_regret_rise <= self.min_regret_rise:
            raise ValueError("clear_regret_rise must be in [0, min_regret_rise]")
        if not 0 <= self.clear_residence_drop <= self.residence_drop < 1:
            raise ValueError("residence drops must satisfy 0 <= clear <= drop < 1")


@dataclass(frozen=True, slots=True)
class Sample:
    """Cumulative counters (and two gauges) of one instance or a whole fleet at ``time_s``."""

    time_s: float
    lookups: float
    prompt_tokens: float
    miss_cold_tokens: float
    miss_evicted_tokens: float
    evicted_blocks: float
    used_blocks: float
    cached_blocks: float
    capacity_blocks: float
    hit_tokens: float = 0.0
    """Prompt tokens found on the device: prompt minus hit tokens is the prefill work."""

    @property
    def work_tokens(self) -> float:
        return self.prompt_tokens - self.hit_tokens

    @property
    def private_blocks(self) -> float:
        """Pool blocks in use outside the prefix cache."""
        return self.used_blocks - self.cached_blocks

    @classmethod
    def of(cls, time_s: float, recorders: Iterable[MemoryRecorder]) -> Sample:
        """Sums device counters over ``recorders`` (one per replica, or one per fleet)."""
        v = [0.0] * 9
        for r in recorders:
            v[8] += r.value(HIT_TOKENS, ("device",))
            v[0] += r.value(LOOKUPS, ("device",))
            v[1] += r.value(PROMPT_TOKENS)
            v[2] += r.value(MISS_TOKENS, ("cold",))
            v[3] += r.value(MISS_TOKENS, ("evicted",))
            v[4] += r.value(EVICTED_BLOCKS, ("device",))
            v[5] += r.value(USED_BLOCKS)
            v[6] += r.value(CACHED_BLOCKS, ("device",))
            v[7] += r.value(CAPACITY_BLOCKS, ("device",))
        return cls(time_s, *v)


@dataclass(frozen=True, slots=True)
class Signals:
    """The detector's inputs at one evaluation (rates per second, ratios in [0, 1])."""

    time_s: float
    regret_fast: float
    regret_slow: float
    evict_fast: float
    evict_slow: float
    arrivals_fast: float
    arrivals_slow: float
    prompt_fast: float
    """Prompt tokens per second over the fast window (the baseline's: ``prompt_slow``)."""
    prompt_slow: float
    cold_share: float
    is_warm: bool
    private_fast: float
    private_slow: float
    capacity_blocks: float
    residence_fast: float = math.nan
    """Prompt tokens that arrive while a cached block stays in the pool over the fast window
    (Little's law: mean cached blocks over evicted blocks per prompt token); +inf when
    nothing was evicted."""
    residence_slow: float = math.nan
    is_full: bool = False
    """The pool evicted in the fast window just before the baseline began: the baseline's
    residence time is that of a full pool."""

    @classmethod
    def empty(cls, time_s: float = 0.0) -> Signals:
        """No evaluation at ``time_s``: every value NaN."""
        nan = math.nan
        return cls(time_s, nan, nan, nan, nan, nan, nan, nan, nan, nan, False, nan, nan, nan)

    @property
    def residence_ratio(self) -> float:
        """Residence time over its baseline's (below 1: blocks leave sooner)."""
        return _ratio(self.residence_fast, self.residence_slow)


@dataclass(frozen=True, slots=True)
class Alert:
    name: str
    severity: str
    time_s: float
    """When it fired (the condition held for ``for_s`` by then)."""
    reason: str
    values: dict[str, float] = field(default_factory=dict)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan


def _div(num: float, den: float) -> float:
    """``num / den`` as PromQL divides (IEEE 754): x/0 is +-inf, 0/0 and NaN are NaN."""
    if den == 0:
        return math.nan if num == 0 or math.isnan(num) else math.copysign(math.inf, num)
    return num / den


def _within(fast: float, slow: float, tolerance: float) -> bool:
    return abs(_ratio(fast, slow) - 1) <= tolerance


def _tokens(n: float) -> str:
    return f"{n:,.0f}" if math.isfinite(n) else "n/a"


def _points(change: float) -> str:
    """A change of a share in signed percentage points ("+0.5 points", "-0.2 points")."""
    return f"{change * 100:+.1f} points" if math.isfinite(change) else "n/a"


def _pct(share: float, digits: int = 1) -> str:
    """A share as a percentage; "n/a" when it is undefined (no tokens in its window yet),
    not Python's "nan%"."""
    return f"{share:.{digits}%}" if math.isfinite(share) else "n/a"


class EarlyWarning:
    """Evaluated at each ``update`` with a fresh cumulative ``Sample``; returns the alerts
    that fired at that evaluation (and logs them, and sets the alert metrics on
    ``recorder``). ``active`` holds the alerts firing now, ``history`` every alert fired."""

    def __init__(
        self,
        config: DetectorConfig | None = None,
        recorder: Recorder | None = None,
        *,
        log: bool = True,
    ) -> None:
        self.config = config or DetectorConfig()
        self.log = log
        self.recorder: Recorder = recorder or NullRecorder()
        self._samples: deque[Sample] = deque()
        self._times: deque[float] = deque()
        self._pending: dict[str, float] = {}  # alert -> first evaluation its condition held
        self.active: dict[str, Alert] = {}
        self.history: list[Alert] = []
        self.signals: list[Signals] = []

    # --- windows over the sample history -------------------------------------------------

    def _at(self, t: float, attr: str) -> float | None:
        """The counter ``attr`` at time ``t``, linear between samples; None before history."""
        times = self._times
        if not times or t < times[0] - 1e-9:
            return None
        i = bisect.bisect_left(times, t)
        if i < len(times) and abs(times[i] - t) < 1e-9:
            return float(getattr(self._samples[i], attr))
        if i >= len(times):
            return float(getattr(self._samples[-1], attr))
        a, b = self._samples[i - 1], self._samples[i]
        f = (t - a.time_s) / (b.time_s - a.time_s)
        va, vb = float(getattr(a, attr)), float(getattr(b, attr))
        return va + f * (vb - va)

    def _increase(
        self, attr: str, end: float, span: float, *, partial: bool = False
    ) -> float | None:
        """The counter's gain over ``(end - span, end]``; with ``partial`` a window reaching
        before the history starts at the first sample (Prometheus, too, computes a range over
        the samples it has: its extrapolation scales every series of a window alike, so
        ratios and signs agree)."""
        start = end - span
        if partial and self._times and start < self._times[0]:
            start = self._times[0]
        hi, lo = self._at(end, attr), self._at(start, attr)
        if hi is None or lo is None:
            return None
        return max(hi - lo, 0.0)

    def _mean(self, attr: str, end: float, span: float) -> float:
        # Both ends included, as Prometheus 2's range selectors (avg_over_time) do.
        lo = end - span - 1e-9
        vals = [float(getattr(s, attr)) for s in self._samples if lo <= s.time_s <= end + 1e-9]
        return sum(vals) / len(vals) if vals else math.nan

    def _signals(self, now: float) -> Signals | None:
        """None until the fast window is covered; baseline values are NaN (and every rule
        that needs them false) until the baseline is covered too."""
        c = self.config
        f, s = c.fast_s, c.slow_s
        base_end = now - f
        nan = math.nan

        def inc(attr: str, end: float, span: float, partial: bool = False) -> float:
            v = self._increase(attr, end, span, partial=partial)
            return nan if v is None else v

        if len(self._times) < 2:
            return None
        prompt = inc("work_tokens", now, f)
        cold_fast = inc("miss_cold_tokens", now, f, True)
        regret_part = inc("miss_evicted_tokens", now, f, True)
        regret = inc("miss_evicted_tokens", now, f)
        cold = cold_fast
        warm = inc("evicted_blocks", now - s, f)
        full = inc("evicted_blocks", now - s - f, f)
        evict_fast = inc("evicted_blocks", now, f) / f
        evict_slow = inc("evicted_blocks", base_end, s) / s
        prompt_fast = inc("prompt_tokens", now, f, True) / f
        prompt_slow = inc("prompt_tokens", base_end, s) / s
        return Signals(
            time_s=now,
            regret_fast=_ratio(regret, prompt),
            regret_slow=_ratio(
                inc("miss_evicted_tokens", base_end, s), inc("work_tokens", base_end, s)
            ),
            evict_fast=evict_fast,
            evict_slow=evict_slow,
            arrivals_fast=inc("lookups", now, f, True) / f,
            arrivals_slow=inc("lookups", base_end, s) / s,
            prompt_fast=prompt_fast,
            prompt_slow=prompt_slow,
            cold_share=_ratio(cold, cold + regret_part),
            is_warm=warm > 0,
            private_fast=self._mean("private_blocks", now, f),
            private_slow=self._mean("private_blocks", base_end, s),
            capacity_blocks=self._samples[-1].capacity_blocks,
            residence_fast=_div(self._mean("cached_blocks", now, f), _div(evict_fast, prompt_fast)),
            residence_slow=_div(
                self._mean("cached_blocks", base_end, s), _div(evict_slow, prompt_slow)
            ),
            is_full=full > 0,
        )

    # --- the rules ------------------------------------------------------------------------

    def conditions(
        self, g: Signals, firing: Collection[str] = frozenset()
    ) -> dict[str, str | None]:
        """Per alert, the reason (with numbers) when its condition holds now, else None.
        ``firing``: the alerts firing at the previous evaluation (pool_undersized holds on
        its lower, clearing threshold while it is firing)."""
        c = self.config
        steady = _within(g.arrivals_fast, g.arrivals_slow, c.steady_tolerance) and _within(
            g.prompt_fast, g.prompt_slow, c.steady_tolerance
        )
        evict_rising = g.evict_fast >= c.evict_factor * g.evict_slow and g.evict_fast > 0
        arrivals = (
            f"arrivals steady at {g.arrivals_fast:.3g}/s (baseline {g.arrivals_slow:.3g}/s), "
            f"prompt tokens at {g.prompt_fast:,.0f}/s (baseline {g.prompt_slow:,.0f}/s)"
        )
        out: dict[str, str | None] = dict.fromkeys(ALERTS)
        rise = g.regret_fast - g.regret_slow
        enters = (
            g.is_warm
            and steady
            and evict_rising
            and rise >= c.min_regret_rise
            and g.regret_fast >= c.regret_factor * g.regret_slow
        )
        private_share = _ratio(g.private_fast, g.capacity_blocks)
        grown = (
            g.is_warm
            and steady
            and evict_rising
            and g.private_fast >= c.private_factor * g.private_slow
            and private_share >= c.min_private_share
        )
        # Blocks leave sooner when private blocks take the pool's room too: that is
        # fragmentation's diagnosis (below), not a short pool's.
        shorter = (
            g.is_full
            and steady
            and g.regret_fast > 0
            and g.residence_fast <= (1 - c.residence_drop) * g.residence_slow
            and not grown
        )
        still = rise >= c.clear_regret_rise or (
            g.regret_fast > 0
            and g.residence_fast <= (1 - c.clear_residence_drop) * g.residence_slow
        )
        holds = "pool_undersized" in firing and g.is_warm and still
        if enters or shorter or holds:
            out["pool_undersized"] = (
                f"pool undersized: evicted-then-wanted tokens are {_pct(g.regret_fast)} of the "
                f"prefill work over the last {c.fast_s:.0f}s, {'down' if rise < 0 else 'up'} "
                f"from {_pct(g.regret_slow)} over the {c.slow_s:.0f}s before "
                f"({_points(rise)}); a cached block stays while "
                f"{_tokens(g.residence_fast)} prompt tokens arrive, "
                f"{_pct(1 - g.residence_ratio, 0)} fewer than over the baseline "
                f"({_tokens(g.residence_slow)}); eviction velocity "
                f"{g.evict_fast:,.1f} blocks/s, baseline {g.evict_slow:,.1f}; {arrivals}; "
                f"{_pct(g.cold_share, 0)} of missed tokens are first uses"
            )
        if not g.is_warm and g.arrivals_fast > 0 and g.cold_share >= c.max_cold_share:
            out["cold_start"] = (
                f"cold start: {_pct(g.cold_share, 0)} of missed tokens over the last "
                f"{c.fast_s:.0f}s are first uses, which a larger pool would not serve; "
                f"evicted-then-wanted tokens are {_pct(g.regret_fast)} of the prefill work"
            )
        # A pool already flagged undersized queues requests, whose reserved prompt room then
        # grows the private blocks too: that is its consequence, not a second diagnosis. So
        # fragmentation does not start while pool_undersized fires (once firing, it holds).
        if grown and ("pool_undersized" not in firing or "fragmentation" in firing):
            out["fragmentation"] = (
                f"fragmentation: blocks held outside the prefix cache average "
                f"{g.private_fast:,.0f} ({_pct(private_share, 0)} of the pool) over the last "
                f"{c.fast_s:.0f}s, up from {g.private_slow:,.0f}; eviction velocity "
                f"{g.evict_fast:,.1f} blocks/s, baseline {g.evict_slow:,.1f}; {arrivals}"
            )
        return out

    def update(self, sample: Sample) -> list[Alert]:
        """Adds ``sample`` (times must increase) and evaluates every rule at its time."""
        if self._times and sample.time_s <= self._times[-1]:
            raise ValueError("samples must come in increasing time")
        self._samples.append(sample)
        self._times.append(sample.time_s)
        keep = self.config.fast_s + 2 * self.config.slow_s + self.config.interval_s
        while self._times and self._times[0] < sample.time_s - keep:
            self._samples.popleft()
            self._times.popleft()
        g = self._signals(sample.time_s)
        if g is None:
            return []
        self.signals.append(g)
        fired = []
        for name, reason in self.conditions(g, frozenset(self.active)).items():
            labels = (name,)
            if reason is None:
                self._pending.pop(name, None)
                if self.active.pop(name, None) is not None:
                    self.recorder.set(ALERT_ACTIVE, 0.0, labels)
                continue
            since = self._pending.setdefault(name, g.time_s)
            if name in self.active or g.time_s - since < self.config.for_s - 1e-9:
                continue
            alert = Alert(name, _SEVERITY[name], g.time_s, reason, _values(g))
            self.active[name] = alert
            self.history.append(alert)
            fired.append(alert)
            self.recorder.set(ALERT_ACTIVE, 1.0, labels)
            self.recorder.inc(ALERT_FIRED, 1.0, labels)
            if self.log:
                LOG.log(logging.INFO if alert.severity == "info" else logging.WARNING, reason)
        return fired

    def first(self, name: str) -> Alert | None:
        return next((a for a in self.history if a.name == name), None)


_SEVERITY = {"pool_undersized": "warning", "cold_start": "info", "fragmentation": "warning"}


def _values(g: Signals) -> dict[str, float]:
    return {
        "regret_fast": g.regret_fast,
        "regret_slow": g.regret_slow,
        "evict_fast": g.evict_fast,
        "evict_slow": g.evict_slow,
        "arrivals_fast": g.arrivals_fast,
        "arrivals_slow": g.arrivals_slow,
        "prompt_fast": g.prompt_fast,
        "prompt_slow": g.prompt_slow,
        "cold_share": g.cold_share,
        "private_fast": g.private_fast,
        "private_slow": g.private_slow,
        "residence_fast": g.residence_fast,
        "residence_slow": g.residence_slow,
    }


def run_detector(samples: Sequence[Sample], config: DetectorConfig | None = None) -> EarlyWarning:
    """A detector fed ``samples`` in order (offline evaluation, tests and reports)."""
    detector = EarlyWarning(config, log=False)
    for sample in samples:
        detector.update(sample)
    return detector
