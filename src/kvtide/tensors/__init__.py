"""Real tensors on a real model: a llama decoder in PyTorch whose paged KV is managed by kvtide.

The only kvtide package that imports torch (the optional 'torch' extra); nothing imports it back.
Tokenization lives in ``kvtide.text`` and needs none of this.
"""

from kvtide.tensors.gguf_loader import GgufModel, load_gguf
from kvtide.tensors.model import LlamaConfig, LlamaModel
from kvtide.tensors.offload import CorruptBlockError, DiskStore, HostStore, TensorMover
from kvtide.tensors.paged_kv import PagedKV, PagedPast
from kvtide.tensors.runner import Generation, PagedRunner, Prefill, PrefillStats

__all__ = [
    "CorruptBlockError",
    "DiskStore",
    "Generation",
    "GgufModel",
    "HostStore",
    "LlamaConfig",
    "LlamaModel",
    "PagedKV",
    "PagedPast",
    "PagedRunner",
    "Prefill",
    "PrefillStats",
    "TensorMover",
    "load_gguf",
]
