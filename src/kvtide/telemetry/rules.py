"""The early-warning detector as Prometheus recording and alerting rules, and promtool unit
tests that hold the rules to the detector.

``rules(config)`` writes the same comparisons as ``detector.EarlyWarning`` in PromQL
(``increase(x[fast])`` against ``increase(x[slow] offset fast)``); ``unit_tests(config)`` builds
synthetic counter series, runs the Python detector over them, and states what it fired as the
alerts ``promtool test rules`` must find at the same evaluation times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from kvtide.telemetry.detector import DetectorConfig, EarlyWarning, Sample, Signals
from kvtide.telemetry.metrics import (
    CACHED_BLOCKS,
    CAPACITY_BLOCKS,
    EVICTED_BLOCKS,
    HIT_TOKENS,
    LOOKUPS,
    MISS_TOKENS,
    PROMPT_TOKENS,
    USED_BLOCKS,
)

ALERT_NAMES = {
    "pool_undersized": "KvtideCachePoolUndersized",
    "cold_start": "KvtideCacheColdStart",
    "fragmentation": "KvtideCacheFragmentation",
}
SEVERITY = {"pool_undersized": "warning", "cold_start": "info", "fragmentation": "warning"}
GROUP = "kvtide-early-warning"
DEVICE = '{tier="device"}'


SUMMARIES = {
    "pool_undersized": (
        "KV pool undersized on {{ $labels.%s }}: evicted-then-wanted tokens rose by "
        "{{ $value | humanizePercentage }} of the prefill work over the %s baseline while "
        "eviction velocity rose or blocks stayed cached for fewer prompt tokens, and arrivals "
        "and prompt tokens stayed steady"
    ),
    "cold_start": (
        "Cold start on {{ $labels.%s }}: {{ $value | humanizePercentage }} of missed tokens "
        "over the last %s are first uses; a larger pool would not serve them"
    ),
    "fragmentation": (
        "Fragmentation on {{ $labels.%s }}: {{ $value | humanize }} blocks held outside the "
        "prefix cache, up over the %s baseline, while eviction velocity rose"
    ),
}
VALUE = {
    "pool_undersized": lambda g: g.regret_fast - g.regret_slow,
    "cold_start": lambda g: g.cold_share,
    "fragmentation": lambda g: g.private_fast,
}
"""What each alert expression evaluates to (its first operand): the ``$value`` of its summary."""


def _dur(seconds: float) -> str:
    s = round(seconds)
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"


@dataclass(frozen=True, slots=True)
class _Q:
    """PromQL pieces for one aggregation (``by``: the labels an alert is raised per)."""

    by: tuple[str, ...]
    config: DetectorConfig

    def agg(self, expr: str) -> str:
        return f"sum by ({', '.join(self.by)}) ({expr})" if self.by else f"sum({expr})"

    def inc(self, selector: str, fast: bool) -> str:
        c = self.config
        window = f"[{_dur(c.fast_s)}]" if fast else f"[{_dur(c.slow_s)}] offset {_dur(c.fast_s)}"
        return self.agg(f"increase({selector}{window})")


def _window(c: DetectorConfig, name: str) -> str:
    return _dur(c.fast_s if name == "cold_start" else c.slow_s)


def _evaluation_order(item: tuple[str, str]) -> int:
    """fragmentation first: a group evaluates its rules in order, and an expression that reads
    another alert's ALERTS series sees this evaluation's state of a rule above it, the previous
    one's of a rule below. The detector reads the previous evaluation's (``active`` before the
    update), so fragmentation must come before pool_undersized, which it reads."""
    return 0 if item[0] == "fragmentation" else 1


def rules(config: DetectorConfig | None = None, by: Sequence[str] = ("instance",)) -> str:
    """The rules file (YAML) for ``promtool check rules`` and Prometheus ``rule_files``."""
    c = config or DetectorConfig()
    q = _Q(tuple(by), c)
    regret = f'{MISS_TOKENS.name}{{cause="evicted"}}'
    cold = f'{MISS_TOKENS.name}{{cause="cold"}}'
    prompt = PROMPT_TOKENS.name
    hit = f'{HIT_TOKENS.name}{{tier="device"}}'
    evicted = f'{EVICTED_BLOCKS.name}{{tier="device"}}'
    lookups = f'{LOOKUPS.name}{{tier="device"}}'
    f, s = _dur(c.fast_s), _dur(c.slow_s)
    record = {
        "kvtide:cache_regret_ratio:fast": (
            f"{q.inc(regret, True)} / ({q.inc(prompt, True)} - {q.inc(hit, True)})"
        ),
        "kvtide:cache_regret_ratio:slow": (
            f"{q.inc(regret, False)} / ({q.inc(prompt, False)} - {q.inc(hit, False)})"
        ),
        "kvtide:cache_evictions_per_s:fast": f"{q.inc(evicted, True)} / {c.fast_s:g}",
        "kvtide:cache_evictions_per_s:slow": f"{q.inc(evicted, False)} / {c.slow_s:g}",
        "kvtide:cache_evictions:warm": q.agg(f"increase({evicted}[{f}] offset {s})"),
        "kvtide:cache_evictions:full": q.agg(
            f"increase({evicted}[{f}] offset {_dur(c.slow_s + c.fast_s)})"
        ),
        "kvtide:cache_lookups_per_s:fast": f"{q.inc(lookups, True)} / {c.fast_s:g}",
        "kvtide:cache_lookups_per_s:slow": f"{q.inc(lookups, False)} / {c.slow_s:g}",
        "kvtide:cache_prompt_tokens_per_s:fast": f"{q.inc(prompt, True)} / {c.fast_s:g}",
        "kvtide:cache_prompt_tokens_per_s:slow": f"{q.inc(prompt, False)} / {c.slow_s:g}",
        "kvtide:cache_cold_share:fast": (
            f"{q.inc(cold, True)} / ({q.inc(cold, True)} + {q.inc(regret, True)})"
        ),
        "kvtide:cache_private_blocks": (
            f"{q.agg(USED_BLOCKS.name)} - {q.agg(CACHED_BLOCKS.name + DEVICE)}"
        ),
        "kvtide:cache_capacity_blocks": q.agg(CAPACITY_BLOCKS.name + DEVICE),
        "kvtide:cache_cached_blocks": q.agg(CACHED_BLOCKS.name + DEVICE),
        # Little's law, in traffic: the prompt tokens that arrive while a block stays cached,
        # blocks cached over blocks evicted per prompt token.
        "kvtide:cache_residence_prompt_tokens:fast": (
            f"avg_over_time(kvtide:cache_cached_blocks[{f}]) / (kvtide:cache_evictions_per_s:fast"
            " / kvtide:cache_prompt_tokens_per_s:fast)"
        ),
        "kvtide:cache_residence_prompt_tokens:slow": (
            f"avg_over_time(kvtide:cache_cached_blocks[{s}] offset {f})"
            " / (kvtide:cache_evictions_per_s:slow / kvtide:cache_prompt_tokens_per_s:slow)"
        ),
    }
    steady = (
        "abs(kvtide:cache_lookups_per_s:fast / kvtide:cache_lookups_per_s:slow - 1)"
        f" <= {c.steady_tolerance:g}\nand abs(kvtide:cache_prompt_tokens_per_s:fast / "
        f"kvtide:cache_prompt_tokens_per_s:slow - 1) <= {c.steady_tolerance:g}"
    )
    rising = (
        f"kvtide:cache_evictions_per_s:fast >= {c.evict_factor:g} * "
        "kvtide:cache_evictions_per_s:slow and kvtide:cache_evictions_per_s:fast > 0"
    )
    # Hysteresis: while the alert fired at the previous evaluation (its ALERTS series; a
    # resolved alert's series is marked stale), the lower clearing threshold holds it. The
    # same series keeps fragmentation from starting while the pool is flagged undersized.
    on = f"on ({', '.join(by)}) "
    firing = f'ALERTS{{alertname="{ALERT_NAMES["pool_undersized"]}", alertstate="firing"}}'
    rise = "kvtide:cache_regret_ratio:fast - kvtide:cache_regret_ratio:slow"

    def shorter(drop: float) -> str:
        return (
            "kvtide:cache_residence_prompt_tokens:fast <= "
            f"{1 - drop:g} * kvtide:cache_residence_prompt_tokens:slow"
        )

    private_fast = f"avg_over_time(kvtide:cache_private_blocks[{f}])"
    private_slow = f"avg_over_time(kvtide:cache_private_blocks[{s}] offset {f})"
    fragmented = f'ALERTS{{alertname="{ALERT_NAMES["fragmentation"]}", alertstate="firing"}}'
    grown = (
        f"{private_fast} >= {c.private_factor:g} * {private_slow}\n"
        f"and {private_fast} >= {c.min_private_share:g} * kvtide:cache_capacity_blocks\n"
        f"and {rising}\nand {steady}\nand kvtide:cache_evictions:warm > 0"
    )
    exprs = {
        "pool_undersized": (
            f"(\n  {rise} >= {c.min_regret_rise:g}\n"
            f"  and kvtide:cache_regret_ratio:fast >= {c.regret_factor:g} * "
            "kvtide:cache_regret_ratio:slow\n"
            f"  and {rising}\n  and {steady.replace(chr(10), chr(10) + '  ')}\n"
            "  and kvtide:cache_evictions:warm > 0\n)\nor (\n"
            f"  {rise}\n  and kvtide:cache_regret_ratio:fast > 0\n"
            f"  and {shorter(c.residence_drop)}\n"
            f"  and {steady.replace(chr(10), chr(10) + '  ')}\n"
            "  and kvtide:cache_evictions:full > 0\n"
            f"  unless (\n    {grown.replace(chr(10), chr(10) + '    ')}\n  )\n)\nor (\n"
            f"  {rise} >= {c.clear_regret_rise:g}\n"
            "  and kvtide:cache_evictions:warm > 0\n"
            f"  and {on}{firing}\n)\nor (\n"
            f"  {rise}\n  and kvtide:cache_regret_ratio:fast > 0\n"
            f"  and {shorter(c.clear_residence_drop)}\n"
            "  and kvtide:cache_evictions:warm > 0\n"
            f"  and {on}{firing}\n)"
        ),
        "cold_start": (
            f"kvtide:cache_cold_share:fast >= {c.max_cold_share:g}\n"
            "and kvtide:cache_lookups_per_s:fast > 0\n"
            "unless kvtide:cache_evictions:warm > 0"
        ),
        "fragmentation": (
            f"(\n  {grown.replace(chr(10), chr(10) + '  ')}\n  unless {on}{firing}\n)\n"
            f"or (\n  {grown.replace(chr(10), chr(10) + '  ')}\n  and {on}{fragmented}\n)"
        ),
    }
    who = by[-1] if by else "job"
    doc = {
        "groups": [
            {
                "name": GROUP,
                "interval": _dur(c.interval_s),
                "rules": [{"record": k, "expr": v} for k, v in record.items()]
                + [
                    {
                        "alert": ALERT_NAMES[name],
                        "expr": expr,
                        "for": _dur(c.for_s),
                        "labels": {"severity": SEVERITY[name]},
                        "annotations": {"summary": SUMMARIES[name] % (who, _window(c, name))},
                    }
                    for name, expr in sorted(exprs.items(), key=_evaluation_order)
                ],
            }
        ]
    }
    return "# Written by `kvtide alerts`: the early-warning detector as Prometheus rules.\n" + (
        yaml.safe_dump(doc, sort_keys=False, width=100)
    )


# --- promtool unit tests ---------------------------------------------------------------------


Step = tuple[float, float, float, float, float, float, float]
"""(lookups, prompt, cold, evicted-miss tokens, evicted blocks) increments and (used, cached)
gauges of one evaluation."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """Per-evaluation counter increments and gauges of one synthetic instance."""

    name: str
    steps: int
    step: Callable[[int], Step]
    """i -> the ``Step`` at evaluation i."""


def _scenarios(c: DetectorConfig) -> list[Scenario]:
    per_min = 60.0 / c.interval_s
    warm_at = int(2 * c.slow_s / c.interval_s)  # a long steady stretch before any change

    def undersized(i: int) -> Step:
        regret = 500.0 if i >= warm_at else 100.0  # 2% -> 10% of the prefill work
        evicted = 40.0 if i >= warm_at else 20.0
        return (10.0, 10_000.0, 50.0, regret, evicted, 900.0, 800.0)

    def wavering(i: int) -> Step:
        # The regret ratio climbs fast (0.6 points a minute: the alert fires), then slowly
        # (0.225 a minute: 2.25 points over the baseline, below the firing threshold and above
        # the clearing one): with hysteresis the alert holds through the slow climb.
        late = i - warm_at
        fast = min(max(late, 0), 10 * per_min)
        slow = max(late - 10 * per_min, 0)
        regret = 100.0 + 30.0 / per_min * fast + 11.25 / per_min * slow
        evicted = 20.0 if late < 0 else 40.0
        return (10.0, 10_000.0, 50.0, regret, evicted, 900.0, 800.0)

    def cold_start(i: int) -> Step:
        filling = i < 10 * per_min  # ten minutes of first uses, then a warm steady pool
        cold = 5_000.0 if filling else 50.0
        evicted = 0.0 if filling else 20.0
        return (10.0, 10_000.0, cold, 0.0 if filling else 100.0, evicted, 900.0, 800.0)

    def steady(i: int) -> Step:
        return (10.0, 10_000.0, 50.0, 100.0 + (i % 3) * 10.0, 20.0, 900.0, 800.0)

    def undersized_then_private(i: int) -> Step:
        # The pool turns undersized, then requests queue and their private blocks grow: the
        # consequence raises no fragmentation alert of its own.
        late = i >= warm_at
        regret = 500.0 if late else 100.0
        evicted = 40.0 if late else 20.0
        later = i >= warm_at + 4 * per_min
        return (10.0, 10_000.0, 50.0, regret, evicted, 950.0, 500.0 if later else 800.0)

    def fragmented(i: int) -> Step:
        late = i >= warm_at
        evicted = 30.0 if late else 20.0
        return (10.0, 10_000.0, 50.0, 100.0, evicted, 950.0, 500.0 if late else 800.0)

    def shorter_stay(i: int) -> Step:
        # Blocks leave twice as fast from a pool caching as many (its residence time halves)
        # and a few more evicted blocks are wanted again (2% -> 2.4% of the prefill work,
        # under the regret threshold): the residence signal alone.
        late = i >= warm_at
        regret = 120.0 if late else 100.0
        evicted = 40.0 if late else 20.0
        return (10.0, 10_000.0, 50.0, regret, evicted, 900.0, 800.0)

    def shorter_stay_harmless(i: int) -> Step:
        # The same shorter stay in a pool none of whose evicted blocks is wanted again (its
        # reuses come seconds apart, which any pool serves; its misses are partial blocks, not
        # first uses): nothing fires.
        evicted = 40.0 if i >= warm_at else 20.0
        return (10.0, 10_000.0, 0.0, 0.0, evicted, 900.0, 800.0)

    n = warm_at + int(c.slow_s / c.interval_s)
    return [
        Scenario("undersized", n, undersized),
        Scenario("wavering", n + int(c.slow_s / c.interval_s), wavering),
        Scenario("cold_start", n, cold_start),
        Scenario("steady", n, steady),
        Scenario("fragmented", n, fragmented),
        Scenario("undersized_then_private", n, undersized_then_private),
        Scenario("shorter_stay", n, shorter_stay),
        Scenario("shorter_stay_harmless", n, shorter_stay_harmless),
    ]


def _samples(sc: Scenario, c: DetectorConfig) -> list[Sample]:
    out = []
    totals = [0.0] * 5
    for i in range(sc.steps):
        inc = sc.step(i)
        if i:
            totals = [t + d for t, d in zip(totals, inc[:5], strict=True)]
        lookups, prompt, cold, regret, evicted = totals
        # Half of every prompt hits: the prefill work is the other half.
        out.append(
            Sample(
                i * c.interval_s,
                lookups,
                prompt,
                cold,
                regret,
                evicted,
                inc[5],
                inc[6],
                1e3,
                prompt / 2,
            )
        )
    return out


def unit_tests(
    config: DetectorConfig | None = None, rules_file: str = "rules.yml", by: str = "instance"
) -> str:
    """A ``promtool test rules`` file: per scenario, the alerts the Python detector has
    firing at chosen evaluation times, which Prometheus must have firing too."""
    c = config or DetectorConfig()
    tests: list[dict[str, Any]] = []
    for sc in _scenarios(c):
        samples = _samples(sc, c)
        detector = EarlyWarning(c, log=False)
        firing_at: list[set[str]] = []
        signals: list[Signals | None] = []
        for sample in samples:
            detector.update(sample)
            firing_at.append(set(detector.active))
            has = detector.signals and detector.signals[-1].time_s == sample.time_s
            signals.append(detector.signals[-1] if has else None)
        labels = f'{by}="{sc.name}"' + ("" if by == "job" else ', job="kvtide"')
        series = []
        for metric, label, attr in (
            (LOOKUPS.name, 'tier="device", ', "lookups"),
            (PROMPT_TOKENS.name, "", "prompt_tokens"),
            (HIT_TOKENS.name, 'tier="device", ', "hit_tokens"),
            (MISS_TOKENS.name, 'cause="cold", ', "miss_cold_tokens"),
            (MISS_TOKENS.name, 'cause="evicted", ', "miss_evicted_tokens"),
            (EVICTED_BLOCKS.name, 'tier="device", ', "evicted_blocks"),
            (USED_BLOCKS.name, "", "used_blocks"),
            (CACHED_BLOCKS.name, 'tier="device", ', "cached_blocks"),
            (CAPACITY_BLOCKS.name, 'tier="device", ', "capacity_blocks"),
        ):
            values = " ".join(_num(getattr(s, attr)) for s in samples)
            series.append({"series": f"{metric}{{{label}{labels}}}", "values": values})
        checks = []
        for i in _stable_points(firing_at):
            for name, alert in ALERT_NAMES.items():
                exp = []
                g = signals[i]
                if name in firing_at[i] and g is not None:
                    summary = SUMMARIES[name] % (by, _window(c, name))
                    exp.append(
                        {
                            "exp_labels": {by: sc.name, "severity": SEVERITY[name]},
                            "exp_annotations": {
                                "summary": _render(summary, by, sc.name, VALUE[name](g))
                            },
                        }
                    )
                checks.append(
                    {
                        "eval_time": _dur(i * c.interval_s),
                        "alertname": alert,
                        **({"exp_alerts": exp} if exp else {}),
                    }
                )
        tests.append(
            {
                "name": sc.name,
                "interval": _dur(c.interval_s),
                "input_series": series,
                "alert_rule_test": checks,
            }
        )
    doc = {"rule_files": [rules_file], "evaluation_interval": _dur(c.interval_s), "tests": tests}
    return "# Written by `kvtide alerts --tests`: the Python detector's verdicts on synthetic\n" + (
        "# series, which `promtool test rules` checks the rules against.\n"
        + yaml.safe_dump(doc, sort_keys=False, width=100)
    )


def _stable_points(firing_at: list[set[str]], margin: int = 4) -> list[int]:
    """Evaluations whose firing set equals that of ``margin`` evaluations on each side (away
    from transitions, where sampling alignment may shift an edge by one step); about ten."""
    ok = [
        i
        for i in range(margin, len(firing_at) - margin)
        if all(firing_at[j] == firing_at[i] for j in range(i - margin, i + margin + 1))
    ]
    if len(ok) <= 10:
        return ok
    stride = len(ok) / 10
    picked = sorted({ok[int(k * stride)] for k in range(10)} | _edges(ok, firing_at))
    return picked


def _edges(ok: list[int], firing_at: list[set[str]]) -> set[int]:
    """The first stable point after each change of the firing set (so every state is tested)."""
    out, last = set(), None
    for i in ok:
        if firing_at[i] != last:
            out.add(i)
            last = firing_at[i]
    return out


def _render(template: str, by: str, who: str, value: float) -> str:
    """``template`` as Prometheus renders it (Go's %.4g with SI prefixes / as a percentage)."""
    out = template.replace("{{ $labels." + by + " }}", who)
    out = out.replace("{{ $value | humanizePercentage }}", _go_g(value * 100) + "%")
    return out.replace("{{ $value | humanize }}", _humanize(value))


def _go_g(v: float) -> str:
    return f"{v:.4g}"


def _humanize(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return _go_g(v)
    prefixes, step = ("", "k", "M", "G", "T", "P", "E", "Z", "Y"), 1000.0
    if abs(v) >= 1:
        i = 0
        while abs(v) >= step and i < len(prefixes) - 1:
            v, i = v / step, i + 1
        return _go_g(v) + prefixes[i]
    small = ("", "m", "u", "n", "p", "f", "a", "z", "y")
    i = 0
    while abs(v) < 1 and i < len(small) - 1:
        v, i = v * step, i + 1
    return _go_g(v) + small[i]


def _num(v: float) -> str:
    return str(int(v)) if math.isfinite(v) and v == int(v) else repr(v)
