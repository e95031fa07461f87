from __future__ import annotations

import pytest

from kvtide.types import Request, TenantId
from kvtide.workloads.stats import lru_reuse_tokens, peak_reused_tokens, stats


def test_block_id_requests_hit_the_longest_prefix_seen_in_full_blocks() -> None:
    requests = [
        Request("a", 1.0, 40, 5, 16, block_ids=(1, 2, 3), session_id="s"),
        Request("b", 3.0, 48, 5, 16, block_ids=(1, 2, 9), session_id="s"),
        # Content ids are chained before matching: (5,) then (5, 5) are two distinct blocks.
        Request("c", 4.0, 32, 5, 16, block_ids=(5, 5), tenant=TenantId("x")),
        # Same second id as "a" under another first block: a different prefix, no hit.
        Request("d", 5.0, 32, 5, 16, block_ids=(7, 2)),
    ]

    summary = stats(requests)

    assert summary == {
        "requests": 4,
        "duration_s": 4.0,
        "prompt_tokens": 152,
        "output_tokens": 20,
        "mean_prompt_tokens": 38.0,
        "p50_prompt_tokens": 36.0,
        "tenants": 2,
        "sessions": 1,
        "unique_block_fraction": pytest.approx(7 / 9),
        "infinite_cache_hit_ratio": pytest.approx(32 / 152),
    }


def test_token_requests_are_blocked_at_their_own_block_size() -> None:
    prompt = tuple(range(10))
    requests = [
        Request("a", 0.0, 10, 1, 4, token_ids=prompt),
        Request("b", 0.0, 10, 1, 4, token_ids=prompt),  # two full blocks hit, the tail never
    ]

    summary = stats(requests)

    assert summary["infinite_cache_hit_ratio"] == pytest.approx(8 / 20)
    assert summary["unique_block_fraction"] == pytest.approx(2 / 4)


def test_an_empty_workload_has_zero_everything() -> None:
    summary = stats([])

    assert summary["requests"] == 0
    assert summary["infinite_cache_hit_ratio"] == 0.0


def test_peak_reused_tokens_counts_blocks_from_first_use_to_last_reuse() -> None:
    requests = [
        Request("a", 0.0, 32, 1, 16, block_ids=(1, 2)),  # (1) and (1,2) live on: reused below
        Request("b", 1.0, 32, 1, 16, block_ids=(3, 4)),  # never reused: never live
        Request("c", 2.0, 48, 1, 16, block_ids=(1, 2, 5)),  # last use of (1), (1,2)
        Request("d", 3.0, 16, 1, 16, block_ids=(6,)),
    ]
    assert peak_reused_tokens(requests) == 32
    assert peak_reused_tokens(requests[:2]) == 0


def test_lru_reuse_tokens_is_the_quantile_of_stack_distances() -> None:
    # a, b, a: a's reuse needs room for a and b (distance 2 blocks); c, c: distance 1
    requests = [
        Request("a", 0.0, 16, 1, 16, block_ids=(1,)),
        Request("b", 1.0, 16, 1, 16, block_ids=(2,)),
        Request("a2", 2.0, 16, 1, 16, block_ids=(1,)),
        Request("c", 3.0, 16, 1, 16, block_ids=(3,)),
        Request("c2", 4.0, 16, 1, 16, block_ids=(3,)),
    ]
    assert lru_reuse_tokens(requests, 1.0) == 32
    assert lru_reuse_tokens(requests, 0.5) == 16
    assert lru_reuse_tokens(requests[:2]) == 0
    with pytest.raises(ValueError):
        lru_reuse_tokens(requests, 0.0)
