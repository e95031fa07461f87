"""Numbers written for people: token counts, seconds, plurals, signed changes and the dash of a
metric that does not apply. Shared by the command tables and the HTML report."""

from __future__ import annotations

import math

DASH = "—"
"""What a table prints for a metric that does not apply (TPOT of a run that decodes nothing)."""

_SUFFIXES = ((10**9, "G"), (10**6, "M"), (10**3, "k"))


def applies(value: float | None) -> bool:
    """Whether ``value`` was measured: ``None`` and NaN mean the metric does not apply."""
    return value is not None and not math.isnan(value)


def number(value: float | None, spec: str) -> str:
    """``format(value, spec)``, or the dash where the metric does not apply."""
    return format(value, spec) if applies(value) else DASH


def count(value: float) -> str:
    """A count in few characters: ``1M``, ``1.5M``, ``64k``, ``262,144``, ``6.85M``.

    A count that is a round number of thousands, millions or billions (to one decimal) is
    written exactly with its suffix; other counts below a million keep every digit; larger
    ones keep three significant digits.
    """
    if not math.isfinite(value) or value != int(value):
        return f"{value:,.3g}"
    n = int(value)
    for scale, suffix in _SUFFIXES:
        if abs(n) >= scale and n % (scale // 10) == 0:
            return f"{n / scale:.1f}".removesuffix(".0") + suffix
    if abs(n) < 10**6:
        return f"{n:,}"
    scale, suffix = next((s, x) for s, x in _SUFFIXES if abs(n) >= s)
    return f"{n / scale:.3g}{suffix}"


def tokens(value: int) -> str:
    """``1_000_000 -> "1M tokens"``, ``1 -> "1 token"``."""
    return f"{count(value)} {'token' if value == 1 else 'tokens'}"


def seconds(value: float) -> str:
    """A duration with its unit: ``"36.2 s"``, ``"12 ms"``, ``"2.5 min"``, ``"1.3 h"``."""
    if not applies(value):
        return DASH
    if value == 0:
        return "0 s"
    magnitude = abs(value)
    if magnitude < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if magnitude < 1:
        return f"{value * 1e3:.3g} ms"
    if magnitude < 120:
        return f"{value:.3g} s"
    if magnitude < 7200:
        return f"{value / 60:.3g} min"
    return f"{value / 3600:.3g} h"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``plural(1, "request") -> "1 request"``, ``plural(2937, "request") -> "2,937 requests"``."""
    return f"{n:,} {word if n == 1 else many or word + 's'}"


def signed(value: float, spec: str) -> str:
    """``value`` with its sign, ``+1.8`` or ``-1.8``; a value that rounds to zero is written
    without one (``0.0``, never ``-0.0`` or ``+0.0``)."""
    text = format(value, "+" + spec)
    unsigned = text[1:]
    if not any(ch in "123456789" for ch in unsigned):
        return unsigned
    return text


def points(change: float, *, against: str) -> str:
    """A change in percentage points in words whose direction agrees with the sign:
    ``points(-1.84, against="x") -> "1.8 points below x"``."""
    rounded = round(change, 1)
    if rounded == 0:
        return f"level with {against}"
    unit = "point" if abs(rounded) == 1 else "points"
    return f"{abs(rounded):.1f} {unit} {'above' if rounded > 0 else 'below'} {against}"
