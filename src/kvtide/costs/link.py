"""A transfer link whose bandwidth the transfers in flight share equally (processor sharing).

The link reads its ``Clock`` lazily, so the simulator only advances its ``ManualClock``. Two
equal transfers started together each take twice as long as one alone. Fixed per-transfer
costs (overheads, chunk latencies) belong to the cost model; the link models only sharing.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from kvtide.clock import Clock
from kvtide.errors import ConfigError, UsageError


@dataclass(slots=True, eq=False)
class Transfer:
    """One transfer on a link. ``done_s`` is set when the link sees it finish."""

    num_bytes: float
    start_s: float
    finish_tag: float = field(repr=False)
    done_s: float | None = None


class Link:
    """Processor sharing in virtual time: the service each active transfer has received grows
    at ``bytes_per_s / n`` while n transfers are active, and a transfer finishes when that
    service reaches its size. Finish tags sit in a heap, so each operation costs O(log n).
    """

    def __init__(self, bytes_per_s: float, clock: Clock, *, name: str = "link") -> None:
        if not math.isfinite(bytes_per_s) or bytes_per_s <= 0:
            raise ConfigError(f"link {name!r} needs a positive finite bandwidth, got {bytes_per_s}")
        self.name = name
        self.bytes_per_s = bytes_per_s
        self.clock = clock
        self._now = clock.now()
        self._virtual = 0.0  # service (bytes) each continuously active transfer has received
        self._seq = 0
        self._active: list[tuple[float, int, Transfer]] = []
        self._completed: list[Transfer] = []
        self.num_transfers_total = 0
        self.bytes_total = 0.0

    # --- state ---------------------------------------------------------------------------

    def _advance(self) -> None:
        now = self.clock.now()
        if now < self._now:
            raise UsageError("the link's clock went backwards")
        t, v, active, rate = self._now, self._virtual, self._active, self.bytes_per_s
        while active:
            tag = active[0][0]
            finish_s = t + (tag - v) * len(active) / rate
            if finish_s > now:
                v += (now - t) * rate / len(active)
                break
            t, v = finish_s, tag
            while active and active[0][0] <= tag:
                transfer = heapq.heappop(active)[2]
                transfer.done_s = t
                self._completed.append(transfer)
        self._now, self._virtual = now, v

    @property
    def num_active(self) -> int:
        """Transfers in flight now."""
        self._advance()
        return len(self._active)

    @property
    def load(self) -> float:
        """The share of the bandwidth a transfer started now would lose to those in flight:
        n / (n + 1) with n active (the cost model's ``link_load``)."""
        n = self.num_active
        return n / (n + 1)

    # --- transfers -----------------------------------------------------------------------

    def submit(self, num_bytes: float) -> Transfer:
        """Starts a transfer of ``num_bytes`` now."""
        if num_bytes < 0 or not math.isfinite(num_bytes):
            raise UsageError(f"num_bytes must be finite and >= 0, got {num_bytes}")
        self._advance()
        transfer = Transfer(num_bytes, self._now, self._virtual + num_bytes)
        self.num_transfers_total += 1
        self.bytes_total += num_bytes
        if num_bytes == 0:
            transfer.done_s = self._now
            self._completed.append(transfer)
            return transfer
        self._seq += 1
        heapq.heappush(self._active, (transfer.finish_tag, self._seq, transfer))
        return transfer

    def completion_s(self, transfer: Transfer) -> float:
        """When ``transfer`` finishes if no other transfer starts before then."""
        self._advance()
        if transfer.done_s is not None:
            return transfer.done_s
        t, v = self._now, self._virtual
        # Transfers ahead of it leave one by one; everyone shares until then.
        for n, tag in enumerate(sorted(e[0] for e in self._active)):
            t += (tag - v) * (len(self._active) - n) / self.bytes_per_s
            v = tag
            if tag >= transfer.finish_tag:
                return t
        raise UsageError("transfer does not belong to this link")

    def estimate_s(self, num_bytes: float) -> float:
        """Seconds a transfer of ``num_bytes`` started now would take, if no other starts."""
        if num_bytes <= 0:
            return 0.0
        self._advance()
        t, v, tags = 0.0, self._virtual, sorted(e[0] for e in self._active)
        mine = v + num_bytes
        for n, tag in enumerate(tags):
            if tag >= mine:
                break
            t += (tag - v) * (len(tags) + 1 - n) / self.bytes_per_s
            v = tag
        else:
            n = len(tags)
        return t + (mine - v) * (len(tags) + 1 - n) / self.bytes_per_s

    def next_completion_s(self) -> float | None:
        """When the next transfer in flight finishes (None if idle): an event for a simulator."""
        self._advance()
        if not self._active:
            return None
        tag = self._active[0][0]
        return self._now + (tag - self._virtual) * len(self._active) / self.bytes_per_s

    def take_completed(self) -> list[Transfer]:
        """Drains the transfers finished by now, in finishing order."""
        self._advance()
        done, self._completed = self._completed, []
        return done
