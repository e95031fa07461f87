"""Gateway settings: a YAML file (``--config``) with the common ones also as flags.

Every key is checked: an unknown key or a wrong type is one ``ConfigError`` naming it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from kvtide.asgi.runner import KEEP_ALIVE_S
from kvtide.errors import ConfigError


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One engine: its base URL, the model it serves (learned from ``/v1/models`` when not
    given), its KV-event endpoints (vLLM's ZMQ PUB and replay sockets) and its role under
    disaggregated prefill (``ROLES``: an engine run with vLLM's ``NixlConnector``)."""

    url: str
    model: str | None = None
    events: str | None = None
    replay: str | None = None
    role: str = "both"

    @property
    def replica_id(self) -> str:
        """host:port: the same id in every gateway replica (Redis index fields use it)."""
        return urlsplit(self.url).netloc

    @classmethod
    def parse(cls, text: str, name: str = "--replica") -> ReplicaSpec:
        """``URL[=model][,events=tcp://...][,replay=tcp://...][,role=prefill|decode]``; a
        ConfigError naming ``name`` (the flag, the YAML key or the admin field it came from)
        when it is not that."""
        head, *items = text.split(",")
        url, _, model = head.partition("=")
        _check_url(url, f"{name} {text!r}")
        opts: dict[str, str] = {}
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or key not in ("events", "replay", "role"):
                raise ConfigError(
                    f"{name} {text!r}: unknown option {item!r} (events, replay, role)"
                )
            if key == "role":
                check_replica_option(key, value, f"{name} {text!r}: {key}")
            else:
                _check_endpoint(value, f"{name} {text!r}: {key}")
            opts[key] = value
        return cls(
            url.rstrip("/"),
            model or None,
            opts.get("events"),
            opts.get("replay"),
            opts.get("role", "both"),
        )

    def with_options(self, options: Mapping[str, Any], name: str) -> ReplicaSpec:
        """This spec with the ``model``, ``events``, ``replay`` that ``options`` (a YAML entry,
        an admin request) gives; each a string or null, else a ConfigError naming
        ``name.KEY``. One not given (or null) keeps the URL's."""
        given: dict[str, str] = {}
        for key in REPLICA_OPTIONS:
            value = check_replica_option(key, options.get(key), f"{name}.{key}")
            if value:
                given[key] = value
        return dataclasses.replace(self, **given)


REPLICA_OPTIONS = ("model", "events", "replay", "role")
"""What a replica entry (YAML mapping, admin request) may set beside its ``url``."""

ROLES = ("both", "prefill", "decode")
"""A replica's part in a request (``role``). Where any replica of a model is ``prefill`` or
``decode``, its completions and chats are disaggregated: prefilled on one that is not
``decode`` (chosen by the router, by prefix), then decoded on one that is not ``prefill``
(the least loaded), which pulls the KV over vLLM's ``kv_transfer_params``."""


def check_replica_option(key: str, value: object, name: str) -> str | None:
    """``value`` as a replica's ``key`` (one of ``REPLICA_OPTIONS``): a string or null, for
    ``events`` and ``replay`` a ZMQ endpoint, for ``role`` one of ``ROLES``; else a
    ConfigError naming ``name``. Checked
    before a replica is added: the intake connects its sockets only after."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name}: expected a string or null, got {value!r}")
    if key == "role":
        if value not in ROLES:
            raise ConfigError(f"{name}: expected one of {', '.join(ROLES)}, got {value!r}")
    elif key != "model" and value:
        _check_endpoint(value, name)
    return value


def _check_endpoint(value: str, name: str) -> None:
    transport, sep, address = value.partition("://")
    ok = bool(sep) and transport.isalpha() and bool(address)
    if ok and transport == "tcp":  # the one vLLM uses: a port is needed to connect
        _, colon, port = address.rpartition(":")
        ok = bool(colon) and port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise ConfigError(f"{name}: expected a ZMQ endpoint such as tcp://HOST:PORT, got {value!r}")


def _check_url(url: str, name: str) -> None:
    """A ConfigError naming ``name`` unless ``url`` is http(s)://HOST[:PORT] with a port in
    1-65535 and no user or password (the host:port is the replica's id, in logs and metrics,
    and its Host header: credentials would leak there)."""
    expected = "expected http://HOST:PORT[=model][,events=..]"
    try:
        parts = urlsplit(url)
        port = parts.port  # parsed on access: out of range or not a number raises
    except ValueError as exc:
        raise ConfigError(f"{name}: not a valid URL ({exc}); {expected}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"{name}: {expected}")
    if port == 0:
        raise ConfigError(f"{name}: port 0 is not a port to connect to; {expected}")
    if "@" in parts.netloc:
        raise ConfigError(f"{name}: user or password in the URL is not supported; {expected}")


def _check_bounds(
    name: str, section: object, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()
) -> None:
    """One ConfigError naming ``SECTION.KEY`` for the first value out of bounds: zero where a
    count or interval must be positive, a negative size, NaN or infinity (a timeout of
    infinity is no timeout: every outbound call must have one)."""
    for key, low in [*((k, ">") for k in positive), *((k, ">=") for k in non_negative)]:
        value = getattr(section, key)
        ok = math.isfinite(value) and (value > 0 if low == ">" else value >= 0)
        if not ok:
            raise ConfigError(f"{name}.{key}: expected a finite number {low} 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    max_prompt_chars: int = 1_000_000
    """Prompt text (all messages) above this is a 400 before any routing work."""
    max_prompt_tokens: int = 131_072
    max_concurrency: int = 256
    """Per tenant unless its key entry says otherwise."""
    tokens_per_minute: int = 0
    """Per tenant (prompt + max_tokens, estimated); 0: unlimited."""
    max_in_flight_per_replica: int = 0
    """Requests in flight through this gateway per replica; beyond, requests wait at the
    gateway and are routed as replicas free up (``gateway.admission``). 0: no cap."""
    max_queued: int = 1024
    """Requests waiting at the gateway under that cap; one more is a 503 (``queue_full``)."""

    def __post_init__(self) -> None:
        _check_bounds(
            "limits",
            self,
            positive=(
                "max_body_bytes",
                "max_prompt_chars",
                "max_prompt_tokens",
                "max_concurrency",
                "max_queued",
            ),
            non_negative=("tokens_per_minute", "max_in_flight_per_replica"),
        )


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 2.0
    read_s: float = 120.0
    """Longest silence from an engine: before its headers and between two stream chunks."""
    health_s: float = 2.0
    drain_s: float = 30.0
    """SIGTERM: how long in-flight requests may take to finish."""
    queue_s: float = 30.0
    """Longest wait at the gateway for a replica with room (``limits.
    max_in_flight_per_replica``); then a 503 (``queue_timeout``)."""
    keep_alive_s: float = KEEP_ALIVE_S
    """An idle client connection is closed after this; longer than the clients' and load
    balancers' own idle timeouts (``kvtide.asgi.runner.KEEP_ALIVE_S`` says why)."""
    body_s: float = 30.0
    """Longest a client may take to send its whole request body; then a 408 and the
    connection closes (``keep_alive_s`` does not run mid-request: a stalled upload would
    hold its handler, and a SIGTERM's drain, for as long as it stays connected)."""

    def __post_init__(self) -> None:
        _check_bounds(
            "timeouts",
            self,
            positive=("connect_s", "read_s", "health_s", "keep_alive_s", "queue_s", "body_s"),
            non_negative=("drain_s",),
        )


@dataclass(frozen=True, slots=True)
class Failover:
    health_interval_s: float = 2.0
    eject_after: int = 3
    """Consecutive failures (errors, timeouts, failed health checks) that eject a replica."""
    eject_s: float = 5.0
    """First ejection; doubles on each re-ejection up to ``max_eject_s``."""
    max_eject_s: float = 60.0
    slow_start_requests: int = 1
    """A re-admitted replica takes this many concurrent requests, doubling per success."""
    scrape_interval_s: float = 1.0

    def __post_init__(self) -> None:
        _check_bounds(
            "failover",
            self,
            positive=(
                "health_interval_s",
                "eject_after",
                "slow_start_requests",
                "scrape_interval_s",
            ),
            non_negative=("eject_s", "max_eject_s"),
        )
        if self.max_eject_s < self.eject_s:
            raise ConfigError(
                f"failover.max_eject_s: {self.max_eject_s!r} is below failover.eject_s "
                f"{self.eject_s!r}"
            )


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: tuple[ReplicaSpec, ...] = ()
    policy: str = "cost"
    state: str = "local"
    state_prefix: str = "kvtide"
    """Key prefix in the shared store: gateways sharing an index use the same one."""
    tokenizer: str | None = None
    api_keys: str | None = None
    admin_key: str | None = None
    admin_key_sha256: str | None = None
    """The admin key's SHA-256 (hex) instead of the key itself, so that a config file holds
    no secret (as the keys file holds tenants' keys)."""
    engine_key: str | None = None
    """The key the engines want (vLLM's ``--api-key``), sent to them as a bearer token on
    every call: requests, health checks, model discovery, scrapes."""
    tenant_secret: str | None = None
    """Secret the per-tenant cache salts derive from; all gateway replicas need the same one.
    Default: a random secret per process (one gateway only)."""
    block_tokens: int = 16
    chunk_chars: int = 64
    """Text mode (no tokenizer): bytes per pseudo-block, about ``block_tokens`` tokens."""
    prefix_cache_tokens: int = 2_000_000
    """Token mode: token ids of conversation prefixes kept to skip retokenizing earlier turns
    (~8 bytes a token with the text kept beside them: ~16 MB at the default)."""
    cold_heads: bool = True
    """Token mode, local state: a prompt no replica holds is routed on its first blocks, the
    rest tokenized only when a follow-up shares them (``gateway.heads``); its line's
    ``prompt_tokens`` is then an estimate (``tokenized`` false). Off: every prompt is
    tokenized whole."""
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    failover: Failover = field(default_factory=Failover)
    access_log: str | None = None
    """A file the access log is appended to (one JSON line per completion request; reopened on
    SIGHUP), ``-`` for standard output; off by default."""
    http_server: str = "uvicorn"
    """The HTTP/1 server under the ASGI app: ``uvicorn`` (in the loop, the cheaper per request
    at the concurrencies measured, docs/http_stack.md) or ``granian`` (its Rust I/O thread)."""
    config_path: str | None = None
    overrides: tuple[tuple[str, Any], ...] = ()
    """The flags given on top of the file: a reload (SIGHUP) re-reads the file under them."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port: {self.port} is not a TCP port")
        if self.block_tokens < 1 or self.chunk_chars < 1:
            raise ConfigError("block_tokens and chunk_chars must be >= 1")
        if self.prefix_cache_tokens < 0:
            raise ConfigError(f"prefix_cache_tokens: must be >= 0, got {self.prefix_cache_tokens}")
        if self.state != "local" and not self.state.startswith(("redis://", "rediss://")):
            raise ConfigError(f"state: expected local or redis://..., got {self.state!r}")
        if self.admin_key is not None and self.admin_key_sha256 is not None:
            raise ConfigError("admin_key and admin_key_sha256: give one of them")
        key = self.engine_key
        if key is not None and not (key and key.isascii() and key.isprintable()):
            raise ConfigError("engine_key: expected printable ASCII (a bearer token)")
        if self.admin_key == "":
            raise ConfigError("admin_key: empty (leave it out to turn the admin API off)")
        if self.admin_key_sha256 is not None and not is_sha256_hex(self.admin_key_sha256):
            raise ConfigError(
                f"admin_key_sha256: expected 64 hex digits (sha256sum of the key), "
                f"got {self.admin_key_sha256!r}"
            )
        if self.http_server not in ("uvicorn", "granian"):
            raise ConfigError(f"http_server: expected uvicorn or granian, got {self.http_server!r}")
        ids = [r.replica_id for r in self.replicas]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"replicas: the same host:port twice in {ids}")


_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def is_sha256_hex(text: str) -> bool:
    """A SHA-256 digest in hex, as ``sha256sum`` prints it (the keys file's and the admin
    key's form at rest)."""
    return _HEX64.fullmatch(text) is not None


_SECTIONS: dict[str, type[Any]] = {"limits": Limits, "timeouts": Timeouts, "failover": Failover}


def _section(name: str, cls: type[Any], raw: object) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{name}: expected a mapping")
    known = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        f = known.get(str(key))
        if f is None:
            raise ConfigError(f"{name}.{key}: unknown key (valid: {', '.join(known)})")
        default: Any = f.default
        expected = f"{name}.{key}: expected {type(default).__name__}, got {value!r}"
        # true is an int to Python, not a size or a number of seconds to anyone writing YAML
        if isinstance(value, bool) or not isinstance(value, type(default) | int):
            raise ConfigError(expected)
        try:
            values[str(key)] = type(default)(value)
        except OverflowError:  # an integer too large for a float
            raise ConfigError(expected) from None
    return cls(**values)


def from_mapping(
    raw: Mapping[str, Any], source: str = "config", flags: Collection[str] = ()
) -> GatewayConfig:
    """A config from parsed YAML; ``replicas`` entries are strings as ``--replica`` takes or
    mappings with ``url``, ``model``, ``events``, ``replay``. ``flags``: the keys whose values
    came from the command line (their errors name the flag). A value of the wrong shape is a
    ConfigError naming its key, never a TypeError from deeper down."""
    known = {f.name for f in dataclasses.fields(GatewayConfig)} - {"config_path", "overrides"}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} (valid: {', '.join(sorted(known))})")
        if key in _SECTIONS:
            values[key] = _section(key, _SECTIONS[key], value)
        elif key == "replicas":
            values[key] = _replicas(source, value, from_flag=key in flags)
        elif key == "cold_heads":
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key}: expected true or false, got {value!r}")
            values[key] = value
        elif key in ("port", "block_tokens", "chunk_chars", "prefix_cache_tokens"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{source}: {key}: expected an integer, got {value!r}")
            values[key] = value
        elif isinstance(value, str) or (value is None and key in _OPTIONAL):
            values[key] = value
        else:
            raise ConfigError(f"{source}: {key}: expected a string, got {value!r}")
    return GatewayConfig(**values)


_OPTIONAL = {f.name for f in dataclasses.fields(GatewayConfig) if f.type == "str | None"}
"""The string settings that may be null (off); ``state: null`` or ``policy: null`` is not a
state or a policy."""


def _replicas(source: str, raw: object, from_flag: bool) -> tuple[ReplicaSpec, ...]:
    """Every entry checked before any is used: a reload with one bad entry changes nothing."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ConfigError(f"{source}: replicas: expected a list of URLs or mappings, got {raw!r}")
    names = (
        ["--replica"] * len(raw)
        if from_flag
        else [f"{source}: replicas[{i}]" for i in range(len(raw))]
    )
    return tuple(_replica(name, item) for name, item in zip(names, raw, strict=True))


def _replica(name: str, item: object) -> ReplicaSpec:
    if isinstance(item, str):
        return ReplicaSpec.parse(item, name)
    if isinstance(item, Mapping) and isinstance(item.get("url"), str):
        extra = set(item) - {"url", *REPLICA_OPTIONS}
        if extra:
            raise ConfigError(f"{name}: unknown keys {sorted(map(str, extra))}")
        return ReplicaSpec.parse(item["url"], f"{name}.url").with_options(item, name)
    raise ConfigError(f"{name}: expected a URL string or a mapping with a url string")


def read_yaml(path: str) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML") from exc
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return raw


def load_config(path: str | None, overrides: Mapping[str, Any] | None = None) -> GatewayConfig:
    """The file's settings, then ``overrides`` (flags given on the command line) on top."""
    raw: dict[str, Any] = read_yaml(path) if path else {}
    if (overrides or {}).get("admin_key") is not None:
        raw.pop("admin_key_sha256", None)  # a key given on top replaces the file's hash
    for key, value in (overrides or {}).items():
        if value is not None:
            raw[key] = value
    given = tuple((k, v) for k, v in (overrides or {}).items() if v is not None)
    config = from_mapping(raw, path or "flags", flags={k for k, _ in given})
    return dataclasses.replace(config, config_path=path, overrides=given)
