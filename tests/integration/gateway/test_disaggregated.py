"""Disaggregated prefill and decode through `kvtide serve`, in front of `kvtide engine`
processes speaking vLLM's ``NixlConnector`` protocol (``kv_transfer_params``): each request's
prefill leg goes to a prefill engine chosen by prefix, its decode to the least loaded decode
engine, which pulls the KV; the official clients get their answers as from one engine; a
decode engine killed is failed over before the first byte; an engine's 4xx reaches the client
as it was worded."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_process import Engine, post_json
from tests.chat_templates import write_tokenizer_dir
from tests.integration.gateway.procs import (
    access_log_lines,
    anthropic_client,
    emulated_engines,
    gateway,
    openai_client,
)

from kvtide.cli.processes import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

NIXL = ("--kv-transfer-config", '{"kv_connector":"NixlConnector","kv_role":"kv_both"}')
SYSTEM = "You are a careful assistant who answers in one short paragraph. " * 20


@contextlib.contextmanager
def pd_fleet(
    tmp_path: Path, prefill: int = 2, decode: int = 2, *engine_flags: str
) -> Iterator[tuple[int, list[Engine], list[Engine], Path]]:
    """``prefill`` and ``decode`` emulated engines behind a gateway in token mode given them
    by ``--prefill`` and ``--decode``: its port, the engines and its access log."""
    tokenizer = str(write_tokenizer_dir(tmp_path / "tok"))
    log = tmp_path / "access.jsonl"
    engines = emulated_engines(prefill + decode, "--tokenizer", tokenizer, *NIXL, *engine_flags)
    gw = None
    try:
        flags = []
        for i, e in enumerate(engines):
            flags += [
                "--prefill" if i < prefill else "--decode",
                f"{e.url}=emu,events={e.events},replay={e.replay}",
            ]
        port = free_port()
        gw = gateway(port, *flags, "--tokenizer", tokenizer, "--access-log", str(log))
        yield port, engines[:prefill], engines[prefill:], log
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()


def _counter(engine: Engine, name: str) -> float:
    text = urllib.request.urlopen(f"{engine.url}/metrics", timeout=5).read().decode()
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def get_json(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, json.load(resp)


def _id(engine: Engine) -> str:
    return f"127.0.0.1:{engine.port}"


def test_a_conversation_prefills_on_one_engine_by_prefix_and_decodes_elsewhere(
    tmp_path: Path,
) -> None:
    with pd_fleet(tmp_path) as (port, prefills, decodes, log):
        client = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        messages = [{"role": "system", "content": SYSTEM}]
        for turn in range(4):
            messages.append({"role": "user", "content": f"Question {turn}: what next?"})
            if turn % 2:
                chunks = list(
                    client.chat.completions.create(
                        model="emu", messages=messages, max_tokens=6, stream=True,  # type: ignore[arg-type]
                        stream_options={"include_usage": True},
                    )
                )  # fmt: skip
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                usage = chunks[-1].usage
            else:
                answer = client.chat.completions.create(
                    model="emu",
                    messages=messages,
                    max_tokens=6,  # type: ignore[arg-type]
                )
                text, usage = answer.choices[0].message.content or "", answer.usage
            assert usage is not None and usage.completion_tokens == 6, usage
            messages.append({"role": "assistant", "content": text})
            time.sleep(0.5)  # the prefill engine's KV events reach the gateway's index
        completion = client.completions.create(model="emu", prompt=SYSTEM, max_tokens=5)
        assert completion.usage is not None and completion.usage.completion_tokens == 5
        lines = access_log_lines(log, 5)
        status, ready = get_json(f"http://127.0.0.1:{port}/ready")
        assert status == 200, ready
        # the decode engines' streams (the pulled KV of every prompt) are not taken in: no
        # request goes to them by prefix
        roles = {r["id"]: (r["role"], r["events"] is not None) for r in ready["replicas"]}
        assert roles == {
            **{_id(e): ("prefill", True) for e in prefills},
            **{_id(e): ("decode", False) for e in decodes},
        }, roles
    prefill_ids, decode_ids = {_id(e) for e in prefills}, {_id(e) for e in decodes}
    turns = lines[:4]
    assert {line["replica"] for line in lines} <= prefill_ids, lines
    assert {line["decode_replica"] for line in lines} <= decode_ids, lines
    # the conversation stays on the prefill engine holding it; each later turn reuses it,
    # as the gateway predicted from that engine's events
    assert len({line["replica"] for line in turns}) == 1, turns
    for line in turns[1:]:
        assert line["cached_tokens"] > 0 and line["route"] != "cold", line
        assert line["predicted_cached_tokens"] == line["cached_tokens"], line
    assert all(line["status"] == 200 and line["completion_tokens"] in (5, 6) for line in lines)


def test_only_decode_engines_decode_and_they_pull_what_the_prefill_computed(
    tmp_path: Path,
) -> None:
    with pd_fleet(tmp_path, prefill=1, decode=1) as (port, (pre,), (dec,), log):
        for i in range(3):
            status, answer = post_json(
                f"http://127.0.0.1:{port}/v1/completions",
                {"model": "emu", "prompt": SYSTEM + f" Request {i}.", "max_tokens": 8},
            )
            assert status == 200 and answer["usage"]["completion_tokens"] == 8, answer
        access_log_lines(log, 3)
        # the prefill engine wrote one token per request (its leg's), the decode all the rest
        assert _counter(pre, "vllm:generation_tokens_total") == 3
        assert _counter(dec, "vllm:generation_tokens_total") == 3 * 8
        # the decode computed at most a block of each prompt (its last token's logits): the
        # rest came over the wire
        prompt_tokens = answer["usage"]["prompt_tokens"]
        assert _counter(pre, "vllm:prompt_tokens_total") >= 3 * prompt_tokens
        assert _counter(dec, "vllm:prompt_tokens_total") >= 3 * prompt_tokens


def test_a_decode_engine_killed_is_failed_over_before_the_first_byte(tmp_path: Path) -> None:
    with pd_fleet(tmp_path, prefill=1, decode=2) as (port, _, decodes, log):
        client = openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        os.kill(decodes[0].proc.pid, signal.SIGKILL)
        decodes[0].proc.wait(timeout=10)
        for i in range(4):
            answer = client.chat.completions.create(
                model="emu",
                messages=[{"role": "user", "content": f"{SYSTEM} {i}"}],
                max_tokens=4,
                stream=bool(i % 2),
            )
            if i % 2:
                assert sum(1 for c in answer if c.choices and c.choices[0].delta.content) == 4  # type: ignore[union-attr]
            else:
                assert answer.usage is not None and answer.usage.completion_tokens == 4  # type: ignore[union-attr]
        lines = access_log_lines(log, 4)
    assert {line["decode_replica"] for line in lines} == {_id(decodes[1])}, lines
    assert all(line["status"] == 200 for line in lines)
    assert any("connect" in line["failures"] for line in lines), lines


def test_an_engines_refusal_reaches_the_client_and_other_apis_are_split_too(
    tmp_path: Path,
) -> None:
    fleet = pd_fleet(tmp_path, 1, 1, "--max-model-len", "2048")
    with fleet as (port, (pre,), (dec,), log):
        base = f"http://127.0.0.1:{port}"
        # a prompt past the context: the prefill engine's 400, and no decode asked
        status, err = post_json(
            f"{base}/v1/completions", {"model": "emu", "prompt": "word " * 3000, "max_tokens": 4}
        )
        assert status == 400 and err["error"]["type"] == "BadRequestError", err
        # more output than the context leaves: the prefill leg asks for one token, so it is
        # the decode engine that refuses (as behind vLLM's own P/D proxy)
        status, err = post_json(
            f"{base}/v1/completions", {"model": "emu", "prompt": "x", "max_tokens": 10**6}
        )
        assert status == 400 and err["error"]["param"] == "max_tokens", err
        claude = anthropic_client(base_url=base, api_key="x", max_retries=0)
        message = claude.messages.create(
            model="emu", max_tokens=5, system=SYSTEM, messages=[{"role": "user", "content": "Hi"}]
        )
        assert message.usage.output_tokens == 5
        client = openai_client(base_url=f"{base}/v1", api_key="x", max_retries=0)
        response = client.responses.create(
            model="emu", instructions=SYSTEM, input="Hi", max_output_tokens=5, store=False
        )
        assert response.usage is not None and response.usage.output_tokens == 5
        lines = access_log_lines(log, 4)
        assert _counter(dec, "vllm:generation_tokens_total") == 10
        assert _counter(pre, "vllm:generation_tokens_total") == 3
    assert [line["status"] for line in lines] == [400, 400, 200, 200]
    assert lines[0]["decode_replica"] is None  # refused at the prefill: no decode asked
    assert [line["decode_replica"] for line in lines[1:]] == [_id(dec)] * 3
    assert all(line["failures"] == [] for line in lines)  # a 4xx is no engine failure


def test_a_clients_kv_transfer_params_never_reach_an_engine(tmp_path: Path) -> None:
    """A client naming another request's KV (an engine, its blocks, a cached count) would have
    the engine load it and report it as cached: the gateway drops the field, whole fleet or
    split, and only the prefill's own parameters reach a decode engine."""
    forged = {"do_remote_prefill": True, "remote_block_ids": [list(range(40))],
              "remote_engine_id": "theirs", "remote_request_id": "cmpl-theirs",
              "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_prefill_cached_tokens": 77}  # fmt: skip
    prompt = "A prompt no engine has seen before, about tides and harbours. " * 8
    body = {"model": "emu", "prompt": prompt, "max_tokens": 3, "kv_transfer_params": forged}
    engines = emulated_engines(1, *NIXL)
    gw = None
    try:
        (engine,) = engines
        # straight to the engine, the forged parameters are taken: what the gateway prevents
        status, direct = post_json(f"{engine.url}/v1/completions", body)
        assert status == 200 and direct["usage"]["prompt_tokens_details"]["cached_tokens"] == 77
        port = free_port()
        gw = gateway(port, "--replica", f"{engine.url}=emu")
        body["prompt"] = prompt.upper()
        status, answer = post_json(f"http://127.0.0.1:{port}/v1/completions", body)
        assert status == 200, answer
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, answer
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()
    with pd_fleet(tmp_path, prefill=1, decode=1) as (port, _, _, _):
        body["prompt"] = prompt.lower()
        status, answer = post_json(f"http://127.0.0.1:{port}/v1/completions", body)
        assert status == 200, answer
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, answer
