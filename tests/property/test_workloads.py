"""Every generated request is self-consistent, whatever the parameters, seed and block size."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtide.types import Request
from kvtide.workloads import Agent, Burst, Chat, Mixed, Rag, Tenants
from kvtide.workloads.azure import AzureRow, SyntheticPrefixes, add_prefixes
from kvtide.workloads.builtins import BuiltinParams
from kvtide.workloads.synthetic import TOKEN_IDS

SMALL_BUILTINS: list[BuiltinParams] = [
    Chat(sessions=6, turns=3.0, duration_s=100.0, system_tokens=100.0, user_tokens=40.0),
    Agent(sessions=3, steps=4.0, duration_s=50.0, system_tokens=200.0, tool_tokens=50.0),
    Rag(requests=10, documents=8, doc_tokens=60.0, max_docs=3),
    Tenants(tenants=3, sessions=6, turns=2.0, burst_sessions=3),
    Burst(duration_s=60.0, on_s=10.0, off_s=20.0, on_rate=1.0, off_rate=0.2, system_tokens=50.0),
    Mixed(scale=0.02, duration_s=30.0),
]


def _assert_consistent(requests: list[Request], block_tokens: int) -> None:
    assert [r.arrival_s for r in requests] == sorted(r.arrival_s for r in requests)
    for request in requests:
        assert request.prompt_tokens >= 1 and request.output_tokens >= 0
        assert request.block_tokens == block_tokens
        if request.token_ids is not None:
            assert len(request.token_ids) == request.prompt_tokens
            assert min(request.token_ids) in TOKEN_IDS and max(request.token_ids) in TOKEN_IDS
        else:
            assert request.block_ids is not None
            assert len(request.block_ids) == -(-request.prompt_tokens // block_tokens)


@settings(max_examples=40, deadline=None)
@given(
    params=st.sampled_from(SMALL_BUILTINS),
    seed=st.integers(0, 2**32),
    block_tokens=st.sampled_from([1, 16, 512]),
)
def test_builtin_requests_have_consistent_lengths(
    params: BuiltinParams, seed: int, block_tokens: int
) -> None:
    _assert_consistent(list(params.generate(seed, block_tokens)), block_tokens)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.floats(0.0, 50.0), st.integers(1, 3000), st.integers(0, 500)), max_size=40
    ),
    block_tokens=st.integers(1, 64),
    continue_prob=st.floats(0.0, 1.0),
    seed=st.integers(0, 100),
)
def test_azure_prefixes_keep_lengths_and_arrivals(
    rows: list[tuple[float, int, int]], block_tokens: int, continue_prob: float, seed: int
) -> None:
    azure_rows = [AzureRow(t, p, o) for t, p, o in sorted(rows)]
    prefixes = SyntheticPrefixes(continue_prob=continue_prob)

    requests = list(
        add_prefixes(azure_rows, block_tokens=block_tokens, seed=seed, prefixes=prefixes)
    )

    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests] == [
        (row.arrival_s, row.prompt_tokens, row.output_tokens) for row in azure_rows
    ]
    _assert_consistent(requests, block_tokens)
