"""The gateway's state and request logic, independent of the HTTP server.

``Gateway`` holds the routing state (one ``routing.Router`` over every replica, the index its
policy reads) and the engines' connection pool; its ``lifespan`` owns the background loops
(health checks, load scraping, KV-event intake) in one ``TaskGroup``. ``gateway.server`` puts
it behind the ASGI routes and serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import orjson

from kvtide.asgi import Send
from kvtide.clock import Clock, EpochClock, WallClock
from kvtide.errors import KvtideError, RequestError
from kvtide.gateway.access_log import AccessLog, Exchange
from kvtide.gateway.admission import Admission
from kvtide.gateway.config import GatewayConfig, Limits, ReplicaSpec, load_config
from kvtide.gateway.dialects import ANTHROPIC, OPENAI, RESPONSES, Dialect
from kvtide.gateway.heads import RoutedHeads
from kvtide.gateway.health import HealthChecker
from kvtide.gateway.intake import EventIntake
from kvtide.gateway.metrics import GatewayMetrics
from kvtide.gateway.prompts import Prompt, PromptHasher, PromptTokenizer
from kvtide.gateway.proxy import Proxy
from kvtide.gateway.replicas import Replica, ReplicaSet, Stage
from kvtide.gateway.response_homes import ResponseHomes
from kvtide.gateway.shared import SharedState
from kvtide.gateway.status import (
    BAD_REQUEST,
    FORBIDDEN,
    MODEL_NOT_FOUND,
    NOT_FOUND,
    UNAVAILABLE,
    ApiError,
)
from kvtide.gateway.telemetry import GatewayTelemetry
from kvtide.gateway.tenants import Tenant, TenantTable, bearer_key, hash_key
from kvtide.gateway.upstream import UpstreamPool
from kvtide.gateway.usage import ask_usage
from kvtide.routing import GlobalPrefixIndex, RouteDecision, RouteRequest, RoutingContext
from kvtide.routing.identity import namespace_seed
from kvtide.routing.router import Router
from kvtide.routing.shadow import ShadowFleet
from kvtide.routing.specs import build_policy, parse_router
from kvtide.text import anthropic_request, load_tokenizer, responses_request
from kvtide.types import BlockHash, ReplicaId, Tier

log = logging.getLogger("kvtide.gateway")

Api = Literal["chat", "completions", "responses", "messages"]
"""A completion's API: OpenAI's chat or text completions or Responses, Anthropic's Messages."""

_DIALECTS: dict[Api, Dialect] = {
    "chat": OPENAI,
    "completions": OPENAI,
    "responses": RESPONSES,
    "messages": ANTHROPIC,
}
_CONVERTED = ("responses", "messages")
"""The APIs vLLM serves by converting a request to a chat completion, whose streams carry
their usage unasked."""

POOLING_PATHS = (
    "/v1/embeddings",
    "/v2/embed",
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
)
"""vLLM's pooling endpoints: the engine runs each request's prompt (a prefill, no decode),
under the tenant's cache salt as a completion's."""
TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/v1/messages/count_tokens")
"""vLLM's tokenizer endpoints: answered by the engine's API server, no engine work."""
PASSED_THROUGH = {path: path.rsplit("/", 1)[1] for path in (*POOLING_PATHS, *TOKENIZER_PATHS)}
"""The requests prefix routing has no part in, by path, and their access-log endpoint:
passed to the least loaded replica serving their model (``Gateway.pass_through``)."""

SHADOW_CAPACITY_BLOCKS = 65_536
"""Text mode: blocks each replica's shadow cache holds (an engine's KV is unknown here)."""
SHADOW_TTL_S = 600.0
CHUNK_MEMO_TOKENS = 1_000_000
"""Token ids the tokenizer's chunk memo holds (``text.chunk_memo``): ~8 MB with their text."""


class Gateway:
    """Everything a request needs, independent of the HTTP layer."""

    def __init__(
        self,
        config: GatewayConfig,
        tokenizer: PromptTokenizer | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        # one clock for load, health, limits and routing: a test harness drives it by hand
        self.clock: Clock = clock if clock is not None else WallClock()
        self.epoch: Clock = EpochClock()
        self.metrics = GatewayMetrics()
        self.access_log: AccessLog | None = None
        if config.access_log:
            self.access_log = AccessLog(
                config.access_log, on_drop=self.metrics.access_log_dropped.inc
            )
        if tokenizer is None and config.tokenizer:
            # its own copy (the loaded one is shared in-process): long prompts that open
            # alike, in one message or a completions prompt, reuse their chunks' ids
            tokenizer = load_tokenizer(config.tokenizer).with_chunk_memo(CHUNK_MEMO_TOKENS)
        self.prompts = PromptHasher(
            config.block_tokens,
            config.chunk_chars,
            config.limits.max_prompt_chars,
            config.limits.max_prompt_tokens,
            tokenizer,
            config.prefix_cache_tokens,
        )
        template = getattr(tokenizer, "chat_template", None)
        # as vLLM decides for its /v1/messages (text mode renders nothing: kept in place)
        self._merge_inline_system = template is not None and (
            anthropic_request.template_merges_inline_system(template.source)
        )
        self.replicas = ReplicaSet(
            config.failover,
            config.block_tokens,
            self.clock,
            cap=config.limits.max_in_flight_per_replica,
        )
        self.homes = ResponseHomes()
        """The engine of each Responses answer passed on, for the requests naming it."""
        for spec in config.replicas:
            self.replicas.add(spec)
        self.admission = Admission(
            self.replicas,
            self.metrics,
            self.clock.now,
            config.limits.max_queued,
            config.timeouts.queue_s,
        )
        self.shadow: ShadowFleet | None = None
        self.index: GlobalPrefixIndex | ShadowFleet
        if self.prompts.is_exact:
            self.index = GlobalPrefixIndex()
        else:
            self.shadow = ShadowFleet(
                SHADOW_CAPACITY_BLOCKS,
                self.clock,
                block_tokens=config.block_tokens,
                ttl_s=SHADOW_TTL_S,
            )
            self.index = self.shadow  # the shadow is its own index
        self.ctx = RoutingContext(
            block_tokens=config.block_tokens, clock=self.clock, index=self.index
        )
        self.router = Router(build_policy(self._policy_spec(), self.ctx), [])
        for r in self.replicas:
            self.router.add_replica(r.state)
        self.heads = RoutedHeads(
            self.router.blocks_known, on_rest=self.metrics.prompt_head_rests.inc
        )
        if config.tenant_secret:
            secret = config.tenant_secret.encode()
        else:
            secret = secrets.token_bytes(32)
            if config.state != "local":
                # each replica would salt its tenants differently: the engines' hash namespaces
                # (and so their caches) would not be shared between gateway replicas
                log.warning(
                    "--state %s without --tenant-secret: this replica's tenant salts are its "
                    "own; give every gateway replica the same --tenant-secret to share cache",
                    config.state,
                )
        self.tenants = TenantTable(secret, config.limits, self.clock)
        self.tenants.load(config.api_keys)
        self._admin_hash = _admin_hash(config)
        self._seeds: dict[tuple[str, str], int] = {}
        self._ids = itertools.count()
        # request ids unique across gateway replicas and restarts: a random prefix per process
        self._id_prefix = f"gw-{secrets.randbits(40):010x}-"
        # the router's families and the fleet's early warning, after kvtide_gateway_* on /metrics
        self.telemetry = GatewayTelemetry(
            self.router.health, self.index, self.clock, pace=self.router.pace
        )
        self.metrics.attach(self.telemetry.exposition)
        self.intakes: dict[ReplicaId, EventIntake] = {}
        self.intake_tasks: dict[ReplicaId, asyncio.Task[None]] = {}
        self.draining = False
        self.shared: SharedState | None = None
        if config.state != "local":
            self.shared = SharedState(
                config.state,
                config.state_prefix,
                on_resync=self._resync_shared,
                shadow_ttl_s=None if self.prompts.is_exact else SHADOW_TTL_S,
            )
            self.tenants.shared = True  # tokens per minute held across the replicas
            self.homes.on_record = self.shared.record_home
        self.pool: UpstreamPool | None = None
        self.proxy: Proxy | None = None
        self.checker: HealthChecker | None = None
        self.task_group: asyncio.TaskGroup | None = None

    def _policy_spec(self, spec: str | None = None) -> str:
        """Text mode's index is the shadow of the gateway's own decisions, updated at each
        dispatch: the provisional entries ``cost`` and ``precise`` keep until the engines'
        events land would duplicate it, at a cost per request, so they are off unless asked.
        ``cost``'s holder rule is off there too unless asked: it weighs the index's held blocks
        against the engines' capacity, and the shadow counts text chunks of this gateway's own
        placements, evicted at its own size and TTL, not what the engines hold."""
        spec = self.config.policy if spec is None else spec
        name, options = parse_router(spec)
        if self.shadow is not None and name in ("cost", "precise") and "provisional" not in options:
            spec += ":provisional=false"
        if self.shadow is not None and name == "cost" and "affinity_share" not in options:
            spec += ":affinity_share=0"
        return spec

    # --- identity ------------------------------------------------------------------------

    def seed(self, model: str, salt: str) -> int:
        """The namespace seed of (model, tenant salt): the same the event intake uses for
        blocks stored under that ``cache_salt``."""
        key = (model, salt)
        seed = self._seeds.get(key)
        if seed is None:
            seed = self._seeds[key] = namespace_seed(model, salt.encode())
        return seed

    # --- routing ---------------------------------------------------------------------------

    def request_id(self) -> str:
        """A new request id: the engine gets it as ``X-Request-Id`` (vLLM takes it for its own
        with ``--enable-request-id-headers``), the client back, the access log with the line."""
        return f"{self._id_prefix}{next(self._ids)}"

    def prompt(self, body: dict[str, Any], is_chat: bool, seed: int) -> Prompt:
        """The request's prompt identity: whole, or a head when what replicas hold of it ends
        within the head (``gateway.heads``); a whole prompt first completes the heads it
        reaches."""
        head_blocks = self._head_blocks()
        prompts = self.prompts
        if is_chat:
            prompt = prompts.chat(body, seed, head_blocks)
        else:
            prompt = prompts.completion(body, seed, head_blocks)
        if prompt.whole is not None:
            if self.router.held_blocks(prompt.hashes) < len(prompt.hashes):
                self.metrics.prompt_heads.inc()
                return prompt
            prompt = prompt.whole()
        self.heads.reached(prompt.hashes)
        return prompt

    def _head_blocks(self) -> int:
        """Blocks of a cold prompt to hash (0: whole): the policy's ``cold_head_blocks``, in
        token mode, when the index is this process's (a shared store's match is awaited
        later, on the whole prompt)."""
        if not self.config.cold_heads or not self.prompts.is_exact or self.shared is not None:
            return 0
        return self.router.cold_head_blocks or 0

    def route_request(
        self, prompt: Prompt, tenant: Tenant, max_tokens: int, request_id: str | None = None
    ) -> RouteRequest:
        """What the router is told about a request (the handlers' one way to build it); a
        head's route is kept for the follow-up that reaches it (``heads``)."""
        route = RouteRequest(
            block_hashes=prompt.hashes,
            prompt_tokens=prompt.prompt_tokens,
            block_tokens=self.config.block_tokens,
            request_id=request_id or self.request_id(),
            tenant=tenant.name,
            output_tokens=max_tokens,
        )
        if prompt.whole is not None:
            self.heads.add(route, prompt)
        return route

    def choose(
        self,
        route: RouteRequest,
        model: str,
        exclude: ReplicaId | None = None,
        home: ReplicaId | None = None,
        stage: Stage = None,
    ) -> tuple[Replica, RouteDecision] | None:
        """The replica for ``route`` among those serving ``model`` that can take it now
        (``None``: none can); counted in the metrics and, in text mode, in the shadow.
        ``home``: the one replica able to answer it (it holds the stored response the
        request continues), chosen while it is up, whatever its load or the cap.
        ``stage``: the part of a disaggregated request it is chosen for."""
        pinned = self.replicas.home(home, model, exclude)
        replicas = self.replicas
        cands = [pinned] if pinned is not None else replicas.candidates(model, exclude, stage)
        if not cands:
            return None
        decision = self.router.route(route, [c.state for c in cands])
        if pinned is not None:
            decision = dataclasses.replace(decision, reason="previous_response")
        replica = self.replicas.by_id[decision.replica]
        self.metrics.child(self.metrics.decisions, replica.replica_id, decision.reason).inc()
        if decision.cached_tokens:
            self.metrics.predicted_cached.inc(decision.cached_tokens)
        self.telemetry.routed(route.block_hashes)
        if self.shadow is not None:
            self.shadow.record(decision.replica, route.block_hashes)
            if self.shared is not None:
                self.shared.record(decision.replica, route.block_hashes)
        return replica, decision

    # --- replicas ------------------------------------------------------------------------

    def add_replica(self, spec: ReplicaSpec) -> Replica:
        if self.replicas.get(spec.replica_id) is not None:
            raise ApiError(BAD_REQUEST, f"replica {spec.replica_id} exists", "url")
        replica = self.replicas.add(spec)
        self.router.add_replica(replica.state)
        if self.task_group is not None:
            self._start_intake(replica)
            self.task_group.create_task(self._discover(replica))
        return replica

    async def _discover(self, replica: Replica) -> None:
        if self.checker is not None:
            await self.checker.discover(replica)
        self.admission.release()  # its models known: requests waiting for them may go

    def remove_replica(self, replica_id: ReplicaId) -> None:
        replica = self.replicas.remove(replica_id)
        if replica is None:
            raise ApiError(NOT_FOUND, f"no replica {replica_id}", "replica")
        self.router.remove_replica(replica_id)
        task = self.intake_tasks.pop(replica_id, None)
        intake = self.intakes.pop(replica_id, None)
        if task is not None and intake is not None and self.task_group is not None:
            task.cancel()
            self.task_group.create_task(_retire(task, intake))
        self.index.clear_replica(replica_id)
        self.homes.forget(replica_id)
        if self.shared is not None:
            self.shared.forget(replica_id)
        self.telemetry.forget(replica_id)
        if self.shadow is not None:
            self.shadow.forget(replica_id)

    def _start_intake(self, replica: Replica) -> None:
        """Once the replica's base model is known (given, or read from its /v1/models): its
        blocks are hashed in that model's namespace, or their LoRA adapter's, as requests
        for either are. (Started before, every block of an engine added without a model
        was hashed under a placeholder name for the intake's life.) None for a replica that
        only decodes: the index serves the router, which never places a request there by
        prefix (the least loaded decodes), and its stream is the pulled KV of every prompt
        again."""
        spec = replica.spec
        if spec.events is None or not self.prompts.is_exact or self.task_group is None:
            return
        if spec.role == "decode":
            return
        base = replica.base_model
        if base is None or replica.replica_id in self.intakes:
            return  # _on_models starts it

        def seed_for(salt: str | None, lora: str | None) -> int:
            return self.seed(lora or base, salt or "")

        intake = EventIntake(
            replica.replica_id,
            spec.events,
            spec.replay,
            self.config.block_tokens,
            seed_for,
            self.index,
            after_commit=self.shared.write if self.shared is not None else None,
            health=self.router.health,
            on_batches=self.metrics.child(self.metrics.kv_events, replica.replica_id).inc,
            on_bootstrap_failures=self.metrics.child(
                self.metrics.kv_event_bootstrap_failures, replica.replica_id
            ).inc,
        )
        self.intakes[replica.replica_id] = intake
        task = self.task_group.create_task(self._run_intake(intake))
        self.intake_tasks[replica.replica_id] = task

    async def _run_intake(self, intake: EventIntake) -> None:
        try:
            await intake.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a broken stream must not take the gateway down
            log.exception("KV event intake of %s stopped", intake.replica)

    def _resync_shared(self, replica_id: ReplicaId) -> None:
        """Redis is back, or this gateway took the engine's lease: its entries there are
        rewritten from the local index (kept whole through the outage by the intake)."""
        shared, index = self.shared, self.index
        if shared is None or replica_id not in self.intakes or self.task_group is None:
            return
        assert isinstance(index, GlobalPrefixIndex)  # intakes run in token mode only

        def held() -> dict[Tier, list[BlockHash]]:
            return {t: index.blocks_of(replica_id, t) for t in Tier}

        self.task_group.create_task(shared.resync(replica_id, held))

    async def _maintain_shared(self) -> None:
        shared = self.shared
        assert shared is not None
        await shared.maintain(
            {r.replica_id: r.in_flight for r in self.replicas}, self.tenants.take_unshared()
        )
        self.metrics.state_degraded.set(1 if shared.degraded else 0)
        if not shared.degraded:
            for r in self.replicas:
                r.count_others(shared=shared.others_in_flight.get(r.replica_id, 0))
            self.tenants.spent_elsewhere(shared.spent_elsewhere)

    def _on_down(self, replica: Replica) -> None:
        self.metrics.healthy.labels(replica.replica_id).set(0)

    def _on_scraped(self, replica: Replica, body: bytes) -> None:
        self.telemetry.scraped(replica.replica_id, body)
        self.telemetry.tick()  # the early warning runs between the gateway's own scrapes too

    def _on_models(self, replica: Replica) -> None:
        if self.replicas.get(replica.replica_id) is replica:  # not removed meanwhile
            self._start_intake(replica)

    def _on_up(self, replica: Replica) -> None:
        self.metrics.healthy.labels(replica.replica_id).set(1)
        self.admission.release()
        intake = self.intakes.get(replica.replica_id)
        if intake is not None:
            intake.restart()  # it may have restarted: rebuild from its replay buffer

    # --- requests ------------------------------------------------------------------------

    def exchange(self, endpoint: str, client_request_id: str | None = None) -> Exchange:
        """A request's record, stamped at its arrival and given its id (what ``complete``
        fills in and the access log writes)."""
        # the epoch is what the engines' queue order is stamped in
        return Exchange(
            endpoint,
            self.epoch.now(),
            self.clock.now(),
            request_id=self.request_id(),
            client_request_id=client_request_id,
        )

    async def complete(
        self,
        send: Send,
        path: str,
        api: Api,
        authorization: str | None,
        raw: bytes,
        exchange: Exchange,
    ) -> int:
        """Answers one completion (``raw``: its body, a request of ``api``) through ``send``;
        the HTTP status. ``exchange`` (from ``exchange()``) gets what happened to it."""
        tenant, body, model = self._opened(authorization, raw, exchange, model_required=True)
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ApiError(BAD_REQUEST, "'stream' must be a boolean", "stream")
        exchange.stream = stream
        if stream:
            exchange.hide_usage = api not in _CONVERTED and ask_usage(body)
            exchange.count_output = tenant.tokens_per_minute > 0
        home: ReplicaId | None = None
        if api == "messages":
            chat = self._messages_as_chat(body)
            max_tokens = _max_tokens(body, api)
            prompt = self.prompt(chat, True, self.seed(model, tenant.salt))
        elif api == "responses":
            chat = self._responses_as_chat(body)
            max_tokens = _max_tokens(body, api)
            prompt = self.prompt(chat, True, self.seed(model, tenant.salt))
            home = await self._home_of(body.get("previous_response_id"), tenant)
            exchange.stored = body.get("store", True) is not False
        else:
            max_tokens = _max_tokens(body, api)
            prompt = self.prompt(body, api == "chat", self.seed(model, tenant.salt))
        exchange.prompt_tokens = prompt.prompt_tokens
        exchange.tokenized = self.prompts.is_exact and prompt.whole is None
        charged = self.tenants.admit(tenant, prompt.prompt_tokens + max_tokens)
        status: int | None = None
        try:
            status = await self._forward(
                send, path, body, tenant, prompt, model, stream, max_tokens, exchange, api, home
            )
            return status
        finally:
            self.tenants.release(tenant)
            self._settle(tenant, charged, prompt.prompt_tokens, exchange, status)

    def _messages_as_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Messages request as the chat request its engine renders (vLLM converts it so);
        a 400 naming the field where it is malformed."""
        if "max_tokens" not in body:
            raise ApiError(BAD_REQUEST, "'max_tokens' is required", "max_tokens")
        try:
            return anthropic_request.chat_body(body, self._merge_inline_system)
        except RequestError as exc:
            raise ApiError(BAD_REQUEST, str(exc), exc.param) from None

    def _responses_as_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """A Responses request as the chat request its engine renders (vLLM converts it
        so); a 400 naming the field where it is malformed. With ``previous_response_id`` the
        engine renders the stored conversation before it: this is the new part only, and the
        request goes to the engine holding the rest (``homes``)."""
        try:
            return responses_request.chat_body(body)
        except RequestError as exc:
            raise ApiError(BAD_REQUEST, str(exc), exc.param) from None

    async def _home_of(self, response_id: object, tenant: Tenant) -> ReplicaId | None:
        """The replica holding ``response_id`` (a stored Responses answer), if this gateway
        or, with ``--state redis``, another passed it on; a 404 where it was another
        tenant's."""
        home = self.homes.get(response_id)
        if home is None and self.shared is not None and isinstance(response_id, str):
            home = await self.shared.home(response_id)
            if home is not None:
                self.homes.learn(response_id, *home)
        if home is None:
            return None
        replica, owner = home
        if owner != tenant.name:
            raise ApiError(
                NOT_FOUND, f"Response with id '{response_id}' not found.", "previous_response_id"
            )
        return replica

    async def pass_through(
        self,
        send: Send,
        path: str,
        authorization: str | None,
        raw: bytes,
        exchange: Exchange,
    ) -> int:
        """Answers one request of ``PASSED_THROUGH`` (``raw``: its body) through ``send``;
        the HTTP status. The tenant's key, concurrency and tokens per minute hold as for a
        completion (a pooling request is charged the prompt tokens its engine reports); a
        client's ``cache_salt`` never reaches an engine, and a pooling request carries the
        tenant's."""
        tenant, body, model = self._opened(authorization, raw, exchange, model_required=False)
        salt = tenant.salt if path in POOLING_PATHS else ""
        if salt or "cache_salt" in body:
            _own_salt(body, salt)
            raw = orjson.dumps(body)
        assert self.proxy is not None, "the app's lifespan has not started"
        charged = self.tenants.admit(tenant, 0)
        try:
            return await self.proxy.pass_through(send, path, raw, model, exchange)
        finally:
            self.tenants.release(tenant)
            prompt_tokens = exchange.engine_prompt_tokens or 0
            self.tenants.settle(tenant, charged, prompt_tokens)
            if prompt_tokens:
                self._count_usage(tenant.name, prompt_tokens, 0, None)

    async def stored_response(
        self,
        send: Send,
        method: str,
        path: str,
        response_id: str,
        authorization: str | None,
        exchange: Exchange,
    ) -> int:
        """Answers a request for a stored Responses answer (``GET /v1/responses/{id}``, its
        ``/cancel``) from the engine holding it: a 404 where this gateway passed no such
        answer on for the tenant, or its engine is down (the answer went with it)."""
        if self.draining:
            raise ApiError(UNAVAILABLE, "the gateway is draining", retry_after_s=1.0)
        tenant = self.tenants.authenticate(authorization)
        exchange.tenant = tenant.name
        home = await self._home_of(response_id, tenant)
        replica = None if home is None else self.replicas.get(home)
        if replica is None or not replica.is_up:
            raise ApiError(NOT_FOUND, f"Response with id '{response_id}' not found.")
        assert self.proxy is not None, "the app's lifespan has not started"
        return await self.proxy.stored(send, replica, method, path, exchange)

    def _opened(
        self, authorization: str | None, raw: bytes, exchange: Exchange, model_required: bool
    ) -> tuple[Tenant, dict[str, Any], str]:
        """A request's tenant, body and model, checked in the order its client is told what
        is wrong: the gateway draining, the key, the body, the model."""
        if self.draining:
            raise ApiError(UNAVAILABLE, "the gateway is draining", retry_after_s=1.0)
        tenant = self.tenants.authenticate(authorization)
        exchange.tenant = tenant.name
        body = json_object(raw)
        exchange.model = self._model_of(body, model_required)
        return tenant, body, exchange.model

    def _model_of(self, body: dict[str, Any], required: bool) -> str:
        """The served model a request names; where it names none and need not (vLLM's
        tokenizer and pooling requests), the one model the replicas serve."""
        model = body.get("model")
        if model is None and not required:
            models = self.replicas.models()
            if len(models) == 1:
                return models[0]
            raise ApiError(
                BAD_REQUEST,
                f"'model' is required: this gateway serves {len(models)} models",
                "model",
            )
        if not isinstance(model, str) or not model:
            raise ApiError(BAD_REQUEST, "'model' must be a non-empty string", "model")
        if not self.replicas.serves(model):
            raise ApiError(MODEL_NOT_FOUND, f"model {model!r} is not served here", "model")
        return model

    def _settle(
        self,
        tenant: Tenant,
        charged: int,
        prompt_tokens: int,
        exchange: Exchange,
        status: int | None,
    ) -> None:
        """Charges ``tenant`` what its request took, for ``charged`` at its admission
        (``status``: its answer's, None where it ended in an exception or a cancellation)."""
        completion = exchange.completion_tokens
        if completion is not None:
            # the engine's usage or, for a stream cut off before it, the tokens streamed
            # (``Proxy``): the prompt counts too, the engine having prefilled it
            prompt_tokens = exchange.engine_prompt_tokens or prompt_tokens
            self.tenants.settle(tenant, charged, prompt_tokens + completion)
            self._count_usage(tenant.name, prompt_tokens, completion, exchange.cached_tokens)
        elif status != 200 or exchange.stream:
            # refused (the engine's 4xx), failed (502, 503, 504) or cancelled before any
            # output: no engine wrote a token, and a prefill one began was aborted with the
            # request; the tenant is charged nothing
            self.tenants.settle(tenant, charged, 0)
        # else a whole answer without usage (an engine that reports none): the admission's
        # estimate stands

    def _count_usage(
        self, tenant: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None
    ) -> None:
        """A tenant's tokens as the engine reported them: its hit ratio is cached / prompt."""
        metrics = self.metrics
        metrics.child(metrics.tenant_tokens, tenant, "prompt").inc(prompt_tokens)
        metrics.child(metrics.tenant_tokens, tenant, "completion").inc(completion_tokens)
        if cached_tokens is not None:
            metrics.child(metrics.tenant_tokens, tenant, "cached").inc(cached_tokens)

    async def _forward(
        self,
        send: Send,
        path: str,
        body: dict[str, Any],
        tenant: Tenant,
        prompt: Prompt,
        model: str,
        stream: bool,
        max_tokens: int,
        exchange: Exchange,
        api: Api,
        home: ReplicaId | None,
    ) -> int:
        _own_salt(body, tenant.salt)
        # engine to engine, set by this gateway only: a client's would have an engine load
        # KV another request computed (another tenant's prompt), or take its prompt ids
        # (vLLM's decode-side prompt_token_ids) instead of what was hashed and charged
        body.pop("kv_transfer_params", None)
        route = self.route_request(prompt, tenant, max_tokens, exchange.request_id)
        assert self.proxy is not None, "the app's lifespan has not started"
        if self.shared is not None:
            match = await self.shared.match(prompt.hashes)
            if match is not None:
                route = dataclasses.replace(route, prefix_match=match)
        return await self.proxy.forward(
            send, path, body, route, model, stream, exchange, _DIALECTS[api], home
        )

    # --- admin -----------------------------------------------------------------------------

    def check_admin(self, authorization: str | None) -> None:
        if self._admin_hash is None:
            raise ApiError(FORBIDDEN, "the admin API is off (start with --admin-key)")
        if not self._is_admin(authorization):
            raise ApiError(FORBIDDEN, "admin key required")

    def _is_admin(self, authorization: str | None) -> bool:
        """The header bears the admin key: its hash against the one kept, in constant time."""
        key, kept = bearer_key(authorization), self._admin_hash
        return key is not None and kept is not None and hmac.compare_digest(hash_key(key), kept)

    def sees_detail(self, authorization: str | None) -> bool:
        """Whether ``/ready`` may show this caller each replica (URLs, load, event streams):
        anyone on a gateway without keys, only the admin key's holder where tenants or an
        admin key are configured (a tenant's client has no business with the fleet's
        layout; a readiness probe needs only the status)."""
        if self._admin_hash is None and self.config.api_keys is None:
            return True
        return self._is_admin(authorization)

    def reload(self) -> None:
        """SIGHUP: re-reads the config file and the keys file; replicas added or removed, the
        routing policy replaced when ``policy`` changed; the access log's file reopened (a
        changed ``access_log`` path takes a restart)."""
        if self.access_log is not None:
            self.access_log.reopen()
        path = self.config.config_path
        old_limits = self.tenants.limits
        try:
            new = load_config(path, dict(self.config.overrides)) if path else self.config
            policy = None
            if new.policy != self.config.policy:
                # built before anything changes: a bad spec keeps the whole running config
                policy = build_policy(self._policy_spec(new.policy), self.ctx)
            self.tenants.limits = new.limits  # the keys file's defaults: load reads them
            self.tenants.load(new.api_keys)  # all or nothing
        except Exception as exc:  # a SIGHUP must never take the gateway down
            self.tenants.limits = old_limits
            log.error(
                "reload failed, keeping the running config: %s",
                exc if isinstance(exc, KvtideError) else f"{type(exc).__name__}: {exc}",
            )
            return
        if policy is not None:
            # one assignment on the loop: the next request routes with it; the index and
            # its health stay (they live in the routing context), requests in flight finish
            # with the policy that routed them
            self.router.set_policy(policy)
            log.warning("policy %s -> %s", self.config.policy, new.policy)
            self.config = dataclasses.replace(self.config, policy=new.policy)
        wanted = {s.replica_id: s for s in new.replicas}
        if path:
            for r in list(self.replicas):
                if r.replica_id not in wanted:
                    self.remove_replica(r.replica_id)
            for rid, spec in wanted.items():
                if self.replicas.get(rid) is None:
                    self.add_replica(spec)
        self._admin_hash = _admin_hash(new)
        if self.pool is not None:
            self.pool.headers = _engine_headers(new)
        self._apply_limits(new.limits)
        self.config = dataclasses.replace(
            self.config, api_keys=new.api_keys, engine_key=new.engine_key, limits=new.limits
        )
        log.warning("reloaded %s", path or "the keys file")

    def _apply_limits(self, limits: Limits) -> None:
        """A reload's limits, into every part that holds a copy (before, only the keys
        file's tenants and the queue caps changed: the prompt limits and the keyless
        tenant's were read at start only)."""
        self.prompts.max_prompt_chars = limits.max_prompt_chars
        self.prompts.max_prompt_tokens = limits.max_prompt_tokens
        self.tenants.default.max_concurrency = limits.max_concurrency
        self.tenants.default.tokens_per_minute = limits.tokens_per_minute
        self.replicas.cap = limits.max_in_flight_per_replica
        self.admission.max_queued = limits.max_queued
        self.admission.release()  # a cap raised or lifted: waiters may go now

    # --- status ----------------------------------------------------------------------------

    def ready(self, detail: bool = True) -> tuple[bool, dict[str, Any]]:
        """Whether the gateway takes requests, and its status: with ``detail``, each
        replica's and the state store's; without, counts only (``sees_detail``)."""
        # full or in slow start, a replica is still routable; ready once it has answered
        routable = sum([r.is_up and r.answered for r in self.replicas])
        is_ready = routable > 0 and not self.draining
        shared = self.shared
        if not detail:
            return is_ready, {
                "ready": is_ready,
                "draining": self.draining,
                "replicas_routable": routable,
                "replicas_total": len(self.replicas),
                "state_ok": shared is None or not shared.degraded,
            }
        replicas = []
        for r in self.replicas:
            intake = self.intakes.get(r.replica_id)
            replicas.append(
                {
                    "id": r.replica_id,
                    "url": r.url,
                    "models": sorted(r.models),
                    "role": r.spec.role,
                    "up": not r.is_down,
                    "answered": r.answered,
                    "draining": r.draining,
                    "in_flight": r.in_flight,
                    # prompt tokens sent there whose prefill has not come back yet: the
                    # queue the cost policy estimates (first token, or first chunk past the
                    # role, ends a request's share)
                    "queued_prefill_tokens": r.state.queued_prefill_tokens,
                    "slow_start": r.allowance,
                    # false for a while after it refused the router's priority (FCFS engine)
                    "takes_priority": r.takes_priority(self.clock.now()),
                    "events": None
                    if intake is None
                    else {"connected": intake.is_connected, **dataclasses.asdict(intake.stats)},
                }
            )
        state: dict[str, Any] = {"kind": "local", "ok": True}
        if shared is not None:
            state = {
                "kind": "redis",
                "ok": not shared.degraded,
                "degraded": shared.degraded,
                "intakes_held": sorted(shared.owned),
                "errors": shared.num_errors,
            }
        return is_ready, {
            "ready": is_ready,
            "draining": self.draining,
            "mode": "tokens" if self.prompts.is_exact else "text",
            "policy": self.config.policy,
            "replicas": replicas,
            "state": state,
        }

    # --- lifespan ----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        t = self.config.timeouts
        self.pool = pool = UpstreamPool(t.connect_s, t.read_s, headers=_engine_headers(self.config))
        self.proxy = Proxy(
            self.replicas,
            self.router,
            pool,
            self.metrics,
            self.clock.now,
            self.choose,
            self.admission,
            self.homes,
        )
        self.checker = HealthChecker(
            self.replicas, pool, self.clock.now, t.health_s, self._on_down, self._on_up
        )

        self.checker.on_scraped = self._on_scraped  # the engines' kvtide_cache_* counters
        self.checker.on_models = self._on_models
        await asyncio.gather(*(self.checker.discover(r) for r in self.replicas))
        for r in self.replicas:
            self.metrics.healthy.labels(r.replica_id).set(1)
        try:
            async with asyncio.TaskGroup() as tg:
                self.task_group = tg
                for r in self.replicas:
                    self._start_intake(r)
                f = self.config.failover
                loops = [
                    tg.create_task(_every(f.health_interval_s, self.checker.check_all)),
                    tg.create_task(_every(f.scrape_interval_s, self.checker.scrape_all)),
                ]
                if self.access_log is not None:
                    loops.append(tg.create_task(self.access_log.run()))
                if self.shared is not None:
                    await self._maintain_shared()
                    loops.append(tg.create_task(_every(1.0, self._maintain_shared)))
                    loops.append(tg.create_task(self.shared.write_homes()))
                    if self.shared.shadow:
                        loops.append(tg.create_task(self.shared.write_decisions()))
                yield
                for task in [*loops, *self.intake_tasks.values()]:
                    task.cancel()
        finally:
            self.task_group = None
            for intake in self.intakes.values():
                intake.close()  # its run ended (cancelled above): its poll was woken
            await pool.close()
            if self.shared is not None:
                await self.shared.close()
            if self.access_log is not None:
                await self.access_log.close()  # the drained requests' lines too


def _engine_headers(config: GatewayConfig) -> bytes:
    """The header line every call to an engine carries: its key, where it wants one."""
    key = config.engine_key
    return b"" if key is None else b"Authorization: Bearer %s\r\n" % key.encode()


def _admin_hash(config: GatewayConfig) -> str | None:
    """The admin key's SHA-256 in hex, from the key or as the config gives it (None: the
    admin API is off). Only the hash is kept, as the tenants' keys are (``hash_key``)."""
    if config.admin_key is not None:
        return hash_key(config.admin_key)
    if config.admin_key_sha256 is not None:
        return config.admin_key_sha256.lower()
    return None


async def _retire(task: asyncio.Task[None], intake: EventIntake) -> None:
    """A removed replica's intake: its sockets and thread closed once its run has ended (a
    re-added replica gets a new intake; without this the old one's stayed open)."""
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.to_thread(intake.close)  # waits for the worker's last (woken) poll


async def _every(period_s: float, fn: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await fn()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background loop %s failed; continuing", fn)


def _own_salt(body: dict[str, Any], salt: str) -> None:
    """The client's ``cache_salt`` never reaches an engine: the tenant's secret salt does
    (none for the keyless default tenant)."""
    body.pop("cache_salt", None)
    if salt:
        body["cache_salt"] = salt


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(BAD_REQUEST, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(BAD_REQUEST, "the body must be a JSON object")
    return body


def _max_tokens(body: dict[str, Any], api: Api) -> int:
    """The completion tokens a request may take, read as the engines read them: a chat
    request's ``max_completion_tokens``, else its ``max_tokens``; a completion's
    ``max_tokens`` alone (vLLM and kvtide engine ignore ``max_completion_tokens`` there); a
    Responses request's ``max_output_tokens``. Unset: 16, a completion's default, and
    otherwise an estimate that the request is settled on once its tokens are known
    (``Gateway._settle``)."""
    for key in _MAX_TOKENS_KEYS[api]:
        value = body.get(key)
        if value is None:
            continue
        if type(value) is not int or value < 1:
            raise ApiError(BAD_REQUEST, f"'{key}' must be an integer >= 1", key)
        return value
    return 16


_MAX_TOKENS_KEYS: dict[Api, tuple[str, ...]] = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completions": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "messages": ("max_tokens",),
}
"""Where each API's engine reads its token limit."""
