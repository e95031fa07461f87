"""`kvtide serve`: the OpenAI-compatible gateway in front of engine replicas."""

from __future__ import annotations

import argparse
import logging
import os

from kvtide.clock import WallClock
from kvtide.errors import ConfigError
from kvtide.gateway import load_config, serve
from kvtide.routing import GlobalPrefixIndex, RoutingContext
from kvtide.routing.specs import build_policy, needs_index


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible gateway routing to engine replicas by prefix and load",
        description="An OpenAI-compatible gateway (/v1/completions, /v1/chat/completions, "
        "/v1/responses, Anthropic's /v1/messages, /v1/models, /health, /ready, /metrics, "
        "/admin/replicas; "
        "vLLM's /tokenize and pooling endpoints passed through) routing each request "
        "through a kvtide routing policy. Flags override --config.",
    )
    p.add_argument("--config", help="YAML file with every setting (reloaded on SIGHUP)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to bind (default 8000)")
    p.add_argument(
        "--replica",
        action="append",
        metavar="URL[=MODEL][,events=tcp://..][,replay=tcp://..][,role=prefill|decode]",
        help="an engine replica (repeatable)",
    )
    for role in ("prefill", "decode"):
        p.add_argument(
            f"--{role}",
            action="append",
            metavar="URL[=MODEL][,events=..][,replay=..]",
            help=f"an engine replica that only {role}s (as --replica URL,role={role}): "
            "completions are then prefilled and decoded apart, the KV moved by vLLM's "
            "kv_transfer_params (engines run with its NixlConnector)",
        )
    p.add_argument("--policy", help="router NAME[:key=value...] from the registry (default cost)")
    p.add_argument("--state", help="local (default) or redis://HOST:PORT/DB")
    p.add_argument("--state-prefix", help="key prefix in the shared store (default kvtide)")
    p.add_argument(
        "--tokenizer",
        help="tokenizer directory, GGUF, or smollm2 (SmolLM2-135M-Instruct's, the emulated "
        "engine's default): exact prefix identity; without it, text chunks",
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        help="token ids of conversation prefixes kept for reuse (default 2000000)",
    )
    p.add_argument("--api-keys", help="YAML file of hashed API keys -> tenants")
    p.add_argument(
        "--admin-key",
        help="bearer key of the admin API (off without it; default $KVTIDE_ADMIN_KEY, which "
        "keeps it out of the process list; a config file can hold its admin_key_sha256)",
    )
    p.add_argument(
        "--engine-key",
        help="the engines' key (vLLM's --api-key), sent to them as a bearer token (default "
        "$KVTIDE_ENGINE_KEY)",
    )
    p.add_argument(
        "--tenant-secret",
        help="secret the per-tenant cache salts derive from (default $KVTIDE_TENANT_SECRET)",
    )
    p.add_argument(
        "--access-log",
        metavar="FILE",
        help="append one JSON line per completion request to FILE (- for stdout): tenant, "
        "replica, route, predicted and reported cached tokens, TTFT; reopened on SIGHUP",
    )
    p.add_argument(
        "--http-server",
        choices=("uvicorn", "granian"),
        help="the HTTP/1 server under the ASGI app (default uvicorn: the cheaper per request)",
    )
    p.add_argument("--log-level", default="warning", help="python logging level")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="kvtide serve: %(message)s")
    _log_alerts()
    overrides = {
        "host": args.host,
        "port": args.port,
        "policy": args.policy,
        "state": args.state,
        "state_prefix": args.state_prefix,
        "tokenizer": args.tokenizer,
        "prefix_cache_tokens": args.prefix_cache_tokens,
        "api_keys": args.api_keys,
        "admin_key": _secret(args.admin_key, "KVTIDE_ADMIN_KEY"),
        "tenant_secret": _secret(args.tenant_secret, "KVTIDE_TENANT_SECRET"),
        "engine_key": _secret(args.engine_key, "KVTIDE_ENGINE_KEY"),
        "replicas": _replicas(args),
        "http_server": args.http_server,
        "access_log": args.access_log,
    }
    config = load_config(args.config, overrides)
    if not config.replicas:
        raise ConfigError("no replicas: give --replica URL or replicas: in --config")
    # a bad policy spec is a one-line error here, not a traceback from inside the server
    index = GlobalPrefixIndex() if needs_index(config.policy) else None
    ctx = RoutingContext(clock=WallClock(), index=index)
    build_policy(config.policy, ctx)
    serve(config)
    return 0


def _replicas(args: argparse.Namespace) -> list[str] | None:
    """``--replica``, ``--prefill`` and ``--decode`` as ``--replica`` specs; None where none
    is given (the config file's then stand)."""
    specs = list(args.replica or [])
    for role in ("prefill", "decode"):
        for spec in getattr(args, role) or []:
            if "role=" in spec:
                raise ConfigError(f"--{role} {spec!r}: the flag gives the role")
            specs.append(f"{spec},role={role}")
    return specs or None


def _secret(flag: str | None, env: str) -> str | None:
    """A secret from its flag as given (an empty one is then refused by the config's
    checks, not taken for none), else from the environment variable ``env`` (unset or
    empty: none): a flag is in every process listing (ps, /proc/PID/cmdline), an
    environment only in the process's own."""
    return flag if flag is not None else os.environ.get(env) or None


def _log_alerts() -> None:
    """The fleet early warning's alerts as one stderr line each, info ones too (a cold start
    is worth a line at the default warning level)."""
    alerts = logging.getLogger("kvtide.alerts")
    if not alerts.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("kvtide serve: alert: %(message)s"))
        alerts.addHandler(handler)
        alerts.setLevel(logging.INFO)
        alerts.propagate = False
