"""``open_workload``: a spec (``builtin:NAME[:key=val,...]`` or a trace path) to a Workload."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

from kvtide.errors import ConfigError, TraceFormatError
from kvtide.types import Request
from kvtide.workloads import azure, bailian, mooncake, tokens
from kvtide.workloads.builtins import Agent, BuiltinParams, Burst, Chat, Mixed, Rag, Tenants
from kvtide.workloads.workload import Workload

BUILTIN_PREFIX: Final = "builtin"
DEFAULT_BUILTIN: Final = "mixed"
DEFAULT_BLOCK_TOKENS: Final = 16

BUILTINS: Final[dict[str, type[BuiltinParams]]] = {
    "mixed": Mixed,
    "chat": Chat,
    "agent": Agent,
    "rag": Rag,
    "tenants": Tenants,
    "burst": Burst,
}


def open_workload(
    spec: str,
    *,
    block_tokens: int | None = None,
    limit: int | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
) -> Workload:
    """Opens a built-in workload or a trace file; nothing is read beyond the first line yet.

    ``block_tokens`` is the block size of workloads that have no native one (token-level
    traces and built-ins, synthetic Azure prefixes; default 16). Mooncake (512) and Bailian
    (16) keep their native size whatever is asked: their requests say so in
    ``Request.block_tokens`` and a consumer caching at another size re-blocks them.
    ``seed`` drives built-ins and the Azure prefix synthesis; traces ignore it.
    """
    if block_tokens is not None and block_tokens < 1:
        raise ConfigError(f"block size must be at least 1 token, got {block_tokens}")
    size = block_tokens or DEFAULT_BLOCK_TOKENS
    source: Callable[[], Iterator[Request]]
    if spec == BUILTIN_PREFIX or spec.startswith(BUILTIN_PREFIX + ":"):
        name, params = _builtin(spec)
        source = functools.partial(params.generate, seed, size)
        described = {"spec": spec, "seed": seed, **dataclasses.asdict(params)}
        return Workload(name, "builtin", size, source, described, limit, time_scale)
    path = Path(spec)
    kind = detect_format(path)
    described = {"spec": spec}
    if kind == "mooncake":
        source = functools.partial(mooncake.read_mooncake, path)
        size = mooncake.BLOCK_TOKENS
    elif kind == "bailian":
        source = functools.partial(bailian.read_bailian, path)
        size = bailian.BLOCK_TOKENS
    elif kind == "tokens":
        source = functools.partial(tokens.read_tokens, path, block_tokens=size)
    else:
        prefixes = azure.SyntheticPrefixes()
        source = functools.partial(
            azure.read_azure, path, block_tokens=size, seed=seed, prefixes=prefixes
        )
        described |= {"seed": seed, **dataclasses.asdict(prefixes)}
    return Workload(path.stem, kind, size, source, described, limit, time_scale, path)


def detect_format(path: Path) -> str:
    """``mooncake``, ``bailian``, ``tokens`` or ``azure``, from the extension and the keys of
    the first non-blank line."""
    try:
        with path.open("rb") as file:
            first = next((line for line in file if line.strip()), b"")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read workload: {exc.strerror or exc}") from exc
    if not first:
        raise TraceFormatError(str(path), 1, "empty workload file")
    if path.suffix.lower() == ".csv" or all(col.encode() in first for col in azure.COLUMNS):
        return "azure"
    try:
        data = json.loads(first)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise TraceFormatError(str(path), 1, "neither an Azure CSV nor a JSON object a line")
    keys = data.keys()
    for kind, required in (
        ("bailian", bailian.KEYS),
        ("mooncake", mooncake.KEYS),
        ("tokens", tokens.KEYS),
    ):
        if required <= keys:
            return kind
    raise TraceFormatError(
        str(path),
        1,
        "unknown trace format: expected Mooncake keys (timestamp, input_length, output_length, "
        "hash_ids), Bailian keys (chat_id, timestamp, input_length, hash_ids) or token_ids",
    )


def _builtin(spec: str) -> tuple[str, BuiltinParams]:
    _, _, rest = spec.partition(":")
    name, _, options = rest.partition(":")
    name = name or DEFAULT_BUILTIN
    params_type = BUILTINS.get(name)
    if params_type is None:
        raise ConfigError(f"unknown built-in workload '{name}'; choose from {', '.join(BUILTINS)}")
    fields = {field.name: field for field in dataclasses.fields(params_type)}
    values: dict[str, int | float] = {}
    for option in filter(None, options.split(",")):
        key, sep, text = option.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise ConfigError(
                f"bad option '{option}' for builtin:{name}; options are "
                + ", ".join(f"{f}={field.default}" for f, field in fields.items())
            )
        is_int = fields[key].type in (int, "int")
        try:
            values[key] = int(text) if is_int else float(text)
        except ValueError:
            kind = "an integer" if is_int else "a number"
            raise ConfigError(
                f"builtin:{name}: option {key} must be {kind}, got '{text}'"
            ) from None
    return name, params_type(**values)
