"""bench/gateways.py's hot and overhead phases: how the hot samples are counted and summed
over rounds, that the drain after the last send is told apart from the sending, and that the
overhead phase sends the requests it asks for."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import aiohttp
from aiohttp import web

import gateways  # bench/gateways.py: tests/conftest.py puts bench/ on sys.path
from kvtide.clock import ManualClock
from kvtide.engine_server.metrics import EngineMetrics
from kvtide.gateway.metrics import GatewayMetrics
from kvtide.gateway.telemetry import GatewayTelemetry
from kvtide.routing.consistency import IndexHealth
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.types import ReplicaId

MAX_SEQS = 4
BUSY, IDLE, QUEUED = (4.0, 0.0), (0.0, 0.0), (4.0, 3.0)
STEP = (2.0, 1.0)  # one request arrived during an iteration, slots free: waiting, not queued


def test_count_samples_counts_an_idle_engine_only_beside_a_queue() -> None:
    samples = [
        (True, [BUSY, BUSY], 0.0),  # no queue
        (True, [IDLE, BUSY], 0.0),  # idle, but nobody waits
        (True, [QUEUED, BUSY], 0.0),  # a queue, every engine busy
        (True, [QUEUED, IDLE], 0.0),  # idle beside a queue, while sending
        (False, [QUEUED, IDLE], 0.0),  # ... in the drain
        (False, [(0.0, 5.0), BUSY], 0.0),  # an engine waiting with none running is not idle
        (True, [BUSY, IDLE], 0.0),  # the gateway's own queue empty: nobody waits
        (True, [BUSY, IDLE], 3.0),  # idle beside requests waiting at the gateway
        (True, [BUSY, BUSY], 3.0),  # waiting at the gateway, every engine busy
        (True, [STEP, IDLE], 0.0),  # idle beside a request waiting for the next iteration
        (True, [(3.0, 1.0), BUSY], 0.0),  # slots full once it starts: still no queue
        (True, [(3.0, 2.0), IDLE], 0.0),  # one more than the slots: idle beside a queue
    ]
    assert gateways.count_samples(samples, MAX_SEQS) == {
        "samples": 12,
        "samples_sending": 10,
        "samples_with_queue": 7,
        "samples_idle_while_queued": 4,
        "samples_idle_while_queued_sending": 3,
        "samples_with_waiting": 9,
        "samples_idle_while_waiting": 5,
    }


def test_summed_hot_row_sums_every_count_and_takes_medians() -> None:
    def run(idle_sending: int, p50: float | None) -> dict[str, object]:
        counts = gateways.count_samples(
            [(True, [QUEUED, IDLE], 0.0)] * idle_sending
            + [(False, [QUEUED, IDLE], 0.0), (True, [STEP, IDLE], 0.0)],
            MAX_SEQS,
        )
        ttft = {"p50": p50, "p99": None if p50 is None else 2 * p50}
        return {
            "requests": 10,
            "errors": 1,
            "share_per_engine": [0.25, 0.75],
            "ttft_s": ttft,
            **counts,
        }

    rows = [run(1, 0.010), run(2, 0.030), run(0, None)]
    out = gateways.summed_hot_row(rows)
    assert (out["requests"], out["errors"], out["samples"]) == (30, 3, 9)
    assert (out["samples_sending"], out["samples_idle_while_queued_sending"]) == (6, 3)
    assert out["samples_idle_while_queued"] == 6
    assert (out["samples_with_waiting"], out["samples_idle_while_waiting"]) == (9, 9)
    assert out["share_per_engine"] == [0.25, 0.75]
    assert out["ttft_s"] == {"p50": 0.020, "p99": 0.040}  # runs without a TTFT left out
    assert out["runs"] == rows


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    """``app`` on a free loopback port: its runner (to clean up) and the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def test_drive_says_when_the_last_request_is_sent_before_the_answers_end() -> None:
    answered: list[float] = []
    marks: dict[str, float] = {}

    async def slow(request: web.Request) -> web.StreamResponse:
        await request.read()
        await asyncio.sleep(0.3)
        answered.append(time.monotonic())
        return web.Response(text="data: [DONE]\n\n", content_type="text/event-stream")

    async def main() -> int:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", slow)
        runner, port = await _serve(app)
        try:
            outs = await gateways.drive(
                lambda i: f"http://127.0.0.1:{port}",
                [{"messages": []}] * 5,
                rate=200.0,
                seed=0,
                on_all_sent=lambda: marks.setdefault("sent", time.monotonic()),
            )
        finally:
            await runner.cleanup()
        marks["returned"] = time.monotonic()
        return len(outs)

    assert asyncio.run(main()) == 5
    assert len(answered) == 5
    assert marks["sent"] < min(answered)  # 5 sends at 200/s take ~25 ms, each answer 300
    assert max(answered) <= marks["returned"]


def _served(m: EngineMetrics, reason: str, prompt_tokens: int, cached_tokens: int) -> None:
    """One request of 8 output tokens through ``m``, as the engine's request stream counts it."""
    m.prefilled(prompt_tokens, cached_tokens)
    m.first_token(0.05)
    for _ in range(7):
        m.inter_token(0.01)
    m.ended(reason, 0.1)


def test_the_workloads_phase_reads_each_engines_share_from_its_metrics() -> None:
    """Two engines' real /metrics bodies (EngineMetrics, as `kvtide engine` serves them) over
    HTTP: requests, prompt tokens and cached tokens per engine, and the queue samples."""
    busy = EngineMetrics("emu")
    busy.bind_gauges(lambda: 4.0, lambda: 3.0, lambda: 0.5)
    for _ in range(3):
        _served(busy, "stop", prompt_tokens=1000, cached_tokens=750)
    quiet = EngineMetrics("emu")
    _served(quiet, "length", prompt_tokens=1000, cached_tokens=0)

    async def main() -> list[dict[str, float]]:
        runners, engines = [], []
        for m in (busy, quiet):

            async def metrics(_r: web.Request, m: EngineMetrics = m) -> web.Response:
                return web.Response(body=m.render())

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner, port = await _serve(app)
            runners.append(runner)
            engines.append(SimpleNamespace(url=f"http://127.0.0.1:{port}"))
        try:
            async with aiohttp.ClientSession() as s:
                return await gateways.scrape_engines(s, engines)  # type: ignore[arg-type]
        finally:
            for r in runners:
                await r.cleanup()

    final = asyncio.run(main())
    assert [(f["served"], f["prompt_tokens"], f["cached_tokens"]) for f in final] == [
        (3.0, 3000.0, 2250.0),
        (1.0, 1000.0, 0.0),
    ]
    assert (final[0]["running"], final[0]["waiting"]) == (4.0, 3.0)
    samples = [[(4.0, 3.0), (0.0, 0.0)], [(4.0, 1.0), (2.0, 0.0)], [(1.0, 0.0), (0.0, 0.0)]]
    out = gateways.engine_shares(final, samples)
    assert out["request_share"] == [0.75, 0.25]
    assert out["prompt_share"] == [0.75, 0.25]
    assert out["cached_ratio"] == [0.75, 0.0]
    assert out["waiting_mean"] == [4 / 3, 0.0] and out["waiting_max"] == [3.0, 0.0]
    # a queue in two samples, an idle engine beside it in the first only
    assert (out["samples"], out["samples_with_queue"], out["samples_idle_while_queued"]) == (
        3,
        2,
        1,
    )
    assert "0.75 0.25" in gateways.engine_line(out)


def test_the_workloads_phase_reads_a_kvtide_gateways_decisions_by_reason() -> None:
    """The real gateway metrics (GatewayMetrics with its telemetry, as `kvtide serve` renders
    them) over HTTP: decisions summed over replicas for each reason, and the index's
    predicted, reported and evicted-while-queued cached tokens."""
    m = GatewayMetrics()
    for replica, reason, n in (("e0", "hot", 3), ("e1", "hot", 2), ("e1", "affinity", 4)):
        m.child(m.decisions, replica, reason).inc(n)
    m.child(m.requests, "chat", "200").inc(9)  # another family: not counted
    health = IndexHealth()
    health.report(ReplicaId("e0"), 640, 160, evicted_queued=True)
    health.report(ReplicaId("e1"), 320, 320)
    m.attach(GatewayTelemetry(health, GlobalPrefixIndex(), ManualClock()).exposition)

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        async def metrics(_r: web.Request) -> web.Response:
            return web.Response(body=m.render())

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner, port = await _serve(app)
        try:
            return await gateways.gateway_decisions(f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    decisions, index = asyncio.run(main())
    assert decisions == {"hot": 5, "affinity": 4}
    assert index == {"predicted_tokens": 960, "reported_tokens": 480, "evicted_queued_tokens": 480}


def test_the_overhead_phase_gets_as_many_bodies_as_it_asks_for() -> None:
    """Its 1,000 requests were 141 before run 25 (the workload's 48 sessions ran out), and its
    CPU per request was divided by 1,000."""
    for n in (10, 1000):
        bodies = gateways.chat_bodies(n, 0, 2)
        assert len(bodies) == n
        assert all(b["messages"] and b["max_tokens"] == 2 for b in bodies)
    # later turns carry their conversation, not first turns only
    assert max(len(b["messages"]) for b in bodies) > 2
