"""The official openai client through `kvtide serve` in front of two vLLM-shaped backends:
chat and completions, streamed and not; errors as OpenAI error objects and exception classes;
tenants never share a cache whatever cache_salt they send."""

from __future__ import annotations

import hashlib
import hmac
import json
import urllib.request

import openai
import pytest
from tests.integration.gateway.conftest import KEYS, SECRET
from tests.integration.gateway.procs import openai_client

pytestmark = pytest.mark.timeout(60)

LONG = "You are a careful assistant who answers in one line. " * 20


def client(url: str, tenant: str = "alpha") -> openai.OpenAI:
    return openai_client(base_url=f"{url}/v1", api_key=KEYS[tenant], max_retries=0, timeout=20)


def test_chat_and_completions_streamed_and_not(keyed_gateway: tuple[str, list]) -> None:
    url, _ = keyed_gateway
    c = client(url)
    assert [m.id for m in c.models.list()] == ["m"]
    chat = c.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert chat.choices[0].message.content == "tok " * 5
    assert chat.usage is not None and chat.usage.completion_tokens == 5
    chunks = list(
        c.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "tok " * 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    done = c.completions.create(model="m", prompt="once upon a time", max_tokens=3)
    assert done.choices[0].text == "tok " * 3
    streamed = list(c.completions.create(model="m", prompt="once", max_tokens=6, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == "tok " * 6


def test_errors_are_openai_errors_with_the_matching_exception(
    keyed_gateway: tuple[str, list],
) -> None:
    url, _ = keyed_gateway
    c = client(url)
    with pytest.raises(openai.NotFoundError) as nf:
        c.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(model="m", messages=[])
    assert bad.value.body["param"] == "messages"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        c.completions.create(model="m", prompt="x", max_tokens=0)
    with pytest.raises(openai.AuthenticationError):
        openai_client(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
    # raw malformed bodies, each with its status and an OpenAI error object
    for body, status in ((b"{not json", 400), (b"[1, 2]", 400), (b'{"model": 3}', 400)):
        req = urllib.request.Request(
            f"{url}/v1/completions",
            data=body,
            headers={"Authorization": f"Bearer {KEYS['alpha']}"},
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code == status
        payload = json.loads(err.value.read())
        assert set(payload["error"]) == {"message", "type", "param", "code"}
    huge = b'{"model": "m", "prompt": "' + b"x" * (5 * 1024 * 1024) + b'"}'
    req = urllib.request.Request(
        f"{url}/v1/completions", data=huge, headers={"Authorization": f"Bearer {KEYS['alpha']}"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 413
    assert json.loads(err.value.read())["error"]["code"] == "request_too_large"
    # and the gateway keeps serving
    assert c.completions.create(model="m", prompt="still here", max_tokens=1).choices


def _cached(c: openai.OpenAI, salt: str | None) -> int:
    extra = {"cache_salt": salt} if salt is not None else {}
    r = c.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": LONG}, {"role": "user", "content": "q"}],
        max_tokens=1,
        extra_body=extra,
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return int(r.usage.prompt_tokens_details.cached_tokens or 0)


def test_tenant_b_never_reuses_tenant_a_cache_whatever_salt_it_sends(
    keyed_gateway: tuple[str, list],
) -> None:
    url, backends = keyed_gateway
    a = client(url, "alpha")
    _cached(a, None)
    assert _cached(a, "client-chosen") > 0  # same tenant: the prefix is reused
    alpha_salt = hmac.new(SECRET.encode(), b"alpha", hashlib.sha256).hexdigest()[:32]
    # each other tenant's first request shares alpha's prefix, under every salt it might try,
    # alpha's real server-side salt included
    attempts = {"beta": None, "gamma": "", "delta": "client-chosen", "eps": alpha_salt}
    for tenant, salt in attempts.items():
        assert _cached(client(url, tenant), salt) == 0, (tenant, salt)
    # what reached the engines: one server-side salt per tenant, never a client's
    seen = []
    for _, port in backends:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as resp:
            seen += json.load(resp)["salts"]
    assert len(set(seen)) == 5
    assert not set(seen) & {None, "", "client-chosen"}
    assert seen.count(alpha_salt) == 2  # alpha's two requests only
