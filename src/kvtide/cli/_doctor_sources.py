"""What `kvtide doctor` reads, each turned into a `telemetry.diagnosis.Observed`.

- samples of the kvtide_* families (a scrape's text exposition, or a Prometheus server's
  instant query ``{__name__=~"kvtide_.*"}``), summed over instances;
- a KV event log: JSON lines, each a vLLM ``KVEventBatch`` as an array
  ``[ts, [events...], rank?]`` or ``{"seq": N, "batch": [...]}`` (``seq`` gaps are lost
  batches); decoded by ``state.kv_wire`` so its rules are the subscriber's;
- a simulator JSON (``kvtide simulate --json``);
- a gateway's access log (``kvtide serve --access-log``): per request, the tokens the router
  predicted cached and those the engine served from cache, by replica, route and tenant.

A malformed input raises ``ConfigError`` naming the line or key.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from prometheus_client.parser import text_string_to_metric_families

from kvtide.errors import ConfigError
from kvtide.state.kv_wire import (
    EngineAllBlocksCleared,
    EngineBlockRemoved,
    EngineBlockStored,
    KvEventFormatError,
    decode_batch,
)
from kvtide.telemetry import metrics as m
from kvtide.telemetry.diagnosis import Observed

Sample = tuple[str, Mapping[str, str], float]
"""(name as exposed, e.g. ``kvtide_cache_lookups_total``; labels; value)."""


def from_samples(source: str, samples: Iterable[Sample]) -> Observed:
    """Sums counters and gauges over instances (``instance``/``job`` labels dropped). The
    instances counted are the caches (those exporting kvtide_cache_*): a gateway exporting
    the router's families beside them is not one."""
    o = Observed(source)
    instances: set[tuple[str, str]] = set()
    replication: list[float] = []
    seen = False
    for name, labels, value in samples:
        if not name.startswith("kvtide_"):
            continue
        seen = True
        if name.startswith("kvtide_cache_"):
            instances.add((labels.get("job", ""), labels.get("instance", "")))
        if name == m.PROMPT_TOKENS.name:
            o.prompt_tokens += value
        elif name == m.HIT_TOKENS.name:
            o.hit_tokens += value
        elif name == m.MISS_TOKENS.name:
            cause = labels.get("cause", "")
            o.miss_tokens[cause] = o.miss_tokens.get(cause, 0.0) + value
        elif name == m.EVICTED_BLOCKS.name and labels.get("tier", "device") == "device":
            o.evicted_blocks += value
        elif name == m.CAPACITY_BLOCKS.name and labels.get("tier") == "device":
            o.capacity_blocks += value
        elif name == m.CACHED_BLOCKS.name and labels.get("tier") == "device":
            o.cached_blocks += value
        elif name == m.EVENTS_LOST.name:
            o.events_lost += value
        elif name == m.EVICTED_QUEUED_TOKENS.name:
            o.evicted_queued_tokens += value
        elif name == m.REPLICATION.name:
            replication.append(value)
        elif name == m.ALERT_ACTIVE.name and value > 0:
            alert = labels.get("alert", "?")
            if alert not in o.alerts:
                o.alerts.append(alert)
    if not seen:
        raise ConfigError(f"{source}: no kvtide_* metrics in it")
    o.instances = max(1, len(instances))
    if replication:
        o.replication = max(replication)
    return o


def parse_exposition(text: str, source: str) -> list[Sample]:
    """Samples of a Prometheus text exposition (counters as their ``_total`` samples)."""
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ConfigError(f"{source}: not a Prometheus text exposition: {exc}") from exc
    out: list[Sample] = []
    for fam in families:
        for s in fam.samples:
            if s.name.endswith(("_created", "_bucket", "_count", "_sum")):
                continue
            out.append((s.name, dict(s.labels), float(s.value)))
    return out


def parse_query_result(doc: object, source: str) -> list[Sample]:
    """The body of Prometheus's ``/api/v1/query`` for an instant vector."""
    try:
        assert isinstance(doc, dict) and doc.get("status") == "success"
        result = doc["data"]["result"]
        out: list[Sample] = []
        for row in result:
            labels = dict(row["metric"])
            name = labels.pop("__name__")
            out.append((name, labels, float(row["value"][1])))
        return out
    except (AssertionError, KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"{source}: not a successful instant-vector query result") from exc


def _json_lines(path: Path) -> Iterator[tuple[str, Any]]:
    """Each non-blank line's place (``path:N``, for errors) and its JSON value."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not JSON: {exc.msg}") from exc


def from_event_log(path: Path) -> Observed:
    """Blocks stored, removed and stored again; duplicates while live; seq gaps."""
    o = Observed(str(path))
    live: set[int] = set()
    ever: set[int] = set()
    stores = restores = duplicates = removes = 0
    peak = 0
    block_tokens = 0
    last_seq: int | None = None
    lost = 0
    for where, row in _json_lines(path):
        if isinstance(row, dict):
            seq, row = row.get("seq"), row.get("batch")
            if seq is not None:
                if not isinstance(seq, int):
                    raise ConfigError(f"{where}: seq must be an integer")
                if last_seq is not None and seq > last_seq + 1:
                    lost += seq - last_seq - 1
                last_seq = seq
        try:
            batch = decode_batch(msgpack.packb(row))
        except (KvEventFormatError, TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: not a KV event batch: {exc}") from exc
        for e in batch.events:
            if isinstance(e, EngineBlockStored):
                block_tokens = block_tokens or e.block_size
                for h in e.block_hashes:
                    key = hash(h) if not isinstance(h, int) else h
                    stores += 1
                    if key in live:
                        duplicates += 1
                    elif key in ever:
                        restores += 1
                    live.add(key)
                    ever.add(key)
                peak = max(peak, len(live))
            elif isinstance(e, EngineBlockRemoved):
                for h in e.block_hashes:
                    key = hash(h) if not isinstance(h, int) else h
                    if key in live:
                        live.discard(key)
                        removes += 1
            elif isinstance(e, EngineAllBlocksCleared):
                removes += len(live)
                live.clear()
    if stores == 0:
        raise ConfigError(f"{path}: no BlockStored events in it")
    bt = block_tokens or 1
    # Every stored block was computed; an infinite cache computes each distinct one once.
    o.prompt_tokens = float(stores * bt)
    o.hit_tokens = 0.0
    o.miss_tokens = {"cold": float(len(ever) * bt), "evicted": float(restores * bt)}
    o.evicted_blocks = float(removes)
    o.cached_blocks = float(len(live))
    o.capacity_blocks = float(peak)
    o.events_lost = float(lost)
    o.notes.append(
        "an event log shows computed blocks only: ratios are of computed (stored) blocks, "
        f"{stores:,} stores of {len(ever):,} distinct blocks, {restores:,} stored again after "
        f"removal, {duplicates:,} stored while already live; capacity = the peak live blocks"
    )
    return o


def from_simulation(path: Path) -> tuple[Observed, dict[str, Any]]:
    """The best run of a ``kvtide simulate --json`` file, with every router's hit ratio;
    also the document's workload section, so the caller can replay the workload."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: not a simulator JSON: {exc}") from exc
    try:
        runs = doc["runs"]
        workload = doc["workload"]
        setup = workload["setup"]
        prompt = float(workload["prompt_tokens_mean"]) * float(workload["requests"])
        ratios = {str(r["router"]): float(r["hit_ratio"]) for r in runs}
        first = runs[0]
        gpu = int(setup["gpu_cache_tokens"])
        replicas = int(setup["replicas"])
        bt = int(workload["block_tokens"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"{path}: missing or bad key in a simulator JSON: {exc}") from exc
    # The diagnosis is of the first run (the router the operator runs); the others show what
    # routing alone would change.
    o = Observed(f"{path} (router {first['router']})")
    o.prompt_tokens = prompt
    o.hit_tokens = float(first["hit_ratio"]) * prompt
    o.capacity_blocks = float(gpu // bt * replicas)
    o.instances = replicas
    o.routing_hit_ratios = ratios
    o.notes.append("a simulator JSON has no miss causes: the limits come from the replay")
    return o, workload


_LOG_FIELDS: dict[str, tuple[type, ...]] = {
    "status": (int,),
    "prompt_tokens": (int, type(None)),
    "tokenized": (bool, type(None)),
    "engine_prompt_tokens": (int, type(None)),
    "predicted_cached_tokens": (int, type(None)),
    "cached_tokens": (int, type(None)),
    "replica": (str, type(None)),
    "route": (str, type(None)),
    "tenant": (str, type(None)),
    "ttft_ms": (int, float, type(None)),
    "failures": (list,),
}


@dataclass(slots=True)
class _Tally:
    requests: int = 0
    prompt: int = 0
    cached: int = 0

    def add(self, prompt: int, cached: int) -> None:
        self.requests += 1
        self.prompt += prompt
        self.cached += cached

    def line(self, name: str, total_requests: int) -> str:
        ratio = f"{self.cached / self.prompt:.1%}" if self.prompt else "n/a"
        return f"{name} {self.requests / max(total_requests, 1):.0%} of requests, {ratio} cached"


def from_access_log(path: Path) -> Observed:
    """Served requests with the engine's ``cached_tokens`` are the hit ratio; each one's
    shortfall against the router's prediction, the predicted hits not served; notes per
    replica (requests and hits: a skew), route and tenant, retries, errors, TTFT."""
    o = Observed(str(path), miss_causes=False)
    replicas: dict[str, _Tally] = {}
    routes: dict[str, _Tally] = {}
    tenants: dict[str, _Tally] = {}
    statuses: dict[int, int] = {}
    failures: dict[str, int] = {}
    ttfts: list[float] = []
    total = unreported = retried = 0
    predicted_sum = unpredicted = 0
    for where, row in _json_lines(path):
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: not an access log line (a JSON object)")
        for key, kinds in _LOG_FIELDS.items():
            value = row.get(key)
            if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
                raise ConfigError(f"{where}: {key}: expected {kinds[0].__name__}, got {value!r}")
        total += 1
        status = row["status"]
        statuses[status] = statuses.get(status, 0) + 1
        for kind in row["failures"]:
            failures[str(kind)] = failures.get(str(kind), 0) + 1
        retried += bool(row["failures"])
        if status != 200 or row["prompt_tokens"] is None:
            continue
        if row["cached_tokens"] is None:
            unreported += 1
            continue
        prompt, cached = row["prompt_tokens"], row["cached_tokens"]
        engine_prompt = row.get("engine_prompt_tokens")
        if row.get("tokenized") and engine_prompt is not None:
            o.identity_checked += 1
            if engine_prompt != prompt:
                o.identity_mismatches += 1
                o.identity_mismatched_tokens += engine_prompt
        predicted = row["predicted_cached_tokens"] or 0
        o.prompt_tokens += prompt
        o.hit_tokens += cached
        o.unserved_predicted_tokens += max(predicted - cached, 0)
        predicted_sum += predicted
        unpredicted += max(cached - predicted, 0)
        replicas.setdefault(row["replica"] or "?", _Tally()).add(prompt, cached)
        routes.setdefault(row["route"] or "?", _Tally()).add(prompt, cached)
        tenants.setdefault(row["tenant"] or "?", _Tally()).add(prompt, cached)
        if row["ttft_ms"] is not None:
            ttfts.append(float(row["ttft_ms"]))
    if total == 0:
        raise ConfigError(f"{path}: no access log lines in it")
    o.instances = max(len(replicas), 1)
    served = sum(t.requests for t in replicas.values())
    o.notes.append(
        f"{total:,} requests: "
        + ", ".join(f"{count:,} x {status}" for status, count in sorted(statuses.items()))
        + (f"; {retried:,} retried ({_counts(failures)})" if retried else "")
    )
    if o.prompt_tokens:
        o.notes.append(
            f"the router predicted {predicted_sum:,} cached tokens, the engines served "
            f"{predicted_sum - o.unserved_predicted_tokens:,.0f} of them, and "
            f"{unpredicted:,} it had not predicted"
        )
    if unreported:
        o.notes.append(
            f"{unreported:,} answered requests without the engine's cached_tokens are left out "
            "of the ratios (vLLM reports them only with --enable-prompt-tokens-details)"
        )
    for title, tallies in (("replicas", replicas), ("routes", routes), ("tenants", tenants)):
        if tallies:
            ordered = sorted(tallies.items(), key=lambda kv: -kv[1].requests)[:8]
            o.notes.append(f"{title}: " + "; ".join(t.line(k, served) for k, t in ordered))
    if ttfts:
        ttfts.sort()
        p50, p99 = ttfts[len(ttfts) // 2], ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]
        o.notes.append(
            f"TTFT of {len(ttfts):,} streamed answers: p50 {p50:,.0f} ms, p99 {p99:,.0f} ms"
        )
    return o


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
