"""Which first chunk of a stream ends a request's prefill in the router's view: any that
carries output, not a role-only opening (vLLM sends that with the first token; another engine
may send it with the headers, before any work) nor an SSE comment."""

from __future__ import annotations

import pytest

from kvtide.gateway.dialects import OPENAI

HEAD = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":['
ROLE = HEAD + b'{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
TOKEN = HEAD + b'{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'


@pytest.mark.parametrize(
    ("chunk", "no_output"),
    [
        (ROLE, True),  # vLLM's compact JSON
        (ROLE.replace(b":", b": ").replace(b"data: ", b"data: ", 1), True),  # spaced JSON
        (HEAD + b'{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}\n\n', True),
        (
            HEAD + b'{"index":0,"delta":{"role":"assistant","content":null,'
            b'"reasoning_content":null},"finish_reason":null}]}\n\n',
            True,
        ),
        (ROLE + TOKEN, False),  # the role and the first token in one read
        (TOKEN, False),
        (HEAD + b'{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}\n\n', False),
        (
            HEAD
            + b'{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"finish_reason":"length"}]}\n\n',
            False,
        ),
        (HEAD + b'{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"t"}]}}]}\n\n', False),
        (b'data: {"error":{"message":"boom","role":"x"}}\n\n', False),
        (b'data: {"choices":[],"role":1}\n\n', False),
        (b'data: {"role" broken\n\n', False),
        (b"data: [DONE]\n\n", False),
        (b": keep-alive\n\n", True),  # an SSE comment
    ],
)
def test_only_chunks_without_output_leave_the_prefill_open(chunk: bytes, no_output: bool) -> None:
    assert OPENAI.no_output(chunk) is no_output
