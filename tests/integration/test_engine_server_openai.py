"""`kvtide engine` over real sockets, driven by the official `openai` client: completions and
chat, streaming and not, prefix hits in `usage`, cache_salt, stop strings, every class of bad
input with the status and exception the client raises, and the server serving on after each."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx2 as httpx
import openai
import pytest
from engine_process import Engine, engine_client, running_engine
from prometheus_client.parser import text_string_to_metric_families

MODEL = "emu"
LONG = " ".join(f"Paragraph {i}: the tide rose over the sand flats at dusk." for i in range(40))


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    with running_engine(
        "--speedup", "200", "--served-model-name", MODEL, "--max-model-len", "4096",
        "--max-body-bytes", "200000",
    ) as eng:  # fmt: skip
        yield eng


@pytest.fixture
def client(engine: Engine) -> Iterator[openai.OpenAI]:
    with engine_client(engine) as client:
        yield client


def test_completion_reports_length_and_usage(client: openai.OpenAI) -> None:
    out = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=7)
    choice = out.choices[0]
    assert choice.finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 7
    assert out.usage.total_tokens == out.usage.prompt_tokens + 7
    assert choice.text and out.id.startswith("cmpl-")
    again = client.completions.create(model=MODEL, prompt="Something else", max_tokens=7)
    assert again.choices[0].text == choice.text  # deterministic filler of the same length


def test_completion_stream_one_chunk_per_token_then_usage(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt="Count with me",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    tokens = [c for c in chunks if c.choices]
    assert len(tokens) == 12
    assert [c.choices[0].finish_reason for c in tokens] == [None] * 11 + ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    unary = client.completions.create(model=MODEL, prompt="Count with me", max_tokens=12)
    assert "".join(c.choices[0].text for c in tokens) == unary.choices[0].text


def test_chat_unary_and_stream(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5)  # type: ignore[arg-type]
    assert out.choices[0].message.role == "assistant"
    assert out.usage is not None and out.usage.completion_tokens == 5
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_completion_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == out.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == out.usage.prompt_tokens


def test_prompt_as_token_ids(client: openai.OpenAI) -> None:
    ids = [1000 + i for i in range(40)]
    out = client.completions.create(model=MODEL, prompt=ids, max_tokens=2)
    assert out.usage is not None and out.usage.prompt_tokens == 40


def _cached(client: openai.OpenAI, prompt: str, salt: str | None = None) -> int:
    extra = {"cache_salt": salt} if salt is not None else None
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body=extra)
    assert out.usage is not None and out.usage.prompt_tokens_details is not None
    cached = out.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    return cached


def test_prefix_hit_is_reported_and_salt_separates(client: openai.OpenAI) -> None:
    assert _cached(client, LONG + " First question?") == 0
    hit = _cached(client, LONG + " A different question?")
    assert hit > 400 and hit % 16 == 0  # whole 16-token blocks of the shared prefix
    assert _cached(client, LONG + " Third question?", salt="tenant-b") == 0
    assert _cached(client, LONG + " Fourth question?", salt="tenant-b") == hit


def test_stop_string_ends_the_text(client: openai.OpenAI) -> None:
    full = client.completions.create(model=MODEL, prompt="Stop me", max_tokens=10)
    text = full.choices[0].text
    stop = text.split()[3]
    out = client.completions.create(model=MODEL, prompt="Stop me", max_tokens=10, stop=[stop])
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == text[: text.index(" " + stop) + 1]
    streamed = client.completions.create(
        model=MODEL, prompt="Stop me", max_tokens=10, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].text for c in chunks) == out.choices[0].text


def test_tokenize_detokenize_models_health(client: openai.OpenAI, engine: Engine) -> None:
    tok = httpx.post(engine.url + "/tokenize", json={"model": MODEL, "prompt": "Hello world"})
    body = tok.json()
    assert set(body) == {"count", "max_model_len", "tokens", "token_strs"}
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 4096
    detok = httpx.post(engine.url + "/detokenize", json={"tokens": body["tokens"]})
    assert detok.json() == {"prompt": "Hello world"}
    chat = httpx.post(
        engine.url + "/tokenize", json={"messages": [{"role": "user", "content": "Hi"}]}
    )
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    assert out.usage is not None and chat.json()["count"] == out.usage.prompt_tokens
    assert [m.id for m in client.models.list()] == [MODEL]
    assert httpx.get(engine.url + "/health").status_code == 200


# --- bad input ------------------------------------------------------------------------------


def _raw(client: openai.OpenAI, content: bytes) -> object:
    return client.post(
        "/completions",
        cast_to=object,
        content=content,
        options={"headers": {"Content-Type": "application/json"}},
    )


@pytest.mark.parametrize(
    ("call", "exc", "status", "param"),
    [
        (lambda c: _raw(c, b'{"prompt": "x",'), openai.BadRequestError, 400, None),
        (lambda c: _raw(c, b"[1, 2]"), openai.BadRequestError, 400, None),
        (
            lambda c: c.completions.create(model=MODEL, prompt=None),  # type: ignore[arg-type]
            openai.BadRequestError,
            400,
            "prompt",
        ),
        (
            lambda c: c.completions.create(
                model=MODEL, prompt="x", extra_body={"max_tokens": "many"}
            ),
            openai.BadRequestError,
            400,
            "max_tokens",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="x", n=2),
            openai.BadRequestError,
            400,
            "n",
        ),
        (
            lambda c: c.chat.completions.create(model=MODEL, messages=[{"content": "x"}]),  # type: ignore[list-item]
            openai.BadRequestError,
            400,
            "messages[0].role",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt=LONG * 8, max_tokens=16),
            openai.BadRequestError,
            400,
            "input_tokens",  # vLLM's name for an over-long prompt
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=5000),
            openai.BadRequestError,
            400,
            "max_tokens",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt=[10**9]),
            openai.BadRequestError,
            400,
            "prompt",
        ),
        (
            lambda c: c.completions.create(model="nope", prompt="x"),
            openai.NotFoundError,
            404,
            "model",
        ),
        (
            lambda c: c.completions.create(model=MODEL, prompt="x" * 300_000),
            openai.APIStatusError,
            413,
            None,
        ),
    ],
    ids=[
        "malformed-json",
        "not-an-object",
        "missing-prompt",
        "wrong-type",
        "n-above-1",
        "message-without-role",
        "prompt-over-context",
        "completion-over-context",
        "token-out-of-vocab",
        "unknown-model",
        "body-too-large",
    ],
)
def test_bad_input_gets_its_status_and_the_server_serves_on(
    client: openai.OpenAI,
    call: object,
    exc: type[openai.APIStatusError],
    status: int,
    param: str | None,
) -> None:
    with pytest.raises(exc) as info:
        call(client)  # type: ignore[operator]
    assert info.value.status_code == status
    error = info.value.body
    assert isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]
    assert "Traceback" not in str(error)
    ok = client.completions.create(model=MODEL, prompt="still there?", max_tokens=1)
    assert ok.choices[0].finish_reason == "length"


def _metric(engine: Engine, name: str, **labels: str) -> float:
    text = httpx.get(engine.url + "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"{name} {labels} not in /metrics")


def test_queue_full_gets_503_with_retry_after() -> None:
    with running_engine("--speedup", "1", "--max-num-seqs", "1", "--max-waiting", "1") as eng:
        client = openai.OpenAI(base_url=eng.url + "/v1", api_key="x", max_retries=0)
        first = client.completions.create(
            model="llama-3-8b", prompt="a", max_tokens=300, stream=True
        )
        next(iter(first))  # running
        second = client.completions.create(
            model="llama-3-8b", prompt="b", max_tokens=2, stream=True
        )  # waiting: the one running holds the only sequence slot
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="llama-3-8b", prompt="c", max_tokens=1)
        assert info.value.status_code == 503
        assert info.value.response.headers["retry-after"] == "1"
        first.close()  # a disconnect aborts the running request, freeing the slot
        assert [c.choices[0].finish_reason for c in second][-1] == "length"
        assert _metric(eng, "vllm:request_success_total", finished_reason="abort") == 1


def test_disconnect_aborts_and_sigterm_drains() -> None:
    with running_engine("--speedup", "5") as eng:
        client = openai.AsyncOpenAI(base_url=eng.url + "/v1", api_key="x", max_retries=0)

        async def scenario() -> list[str | None]:
            gone = await client.completions.create(
                model="llama-3-8b", prompt="x", max_tokens=2000, stream=True
            )
            async for _ in gone:
                break
            await gone.close()
            await asyncio.sleep(0.2)
            assert _metric(eng, "vllm:num_requests_running") == 0
            kept = await client.completions.create(
                model="llama-3-8b", prompt="y", max_tokens=40, stream=True
            )
            reasons = []
            first = True
            async for chunk in kept:
                if first:  # SIGTERM while this one streams: it must still finish
                    eng.proc.send_signal(15)
                    first = False
                reasons.append(chunk.choices[0].finish_reason)
            await client.close()
            return reasons

        reasons = asyncio.run(scenario())
        assert reasons[-1] == "length" and len(reasons) == 40
        assert eng.proc.wait(timeout=20) == 0


def test_a_chat_streams_role_chunk_comes_with_the_first_token() -> None:
    """As vLLM's: the role chunk is sent once the prefill is done, not with the headers, so
    a gateway that reads the first chunk as the end of the prefill sees it then. The engine
    runs 20x slower than the modelled GPU: this prompt's prefill takes a visible while."""
    with running_engine("--speedup", "0.05", "--served-model-name", MODEL) as eng:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": LONG}],
            "max_tokens": 2,
            "stream": True,
        }
        with httpx.stream("POST", eng.url + "/v1/chat/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            # the first token is out by the time the role chunk arrives
            assert _metric(eng, "vllm:time_to_first_token_seconds_count") == 1
            rest = [line for line in lines if line.startswith("data:")]
        assert '"role":"assistant"' in first
        assert rest[-1] == "data: [DONE]" and len(rest) == 3  # two tokens, then [DONE]
