"""The tier study: how large a host tier (and a disk tier) a fleet needs, and what an admission
filter on host writes costs, answered by running the fleet at each size.

Each design sets the host tier per replica as a multiple of its GPU cache, with or without the
"seen-twice" filter, and optionally a disk tier under it. The fleet, the workload, the router
and the engines are the base scenario's; only the tiers change, so the differences between rows
are the tiers' doing. Host and disk writes are reported in blocks and in GB/s of KV (the
model's bytes per token), the bandwidth those writes would take from PCIe or the drive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtide.display import points
from kvtide.errors import ConfigError
from kvtide.sim.scenario import RunResult, Scenario, cost_model

DEFAULT_HOST_MULTIPLES: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0, 8.0)
DEFAULT_DISK_MULTIPLE = 32.0


@dataclass(frozen=True, slots=True)
class TierDesign:
    host_multiple: float
    """Host tier tokens per GPU cache token (0: no host tier)."""
    admission: str = "none"
    disk_multiple: float = 0.0

    @property
    def label(self) -> str:
        if not self.host_multiple and not self.disk_multiple:
            return "GPU only"
        parts = []
        if self.host_multiple:
            parts.append(f"host {self.host_multiple:g}×")
        if self.disk_multiple:
            parts.append(f"disk {self.disk_multiple:g}×")
        filtered = self.admission != "none" and self.host_multiple
        return " + ".join(parts) + (f" ({self.admission})" if filtered else "")


def tier_designs(
    host_multiples: Sequence[float] = DEFAULT_HOST_MULTIPLES,
    disk_multiple: float = DEFAULT_DISK_MULTIPLE,
) -> list[TierDesign]:
    """Every host size unfiltered and filtered, then the largest host over a disk tier, both
    ways (the disk catching what the filter keeps out of host memory)."""
    if any(m < 0 for m in host_multiples) or disk_multiple < 0:
        raise ConfigError("tier sizes must be >= 0 multiples of the GPU cache")
    sizes = sorted(set(host_multiples))
    if not sizes:
        raise ConfigError("the tier study needs at least one host size")
    out = [TierDesign(m) for m in sizes]
    out += [TierDesign(m, "seen-twice") for m in sizes if m > 0]
    if disk_multiple > 0:
        largest = sizes[-1]
        out.append(TierDesign(largest, "none", disk_multiple))
        if largest > 0:
            out.append(TierDesign(largest, "seen-twice", disk_multiple))
    return out


def tier_scenarios(base: Scenario, designs: Sequence[TierDesign]) -> list[Scenario]:
    gpu = base.gpu_cache_tokens
    return [
        base.with_(
            host_cache_tokens=int(d.host_multiple * gpu),
            host_admission=d.admission if d.host_multiple else "none",
            disk_cache_tokens=int(d.disk_multiple * gpu),
        )
        for d in designs
    ]


@dataclass(frozen=True, slots=True)
class TierRow:
    design: str
    host_tokens: int
    disk_tokens: int
    admission: str
    hit_ratio: float
    hit_ratio_by_tier: dict[str, float]
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    host_writes_blocks: int
    disk_writes_blocks: int
    host_write_gb_per_s: float
    """KV written into host memory per simulated second, all replicas together."""
    disk_write_gb_per_s: float
    filter_hit_loss_points: float | None
    """Hit ratio lost to the filter, against the same tiers unfiltered."""
    filter_write_cut: float | None
    """Fraction of host writes the filter saved, against the same tiers unfiltered."""


def tier_rows(
    designs: Sequence[TierDesign], scenarios: Sequence[Scenario], results: Sequence[RunResult]
) -> list[TierRow]:
    """One row per design; the filter's costs are against the same tiers without it."""
    unfiltered: dict[tuple[float, float], RunResult] = {}
    for d, r in zip(designs, results, strict=True):
        if d.admission == "none":
            unfiltered[(d.host_multiple, d.disk_multiple)] = r
    rows = []
    for d, scenario, r in zip(designs, scenarios, results, strict=True):
        s = r.summary
        block_bytes = cost_model(scenario).kv_bytes(int(r.diagnostics["block_tokens"]))
        span = max(r.simulated_s, 1e-9)
        host_writes = int(r.diagnostics.get("host_writes_blocks", 0))
        disk_writes = int(r.diagnostics.get("disk_writes_blocks", 0))
        ref = unfiltered.get((d.host_multiple, d.disk_multiple))
        loss = cut = None
        if ref is not None and ref is not r:
            loss = 100 * (ref.summary.hit_ratio - s.hit_ratio)
            ref_writes = int(ref.diagnostics.get("host_writes_blocks", 0))
            cut = 1 - host_writes / ref_writes if ref_writes else None
        rows.append(
            TierRow(
                design=d.label,
                host_tokens=scenario.host_cache_tokens,
                disk_tokens=scenario.disk_cache_tokens,
                admission=scenario.host_admission,
                hit_ratio=s.hit_ratio,
                hit_ratio_by_tier=dict(s.hit_ratio_by_tier),
                ttft_mean_s=s.ttft_s.mean,
                ttft_p50_s=s.ttft_s.p50,
                ttft_p99_s=s.ttft_s.p99,
                host_writes_blocks=host_writes,
                disk_writes_blocks=disk_writes,
                host_write_gb_per_s=host_writes * block_bytes / span / 1e9,
                disk_write_gb_per_s=disk_writes * block_bytes / span / 1e9,
                filter_hit_loss_points=loss,
                filter_write_cut=cut,
            )
        )
    return rows


def tier_findings(rows: Sequence[TierRow]) -> list[str]:
    """Plain sentences computed from the rows: what the host tier buys, the smallest size
    within a point of the best, and what the filter trades."""
    plain = [r for r in rows if r.admission == "none" and not r.disk_tokens]
    out: list[str] = []
    if len(plain) >= 2:
        first, best = plain[0], max(plain, key=lambda r: r.hit_ratio)
        enough = next(r for r in plain if r.hit_ratio >= best.hit_ratio - 0.01)
        out.append(
            f"{enough.design} reaches {enough.hit_ratio:.1%} hits, within a point of the best "
            f"host size ({best.design}: {best.hit_ratio:.1%}; {first.design}: "
            f"{first.hit_ratio:.1%}); TTFT p50 {first.ttft_p50_s:.3f} s -> "
            f"{enough.ttft_p50_s:.3f} s, p99 {first.ttft_p99_s:.3f} s -> {enough.ttft_p99_s:.3f} s"
        )
    for r in rows:
        if r.filter_write_cut is not None and r.filter_hit_loss_points is not None:
            cut = r.filter_write_cut
            writes = f"{cut:.0%} fewer" if cut >= 0 else f"{-cut:.0%} more"
            hits = points(-r.filter_hit_loss_points, against="the same tiers unfiltered")
            out.append(
                f"{r.design}: {writes} host writes ({r.host_write_gb_per_s:.2f} GB/s left), "
                f"hit ratio {hits}; TTFT p99 {r.ttft_p99_s:.3f} s"
            )
    return out
