"""Every stream's usage reaches the gateway, whether or not the client asked for it: the
engine gets ``stream_options.include_usage``, the gateway reads the usage event into its
index health, metrics and access log, and a client that did not ask gets the stream it would
have got without the gateway. Through a real gateway process, the official ``openai`` client,
and both a test backend and a real ``kvtide engine``."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import openai
import pytest
from engine_process import Engine
from tests.integration.gateway.procs import (
    Proc,
    access_log_lines,
    backend,
    backend_stats,
    emulated_engines,
    free_port,
    gateway,
    openai_client,
)

pytestmark = [pytest.mark.timeout(120)]

HISTORY = "The harbour master logs every vessel's draught, cargo and berth. " * 20


def _metric(port: int, series: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {series} in /metrics")


def _tenant(port: int, kind: str) -> float:
    return _metric(port, f'kvtide_gateway_tenant_tokens_total{{kind="{kind}",tenant="default"}}')


def test_the_gateway_reads_the_usage_of_a_stream_the_client_did_not_ask_for(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.jsonl"
    bport, port = free_port(), free_port()
    be = backend(bport, "m")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}", "--access-log", str(log))
    try:
        c = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "user", "content": HISTORY}]
        plain = list(c.chat.completions.create(
            model="m", messages=messages, max_tokens=4, stream=True))  # type: ignore[arg-type]  # fmt: skip
        asked = list(c.chat.completions.create(
            model="m", messages=messages, max_tokens=4, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True}))  # fmt: skip
        with pytest.raises(openai.BadRequestError) as bad:
            c.chat.completions.create(
                model="m",
                messages=messages,
                max_tokens=4,
                stream=True,  # type: ignore[arg-type]
                extra_body={"stream_options": "please"},
            )
        c.chat.completions.create(model="m", messages=messages, max_tokens=4)  # type: ignore[arg-type]
        lines = access_log_lines(log, 4)
        bodies = backend_stats(bport)["bodies"]
        reported = _metric(port, "kvtide_router_reported_cached_tokens_total")
        by_tenant = {kind: _tenant(port, kind) for kind in ("prompt", "cached", "completion")}
    finally:
        gw.stop()
        be.stop()
    # the client that did not ask gets no usage, every chunk with its choice
    assert all(ch.usage is None and ch.choices for ch in plain)
    assert "".join(ch.choices[0].delta.content or "" for ch in plain) == "tok " * 4
    assert plain[-1].choices[0].finish_reason == "length"
    # the one that asked gets it, as the engine sent it
    assert asked[-1].usage is not None and asked[-1].choices == []
    assert [ch.model_dump(exclude={"usage"}) for ch in asked[:-1]] == [
        ch.model_dump(exclude={"usage"}) for ch in plain
    ]
    # the engine was asked both times; a non-streamed request carries no stream_options
    assert [b.get("stream_options") for b in bodies] == [
        {"include_usage": True}, {"include_usage": True}, None]  # fmt: skip
    assert bad.value.status_code == 400 and bad.value.body["param"] == "stream_options"  # type: ignore[index]
    # the gateway knows what the engine reused for both streams
    first, second, refused, whole = lines
    assert first["cached_tokens"] == 0 and second["cached_tokens"] > 0
    assert first["engine_prompt_tokens"] == second["engine_prompt_tokens"] > 0
    assert first["completion_tokens"] == second["completion_tokens"] == 4
    assert refused["status"] == 400 and whole["cached_tokens"] > 0
    assert reported == second["cached_tokens"] + whole["cached_tokens"]
    # the tenant's tokens as the engine reported them, every answer counted
    answered = (first, second, whole)
    assert by_tenant == {
        "prompt": sum(line["engine_prompt_tokens"] for line in answered),
        "cached": sum(line["cached_tokens"] for line in answered),
        "completion": sum(line["completion_tokens"] for line in answered),
    }


def test_usage_in_every_chunk_reaches_the_client_and_is_counted_once(tmp_path: Path) -> None:
    """An engine that sends usage unasked in every chunk (vLLM's force-include): the client
    gets it as the engine sent it; the router, the tenant's tokens and the access log count
    the request's cached tokens once, not once a chunk."""
    log = tmp_path / "access.jsonl"
    bport, port = free_port(), free_port()
    be = backend(bport, "m", "--usage-every-chunk")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}", "--access-log", str(log))
    try:
        c = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        for _ in range(2):  # the second shares the first's prompt: cached tokens > 0
            chunks = list(c.completions.create(model="m", prompt=HISTORY, max_tokens=5,
                                               stream=True))  # fmt: skip
        lines = access_log_lines(log, 2)
        reported = _metric(port, "kvtide_router_reported_cached_tokens_total")
        cached = _tenant(port, "cached")
        completion = _tenant(port, "completion")
    finally:
        gw.stop()
        be.stop()
    assert [ch.usage.completion_tokens for ch in chunks if ch.usage] == [1, 2, 3, 4, 5, 5]
    assert lines[1]["cached_tokens"] > 0 and lines[1]["completion_tokens"] == 5
    assert reported == cached == lines[1]["cached_tokens"]
    assert completion == 10


@pytest.mark.slow
def test_a_real_engines_stream_reaches_the_client_as_the_engine_sends_it_less_the_usage(
    tmp_path: Path,
) -> None:
    """A `kvtide engine` sends its last token, the usage and [DONE] in one write: the client
    gets the same text and finish as straight from the engine, without the usage, and the
    gateway's access log has the engine's prompt and cached tokens for each turn."""
    log = tmp_path / "access.jsonl"
    engines: list[Engine] = []
    gw: Proc | None = None
    try:
        engines += emulated_engines(1)
        e = engines[0]
        port = free_port()
        gw = gateway(
            port, "--replica", f"{e.url}=emu,events={e.events},replay={e.replay}",
            "--tokenizer", "smollm2", "--access-log", str(log),
        )  # fmt: skip
        via = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        direct = openai_client(base_url=f"{e.url}/v1", api_key="x", max_retries=0)
        system = {"role": "system", "content": HISTORY}
        got = []
        for i in range(3):
            question = {"role": "user", "content": f"Which berth is free at {i} o'clock?"}
            chunks = list(via.chat.completions.create(
                model="emu", messages=[system, question], max_tokens=6, stream=True))  # type: ignore[list-item]  # fmt: skip
            got.append(chunks)
            time.sleep(0.3)  # the engine's KV events in before the next turn routes
        straight = list(direct.chat.completions.create(
            model="emu", messages=[system, question], max_tokens=6, stream=True))  # type: ignore[list-item]  # fmt: skip
        lines = access_log_lines(log, 3)
    finally:
        if gw is not None:
            gw.stop()
        for engine in engines:
            engine.stop()

    def shape(chunks: list) -> list:
        return [(ch.choices[0].delta.content, ch.choices[0].finish_reason) for ch in chunks]

    for chunks in got:
        assert all(ch.usage is None and ch.choices for ch in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
    assert shape(got[-1]) == shape(straight)
    # the first prompt, held nowhere, was routed on its head (gateway.heads): its count is
    # an estimate; the turns after it were tokenized whole, as the engine did
    assert [line["tokenized"] for line in lines] == [False, True, True]
    first = lines[0]
    assert (
        abs(first["prompt_tokens"] - first["engine_prompt_tokens"])
        <= 0.25 * first["engine_prompt_tokens"]
    )
    assert all(line["engine_prompt_tokens"] == line["prompt_tokens"] > 0 for line in lines[1:])
    assert all(line["completion_tokens"] == 6 for line in lines)
    assert lines[0]["cached_tokens"] is not None
    assert all(line["cached_tokens"] > 0 for line in lines[1:])
