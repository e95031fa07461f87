"""`kvtide engine` over real sockets, against what vLLM 0.33 does: stop strings end a request at
the token that completes them (its text, usage and metrics agree, streamed or not), max_tokens
is clamped to the context left, fields that change a response's shape are honoured or refused,
and token counters move as the engine processes tokens, not when requests end."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest
from engine_process import Engine, engine_client, running_engine
from prometheus_client.parser import text_string_to_metric_families

MODEL = "emu"
MAX_LEN = 256
# the filler the engine emits, one token per word: " the", " tide", " came", " in", ...
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(
        "--speedup", "1000", "--served-model-name", MODEL, "--max-model-len", str(MAX_LEN),
    ) as eng:  # fmt: skip
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    with engine_client(engine) as client:
        yield client


def _counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            key = s.name + "".join(f"|{v}" for k, v in s.labels.items() if k == "finished_reason")
            out[key] = s.value
    return out


# --- stop strings -----------------------------------------------------------------------------


def test_a_stop_string_across_two_tokens_streams_what_the_unary_answer_says(
    client: openai.OpenAI,
) -> None:
    # "e t" spans " the" and " tide": the stream must not send the "e" before it knows
    kw = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "stop": ["e t"]}
    unary = client.completions.create(**kw)  # type: ignore[call-overload]
    streamed = client.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    chunks = [c for c in streamed if c.choices]
    assert unary.choices[0].text == " th"
    assert "".join(c.choices[0].text for c in chunks) == " th"
    assert chunks[-1].choices[0].finish_reason == "stop"

    ckw = {"model": MODEL, "messages": HI, "max_tokens": 8, "stop": "e t"}
    chat = client.chat.completions.create(**ckw)  # type: ignore[call-overload]
    chat_stream = [c for c in client.chat.completions.create(**ckw, stream=True) if c.choices]  # type: ignore[call-overload]
    assert chat.choices[0].message.content == " th"
    assert "".join(c.choices[0].delta.content or "" for c in chat_stream) == " th"
    final = chat_stream[-1].choices[0]
    assert final.finish_reason == "stop"
    assert final.model_extra is not None and final.model_extra["stop_reason"] == "e t"


def test_usage_counts_tokens_up_to_the_one_completing_the_stop_string(
    client: openai.OpenAI, engine: Engine
) -> None:
    """The engine makes several tokens per wake-up at this speed: the ones after the stop's
    must count nowhere (vLLM stops at " came", the 3rd token)."""
    before = _counters(engine.url)
    for i in range(12):
        out = client.completions.create(
            model=MODEL, prompt=f"Hello {i}", max_tokens=200, stop=" came"
        )
        assert out.choices[0].text == " the tide"
        assert out.usage is not None and out.usage.completion_tokens == 3
    for i in range(4):
        chunks = list(
            client.completions.create(
                model=MODEL,
                prompt=f"Bye {i}",
                max_tokens=200,
                stop=" came",
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    after = _counters(engine.url)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 48


def test_a_stop_string_in_the_last_allowed_token_counts_as_stop(
    client: openai.OpenAI, engine: Engine
) -> None:
    before = _counters(engine.url)
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, stop="tide")
    after = _counters(engine.url)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == " the "
    key = "vllm:request_success_total|"
    assert after[key + "stop"] - before[key + "stop"] == 1
    assert after[key + "length"] == before[key + "length"]


def test_include_stop_str_in_output_keeps_the_stop_string(client: openai.OpenAI) -> None:
    kw = {
        "model": MODEL,
        "prompt": "Hello",
        "max_tokens": 8,
        "stop": ["tide"],
        "extra_body": {"include_stop_str_in_output": True},
    }
    out = client.completions.create(**kw)  # type: ignore[call-overload]
    assert out.choices[0].text == " the tide" and out.choices[0].finish_reason == "stop"
    streamed = client.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    assert "".join(c.choices[0].text for c in streamed if c.choices) == " the tide"


# --- max_tokens -------------------------------------------------------------------------------


def test_max_tokens_is_clamped_to_the_context_left(client: openai.OpenAI) -> None:
    prompt = list(range(1000, 1000 + MAX_LEN - 6))  # 6 tokens of room
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=100)
    assert out.usage is not None and out.usage.completion_tokens == 6
    assert out.choices[0].finish_reason == "length"
    default = client.completions.create(model=MODEL, prompt=prompt)  # 16 by default
    assert default.usage is not None and default.usage.completion_tokens == 6
    chat = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=MAX_LEN - 1)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == MAX_LEN


@pytest.mark.parametrize(
    ("kwargs", "param", "words"),
    [
        ({"prompt": "x", "max_tokens": MAX_LEN + 1}, "max_tokens", "cannot be greater than"),
        ({"prompt": list(range(1000, 1000 + MAX_LEN))}, None, "plus the number of requested"),
        ({"prompt": list(range(1000, 1001 + MAX_LEN))}, "input_tokens", "exceeds this limit"),
    ],
    ids=["max-tokens-over-max-model-len", "prompt-fills-context", "prompt-over-context"],
)
def test_what_vllm_refuses_for_length_is_refused(
    client: openai.OpenAI, kwargs: dict[str, object], param: str | None, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, **kwargs)  # type: ignore[call-overload]
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param and words in body["message"]


# --- fields that change the response ----------------------------------------------------------


def test_echo_puts_the_prompt_before_the_completion(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3, echo=True)
    assert out.choices[0].text == "Hello the tide came"
    streamed = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=3, echo=True, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "Hello the tide came"


@pytest.mark.parametrize(
    ("call", "param"),
    [
        (
            lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=3, logprobs=2),
            "logprobs",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=3, logprobs=0),
            "logprobs",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=3, logprobs=True
            ),
            "logprobs",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=3, top_logprobs=2
            ),
            "top_logprobs",
        ),
        (
            lambda c: c.chat.completions.create(
                model=MODEL, messages=HI, max_tokens=3, extra_body={"echo": True}
            ),
            "echo",
        ),
    ],
    ids=[
        "completion-logprobs",
        "completion-logprobs-0",
        "chat-logprobs",
        "top-logprobs",
        "chat-echo",
    ],
)
def test_fields_the_emulator_cannot_fill_are_refused(
    client: openai.OpenAI, call: object, param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        call(client)  # type: ignore[operator]
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == param


def test_fields_that_ask_for_nothing_are_accepted(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(
        model=MODEL, messages=HI, max_tokens=2, logprobs=False, top_logprobs=0
    )
    assert out.choices[0].finish_reason == "length"
    done = client.completions.create(
        model=MODEL, prompt="x", max_tokens=2, extra_body={"stream_options": {}}
    )
    assert done.choices[0].finish_reason == "length"


def test_tokenize_returns_token_strings_when_asked(engine: Engine) -> None:
    r = httpx.post(engine.url + "/tokenize", json={"prompt": "the tide", "return_token_strs": True})
    body = r.json()
    assert r.status_code == 200 and len(body["token_strs"]) == body["count"] > 0
    assert all(isinstance(s, str) for s in body["token_strs"])


# --- token counters -----------------------------------------------------------------------------


def _post_raw(port: int, body: dict[str, object]) -> socket.socket:
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    s.sendall(head.encode() + data)
    return s


def _wait_for(url: str, name: str, pred: object, timeout_s: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        c = _counters(url)
        if pred(c.get(name, 0.0)) or time.monotonic() > deadline:  # type: ignore[operator]
            return c
        time.sleep(0.05)


def test_token_counters_move_as_tokens_are_processed_and_skip_unprocessed_prompts() -> None:
    """One request decodes (one sequence at a time); a second waits and its client leaves:
    the running one's prompt and tokens count while it runs, the waiting one's prompt never."""
    with running_engine("--speedup", "1", "--served-model-name", MODEL, "--max-num-seqs", "1") as e:
        a = _post_raw(e.port, {"model": MODEL, "prompt": [7] * 10, "max_tokens": 3000})
        running = _wait_for(e.url, "vllm:generation_tokens_total", lambda v: v > 0)
        assert running["vllm:generation_tokens_total"] > 0
        assert running["vllm:prompt_tokens_total"] == 10
        assert running["vllm:prefix_cache_queries_total"] == 10
        b = _post_raw(e.port, {"model": MODEL, "prompt": [9] * 1000, "max_tokens": 5})
        _wait_for(e.url, "vllm:num_requests_waiting", lambda v: v == 1)
        b.close()
        after = _wait_for(e.url, "vllm:num_requests_waiting", lambda v: v == 0)
        assert after["vllm:num_requests_waiting"] == 0
        assert after["vllm:prompt_tokens_total"] == 10
        assert after["vllm:prefix_cache_queries_total"] == 10
        a.close()
