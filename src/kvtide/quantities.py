"""The one input layer: every number, size, duration, flag and list a user types, checked once.

The same parsers serve the command line (strings) and YAML files (strings, ints, floats, bools,
lists), so a value means the same thing wherever it is written:

- token counts take decimal suffixes ``k`` / ``M`` / ``G`` (10^3, 10^6, 10^9, any case) and
  binary ones ``Ki`` / ``Mi`` / ``Gi`` (2^10, 2^20, 2^30): ``256k`` is 256,000 and ``256Ki``
  262,144; the result must be a whole number;
- floats must be finite (``nan`` and ``inf`` are refused); ints and floats take bounds;
- durations are seconds, plain or with ``ms`` / ``s`` / ``m`` / ``h``;
- a bool must be a real bool (the YAML string ``"no"`` is an error, not a true value);
- comma lists refuse empty items (``cost,,chash``), YAML lists check every item's type.

Every failure is an ``InvalidValue`` (a ``ConfigError``) whose message names the flag or key
and the value: ``--gpu-cache-tokens: more than 1,000,000,000 tokens, got '10G'``.

For argparse, ``flag(parser, **bounds)`` turns a parser into a ``type=`` callable that raises
``argparse.ArgumentTypeError``: argparse then prefixes the flag and exits 2 (``ConfigError``
would escape argparse as a traceback)::

    parser.add_argument("--gpu-cache-tokens", type=flag(tokens, minimum=1))
    tokens(doc["gpu_cache_tokens"], name="sweep.yaml: base.gpu_cache_tokens", minimum=1)
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from kvtide.errors import ConfigError

T = TypeVar("T")

MAX_TOKENS = 10**12
"""The default ceiling of a token count: far above any cache, far below an overflow."""

_TOKEN_SCALES: dict[str, float] = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
}
_TOKEN_RE = re.compile(
    r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmg]i?)?\s*$", re.IGNORECASE
)
_DURATION_SCALES: dict[str, float] = {"": 1.0, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ms|s|m|h)?\s*$")


class InvalidValue(ConfigError):
    """A value that does not parse or lies out of range: ``name: problem, got value``."""

    def __init__(self, name: str, value: object, problem: str) -> None:
        self.name = name
        self.value = value
        self.problem = problem
        super().__init__(f"{name}: {problem}, got {_show(value)}" if name else self.detail)

    @property
    def detail(self) -> str:
        """The message without the name (argparse adds the flag itself)."""
        return f"{self.problem}, got {_show(self.value)}"


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds(
    name: str,
    value: object,
    number: float,
    minimum: float | None,
    maximum: float | None,
    fmt: Callable[[float], str],
) -> None:
    if minimum is not None and number < minimum:
        raise InvalidValue(name, value, f"must be at least {fmt(minimum)}")
    if maximum is not None and number > maximum:
        raise InvalidValue(name, value, f"must be at most {fmt(maximum)}")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def integer(
    value: object, *, name: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    """A whole number: an int (not a bool), an integral float, or its decimal text."""
    number: int
    if isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidValue(name, value, "not a whole number") from None
    elif isinstance(value, float) and not isinstance(value, bool) and value.is_integer():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise InvalidValue(name, value, "not a whole number")
    _bounds(name, value, number, minimum, maximum, lambda x: f"{x:,.0f}")
    return number


def _number(
    value: object,
    name: str,
    what: str,
    suffixes: tuple[re.Pattern[str], dict[str, float]] | None = None,
) -> float:
    """A finite float from a number (not a bool) or its text, with ``suffixes`` (a pattern
    whose groups are the number and the suffix, and each suffix's scale) when given."""
    number: float
    if isinstance(value, str):
        if suffixes is None:
            try:
                number = float(value.strip())
            except ValueError:
                raise InvalidValue(name, value, what) from None
        else:
            pattern, scales = suffixes
            match = pattern.match(value)
            if match is None:
                raise InvalidValue(name, value, what)
            number = float(match.group(1)) * scales[(match.group(2) or "").lower()]
    elif _is_number(value):
        number = float(value)  # type: ignore[arg-type]
    else:
        raise InvalidValue(name, value, what)
    if not math.isfinite(number):
        raise InvalidValue(name, value, "must be finite")
    return number


def real(
    value: object,
    *,
    name: str,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> float:
    """A finite number; ``minimum`` / ``maximum`` are inclusive, ``above`` / ``below``
    exclusive bounds."""
    number = _number(value, name, "not a number")
    _bounds(name, value, number, minimum, maximum, lambda x: f"{x:g}")
    if above is not None and not number > above:
        raise InvalidValue(name, value, f"must be more than {above:g}")
    if below is not None and not number < below:
        raise InvalidValue(name, value, f"must be less than {below:g}")
    return number


def tokens(value: object, *, name: str, minimum: int = 0, maximum: int | None = MAX_TOKENS) -> int:
    """A token count: ``4096``, ``512k`` (512,000), ``1.5M``, ``2G``, ``256Ki`` (262,144)."""
    what = "not a token count (e.g. 4096, 512k, 1.5M, 256Ki)"
    exact = _number(value, name, what, (_TOKEN_RE, _TOKEN_SCALES))
    number = round(exact)
    if abs(exact - number) > 1e-9 * max(1.0, abs(exact)):  # 1.1k is 1100.0000000000002
        raise InvalidValue(name, value, "not a whole number of tokens")
    _bounds(name, value, number, minimum, maximum, _tokens_text)
    return number


def _tokens_text(count: float) -> str:
    return f"{count:,.0f} token{'' if count == 1 else 's'}"


def duration(
    value: object, *, name: str, minimum: float = 0.0, maximum: float | None = None
) -> float:
    """Seconds: ``2.5``, ``500ms``, ``30s``, ``5m``, ``1h``; finite, ``minimum`` 0 by default."""
    what = "not a duration (e.g. 2.5, 500ms, 30s, 5m)"
    seconds = _number(value, name, what, (_DURATION_RE, _DURATION_SCALES))
    _bounds(name, value, seconds, minimum, maximum, lambda x: f"{x:g} s")
    return seconds


def boolean(value: object, *, name: str) -> bool:
    """A real bool: YAML ``true`` / ``false``; the string ``"no"`` is refused, not truthy."""
    if not isinstance(value, bool):
        raise InvalidValue(name, value, "must be true or false")
    return value


def text(value: object, *, name: str, choices: Collection[str] | None = None) -> str:
    """A non-empty string, one of ``choices`` when given."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidValue(name, value, "must be a non-empty string")
    if choices is not None and value not in choices:
        raise InvalidValue(name, value, f"must be one of {', '.join(sorted(choices))}")
    return value


def items(
    value: object,
    parse: Callable[..., T],
    *,
    name: str,
    min_items: int = 1,
    **bounds: Any,
) -> list[T]:
    """A list: comma-separated text (no empty item) or a YAML list, each item run through
    ``parse(item, name=f"{name}[i]", **bounds)``."""
    raw: Sequence[object]
    if isinstance(value, str):
        raw = value.split(",")
        for i, item in enumerate(raw):
            if not item.strip():
                raise InvalidValue(name, value, f"item {i + 1} of the list is empty")
        raw = [item.strip() for item in raw]
    elif isinstance(value, list | tuple):
        raw = value
    else:
        raise InvalidValue(name, value, "not a list")
    if len(raw) < min_items:
        raise InvalidValue(name, value, f"needs at least {min_items} item(s)")
    return [
        parse(item, name=f"{name}[{i}]" if name else "", **bounds) for i, item in enumerate(raw)
    ]


def flag(parse: Callable[..., T], /, **bounds: Any) -> Callable[[str], T]:
    """``parse`` as an argparse ``type=``: a bad value exits 2 with one line naming the flag
    (argparse adds ``argument --flag:``, which the kvtide parser shortens to ``--flag:``)."""

    def convert(value: str) -> T:
        try:
            return parse(value, name="", **bounds)
        except InvalidValue as exc:
            raise argparse.ArgumentTypeError(exc.detail) from None

    convert.__name__ = parse.__name__  # argparse names the type in some messages
    return convert


def argparse_message(message: str) -> str:
    """argparse's error text made one line: ``argument --x: problem`` -> ``--x: problem``."""
    one_line = " ".join(message.split())
    return re.sub(r"^argument ([^:]+): ", r"\1: ", one_line)
