"""vLLM's NixlConnector protocol for disaggregated prefill and decode, as vLLM 0.33 speaks it
(``vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py``): a request's
``kv_transfer_params`` checked, the prompt tokens a decode engine loads from the prefill engine,
and the ``kv_transfer_params`` a prefill engine answers with.

A proxy sends the prefill engine ``{"do_remote_decode": true}`` (and ``max_tokens: 1``), then
the decode engine the prefill's answer, ``{"do_remote_prefill": true, "remote_block_ids": ...,
"remote_engine_id": ..., ...}``. Nothing crosses between the two emulated engines: the decode
engine charges its own NIC for the KV it would read.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from kvtide.engine_server.api_errors import bad_request
from kvtide.errors import ConfigError

PARAM = "kv_transfer_params"
CONNECTORS = ("NixlConnector",)
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
REMOTE_KEYS = ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
"""The keys vLLM's decode side needs present (their values unchecked) to read remote blocks."""

_TYPES: Mapping[str, tuple[str, type]] = {
    "do_remote_decode": ("a boolean", bool),
    "do_remote_prefill": ("a boolean", bool),
    "remote_engine_id": ("a string", str),
    "remote_request_id": ("a string", str),
    "remote_host": ("a string", str),
    "remote_port": ("an integer", int),
    "tp_size": ("an integer", int),
    "remote_num_tokens": ("an integer", int),
    "remote_prefill_cached_tokens": ("an integer", int),
}
"""The keys vLLM's connector reads that this engine checks, and their types (null is always
allowed: vLLM's toy proxy sends the remote ones as null to the prefill engine); any other key
passes unchecked, as in vLLM."""


@dataclass(frozen=True, slots=True)
class KvTransferConfig:
    """``--kv-transfer-config``: vLLM's JSON, of which the emulator reads ``kv_connector``
    (NixlConnector only), ``kv_role`` and ``engine_id`` (a fresh uuid4 when absent, as vLLM
    draws it); ``side_channel_host`` and ``_port`` are vLLM's ``VLLM_NIXL_SIDE_CHANNEL_HOST``
    and ``_PORT``, which its prefill answers name."""

    engine_id: str
    kv_role: str = "kv_both"
    side_channel_host: str = "localhost"
    side_channel_port: int = 5600
    kv_lease_s: float = 30.0
    """``kv_connector_extra_config.kv_lease_duration``: how long a finished prefill's blocks
    wait for the decode engine's read, on the engine's (model) clock (``side_channel``)."""


def parse_kv_transfer_config(
    text: str, side_channel_host: str = "localhost", side_channel_port: int = 5600
) -> KvTransferConfig:
    """``--kv-transfer-config``'s JSON, checked as vLLM checks it (a connector needs a role);
    other keys (``kv_buffer_device``, the rest of ``kv_connector_extra_config``, ...) are taken
    and not modelled."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--kv-transfer-config: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("--kv-transfer-config: must be a JSON object")
    connector = data.get("kv_connector")
    if connector not in CONNECTORS:
        raise ConfigError(
            f"--kv-transfer-config: kv_connector {connector!r} is not emulated; "
            f"valid: {', '.join(CONNECTORS)}"
        )
    role = data.get("kv_role")
    if role not in KV_ROLES:
        raise ConfigError(f"--kv-transfer-config: kv_role must be one of {', '.join(KV_ROLES)}")
    engine_id = data.get("engine_id")
    if engine_id is None:
        engine_id = str(uuid.uuid4())
    elif not isinstance(engine_id, str) or not engine_id:
        raise ConfigError("--kv-transfer-config: engine_id must be a non-empty string")
    extra = data.get("kv_connector_extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("--kv-transfer-config: kv_connector_extra_config must be an object")
    lease = extra.get("kv_lease_duration", 30)
    if type(lease) not in (int, float) or lease <= 0:
        raise ConfigError(
            "--kv-transfer-config: kv_connector_extra_config.kv_lease_duration must be a "
            "positive number of seconds"
        )
    return KvTransferConfig(engine_id, role, side_channel_host, side_channel_port, float(lease))


@dataclass(frozen=True, slots=True)
class RemoteKv:
    """Where a decode request's KV lies: the prefill engine's id and side channel, and its
    request there (whose held blocks the decode engine's read lets go)."""

    engine_id: str
    request_id: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class TransferParams:
    """A request's ``kv_transfer_params``: what vLLM's connector and output processor read."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_blocks: int = 0
    """Blocks in ``remote_block_ids`` (its first KV cache group's, as vLLM 0.33 lists them
    per group; a flat list, as older vLLMs sent it, counts too)."""
    has_remote: bool = False
    """Whether ``REMOTE_KEYS`` are all present."""
    remote: RemoteKv | None = None
    """Their values, where none is null."""
    remote_prefill_cached_tokens: int | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    """The prefill's prompt ids, which a chat's decode leg takes instead of rendering its
    messages (vLLM 0.33's decode-side token reuse)."""


def parse_params(body: Mapping[str, Any], *, reuse_prompt: bool) -> TransferParams | None:
    """The request's ``kv_transfer_params`` (None when absent or null); a 400 naming the field
    where it or a key this engine reads has the wrong type. ``reuse_prompt``: a chat request,
    whose ``prompt_token_ids`` key vLLM takes and checks."""
    v = body.get(PARAM)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad_request(f"'{PARAM}' must be an object", PARAM)
    for key, (name, kind) in _TYPES.items():
        x = v.get(key)
        if x is not None and (not isinstance(x, kind) or (kind is int and isinstance(x, bool))):
            raise bad_request(f"'{PARAM}.{key}' must be {name}", PARAM)
    cached = v.get("remote_prefill_cached_tokens")
    if cached is not None and cached < 0:
        raise bad_request(f"'{PARAM}.remote_prefill_cached_tokens' must be >= 0", PARAM)
    named: list[Any] = [v.get(k) for k in REMOTE_KEYS]
    remote = RemoteKv(*named) if None not in named else None
    return TransferParams(
        do_remote_decode=bool(v.get("do_remote_decode")),
        do_remote_prefill=bool(v.get("do_remote_prefill")),
        remote_blocks=_num_blocks(v.get("remote_block_ids")),
        has_remote=all(k in v for k in REMOTE_KEYS),
        remote=remote,
        remote_prefill_cached_tokens=cached,
        prompt_token_ids=_prompt_ids(v.get("prompt_token_ids")) if reuse_prompt else None,
    )


def _num_blocks(ids: object) -> int:
    if ids is None:
        return 0
    if isinstance(ids, list):
        if ids and all(isinstance(g, list) for g in ids):  # per KV cache group
            if all(_ints(g) for g in ids):
                return len(ids[0])
        elif _ints(ids):
            return len(ids)
    raise bad_request(
        f"'{PARAM}.remote_block_ids' must be an array of block ids, or one such array per "
        "KV cache group",
        PARAM,
    )


def _ints(v: list[Any]) -> bool:
    return all(type(x) is int for x in v)


def _prompt_ids(ids: object) -> tuple[int, ...] | None:
    """vLLM's check of the forwarded prompt ids (``renderers/online_renderer.py``)."""
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not _ints(ids) or min(ids) < 0:
        raise bad_request(
            f"`{PARAM}['prompt_token_ids']` must be a non-empty list of non-negative integers.",
            f"{PARAM}.prompt_token_ids",
        )
    return tuple(ids)


@dataclass(frozen=True, slots=True)
class NixlConnector:
    """This engine's end of vLLM's NixlConnector (pull mode, one KV cache group, no DCP or
    PP): what a decode request loads, what a finished prefill answers."""

    config: KvTransferConfig
    block_tokens: int
    tp: int = 1

    def remote_tokens(self, params: TransferParams | None, prompt_tokens: int) -> int:
        """Prompt tokens whose KV the remote engine holds. vLLM loads every prompt token past
        its local hit when the request asks for a remote prefill and names remote blocks and
        ``REMOTE_KEYS`` (without them it loads nothing); it end-trims a list longer than the
        blocks it needs, and a shorter one (which fails vLLM's transfer) covers its blocks'
        tokens here."""
        if params is None or not params.do_remote_prefill:
            return 0
        if not params.remote_blocks or not params.has_remote:
            return 0
        return min(prompt_tokens, params.remote_blocks * self.block_tokens)

    def prefill_answer(
        self, request_id: str, num_computed_tokens: int, cached_tokens: int | None
    ) -> dict[str, Any]:
        """What vLLM's ``request_finished`` returns for a ``do_remote_decode`` request the
        engine finished (by length or EOS, not aborted): where the decode engine reads the
        KV of its ``num_computed_tokens`` tokens (block ids are the blocks' positions here,
        numbered from 0). ``cached_tokens``: the prompt's cached tokens, which vLLM adds as
        ``remote_prefill_cached_tokens`` when the request finishes with its first token."""
        bt = self.block_tokens
        config = self.config
        answer: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(range(-(-num_computed_tokens // bt)))],
            "remote_engine_id": config.engine_id,
            "remote_request_id": request_id,
            "remote_host": config.side_channel_host,
            "remote_port": config.side_channel_port,
            "tp_size": self.tp,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": num_computed_tokens,
            "remote_blocks_expiry_time": None,  # set for a decode engine's blocks only
            # one registration per tensor-parallel rank at start-up
            "remote_registration_generation": self.tp,
            "transfer_mode": "pull",
        }
        if cached_tokens is not None:
            answer["remote_prefill_cached_tokens"] = cached_tokens
        return answer


def reported_cached_tokens(params: TransferParams | None, cached_tokens: int) -> int:
    """``usage``'s cached tokens as vLLM's output processor reports them: a remote-prefilled
    request's ``remote_prefill_cached_tokens`` (the prefill engine's hit) where given as an
    integer, whatever this engine found."""
    if params is not None and params.do_remote_prefill:
        cached = params.remote_prefill_cached_tokens
        if cached is not None:
            return cached
    return cached_tokens
