"""Paged KV storage: one tensor of fixed-size blocks whose ids come from kvtide's BlockPool.

Layout ``[num_blocks, num_layers, 2, num_kv_heads, block_tokens, head_dim]``: one block is one
contiguous slab, so offloading or reloading a block is a single copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvtide.tensors.model import LlamaConfig


class PagedKV:
    def __init__(
        self,
        config: LlamaConfig,
        num_blocks: int,
        block_tokens: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.block_tokens = block_tokens
        self.device = torch.device(device)
        self.block_shape = (
            config.num_layers,
            2,
            config.num_kv_heads,
            block_tokens,
            config.head_dim,
        )
        self.storage = torch.zeros((num_blocks, *self.block_shape), device=self.device)

    @property
    def num_blocks(self) -> int:
        return int(self.storage.shape[0])

    @property
    def block_bytes(self) -> int:
        return int(self.storage[0].numel() * self.storage.element_size())

    def block(self, block_id: int) -> torch.Tensor:
        """A view of one block, ``[num_layers, 2, num_kv_heads, block_tokens, head_dim]``."""
        return self.storage[block_id]

    def write(self, block_id: int, kv: torch.Tensor) -> None:
        self.storage[block_id].copy_(kv)

    def write_tokens(self, block_ids: Sequence[int], kv: torch.Tensor) -> None:
        """Writes ``kv`` ``[num_layers, 2, num_kv_heads, len(block_ids) * block_tokens, head_dim]``
        into consecutive blocks."""
        bt = self.block_tokens
        for i, block_id in enumerate(block_ids):
            self.storage[block_id].copy_(kv[:, :, :, i * bt : (i + 1) * bt])

    def gather_layer(self, block_ids: torch.Tensor, layer: int) -> torch.Tensor:
        """K and V of ``block_ids`` in order, ``[2, num_kv_heads, num_tokens, head_dim]``."""
        blocks = self.storage[block_ids, layer]  # [n, 2, kv_heads, bt, head_dim]
        n = blocks.shape[0]
        c = self.config
        return blocks.permute(1, 2, 0, 3, 4).reshape(2, c.num_kv_heads, n * self.block_tokens, -1)


class PagedPast:
    """The PastKV of a sequence: its cached blocks, then a contiguous tail (partial block,
    decoded tokens) ``[num_layers, 2, num_kv_heads, tail_tokens, head_dim]``."""

    def __init__(self, kv: PagedKV, block_ids: Sequence[int], tail: torch.Tensor | None = None):
        self._kv = kv
        self._ids = torch.as_tensor(list(block_ids), dtype=torch.long, device=kv.device)
        self.block_ids = list(block_ids)
        self.tail = tail

    @property
    def num_tokens(self) -> int:
        tail = 0 if self.tail is None else int(self.tail.shape[3])
        return len(self.block_ids) * self._kv.block_tokens + tail

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        parts = []
        if self.block_ids:
            parts.append(self._kv.gather_layer(self._ids, index))
        if self.tail is not None:
            parts.append(self.tail[index])
        both = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        return both[0], both[1]

    def append(self, kv: torch.Tensor) -> None:
        """Adds tokens just computed to the tail (decode)."""
        self.tail = kv if self.tail is None else torch.cat((self.tail, kv), dim=3)
