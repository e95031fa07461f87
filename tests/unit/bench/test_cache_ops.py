"""bench/cache_ops.py and its parts: the reference page LRU, kvtide's adapter against it, a
run with no peer venv (peers reported as not importable), bad input; and bench/hashing.py."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cache_ops  # bench/*.py: tests/conftest.py puts bench/ on sys.path
import cache_workers as workers
import hashing
import page_lru

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"
# CI has shared/ beside the clone; a worktree under wt/ has it one level further up
TRACE = next(
    (
        p / "shared" / "traces" / "mooncake_conversation.jsonl"
        for p in (ROOT.parent, ROOT.parent.parent)
        if (p / "shared" / "traces" / "mooncake_conversation.jsonl").exists()
    ),
    ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl",
)


def toks(*pages: int, tail: int = 0) -> list[int]:
    """Token ids: 16 per page id (the page id repeated), then ``tail`` extra tokens."""
    out = [p for p in pages for _ in range(16)]
    return out + [999] * tail


def test_page_lru_never_hits_the_last_prompt_token() -> None:
    lru = page_lru.PageLRU(capacity_pages=10)
    assert lru.request(toks(1, 2)) == 0
    # 32 tokens, both pages cached: the page holding the last token is recomputed
    assert lru.request(toks(1, 2)) == 16
    # one more token: both full pages hit
    assert lru.request(toks(1, 2, tail=1)) == 32
    assert lru.request(toks(1, 2, 3)) == 32


def test_page_lru_evicts_least_recent_and_a_request_tail_first() -> None:
    lru = page_lru.PageLRU(capacity_pages=3)
    lru.request(toks(1, 2, 3))  # pages A1 A2 A3: A3 is the oldest
    lru.request(toks(7, tail=3))  # evicts A3
    assert lru.num_evicted == 1
    assert lru.request(toks(1, 2, 3, tail=1)) == 32  # A1 A2 hit, A3 stored again
    # the chain makes page 2 after page 9 another page than page 2 after page 1
    assert lru.request(toks(9, 2, tail=1)) == 0


def test_page_lru_rejects_zero_capacity() -> None:
    with pytest.raises(ValueError):
        page_lru.PageLRU(0)
    with pytest.raises(ValueError):
        page_lru.VLLMPoolLRU(0)


def test_vllm_pool_model_loses_a_page_to_the_duplicate_of_a_recomputed_last_block() -> None:
    """The smallest case where vLLM hits less than a page LRU (checked against vLLM 0.33's
    KVCacheManager): capacity 3 blocks; a 32-token prompt seen twice recomputes its last block
    into a second copy of page B, so caching C evicts both copies of B."""
    reqs = [toks(1, 2), toks(1, 2), toks(3, tail=1), toks(1, 2, tail=1)]
    plain = page_lru.PageLRU(capacity_pages=3)
    vllm = page_lru.VLLMPoolLRU(capacity_pages=3)
    assert [plain.request(r) for r in reqs] == [0, 16, 0, 32]
    assert [vllm.request(r) for r in reqs] == [0, 16, 0, 16]


def test_vllm_pool_model_reuses_partial_blocks_first() -> None:
    """A partial last block goes back to the front of vLLM's free queue, so it is reused
    before any cached page: with room for 3 blocks, A survives B's and C's requests (checked
    against vLLM 0.33's KVCacheManager)."""
    vllm = page_lru.VLLMPoolLRU(capacity_pages=3)
    reqs = [toks(1, tail=5), toks(2, tail=5), toks(3), toks(1, tail=1)]
    assert [vllm.request(r) for r in reqs] == [0, 0, 0, 16]


def synthetic_requests(n: int, seed: int) -> list[np.ndarray]:
    """Shared system prompts, growing conversations, and lengths that are sometimes exact
    multiples of 16, so the last-token rule and partial blocks both come up."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1 << 30) for _ in range(16 * rng.randint(1, 4))] for _ in range(3)]
    convs: list[list[int]] = []
    out = []
    for _ in range(n):
        if convs and rng.random() < 0.6:
            conv = rng.choice(convs)
            conv += [rng.randrange(1 << 30) for _ in range(rng.choice([0, 5, 16, 37]))]
        else:
            conv = list(rng.choice(systems)) + [rng.randrange(1 << 30) for _ in range(20)]
            convs.append(conv)
        length = len(conv) - rng.choice([0, 0, 1, 7])
        out.append(np.asarray(conv[: max(length, 1)], dtype=np.int32))
    return out


@pytest.mark.parametrize("capacity_tokens", [160, 800, 4000])
def test_kvtide_adapter_hits_exactly_what_the_reference_hits(capacity_tokens: int) -> None:
    kvtide = workers.LOADERS["kvtide"]()(capacity_tokens)
    ref = workers.LOADERS["ref"]()(capacity_tokens)
    for tokens in synthetic_requests(400, seed=capacity_tokens):
        expected = ref.step(ref.prepare(tokens))
        assert kvtide.step(kvtide.prepare(tokens)) == expected


def write_mooncake(path: Path, rows: list[tuple[int, list[int]]]) -> None:
    lines = [
        json.dumps({"timestamp": i, "input_length": n, "output_length": 1, "hash_ids": ids})
        for i, (n, ids) in enumerate(rows)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_runs_without_peers_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    write_mooncake(trace, [(700, [0, 1]), (1024, [0, 1]), (1500, [0, 2, 3]), (600, [0, 4])])
    out = tmp_path / "out.json"
    argv = [
        "cache_ops.py",
        str(trace),
        "--capacity",
        "1024,4096",
        "--runs",
        "1",
        "--systems",
        "kvtide,ref,sglang,vllm",
        "--peer-python",
        str(tmp_path / "no-python"),
        "--json",
        str(out),
    ]
    sys.argv = argv
    assert cache_ops.main() == 0
    printed = capsys.readouterr().out
    assert "sglang: not importable" in printed
    assert "vllm: not importable" in printed
    result = json.loads(out.read_text())
    rows = {(r["system"], r["capacity_tokens"]): r for r in result["rows"]}
    assert set(rows) == {("kvtide", 1024), ("kvtide", 4096), ("ref", 1024), ("ref", 4096)}
    for cap in (1024, 4096):
        assert rows[("kvtide", cap)]["hit_tokens"] == rows[("ref", cap)]["hit_tokens"]
    # at 4096 tokens nothing is evicted: request 2 hits the 43 full pages request 1 stored
    # (688 of its 700 tokens; same block ids, same tokens), requests 3 and 4 hit block 0
    assert rows[("kvtide", 4096)]["hit_tokens"] == 688 + 512 + 512
    assert result["errors"].keys() == {"sglang", "vllm"}


def test_bad_trace_line_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n{')
    sys.argv = ["cache_ops.py", str(trace), "--systems", "kvtide"]
    assert cache_ops.main() == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bad.jsonl:2:" in err


def test_unknown_system_is_exit_2(tmp_path: Path) -> None:
    sys.argv = ["cache_ops.py", str(tmp_path / "x.jsonl"), "--systems", "redis"]
    assert cache_ops.main() == 2


@pytest.mark.traces
def test_mooncake_prefix_kvtide_equals_reference(tmp_path: Path) -> None:
    if not TRACE.exists():
        pytest.skip("shared traces absent")
    n, _ = cache_ops.expand_trace(TRACE, 150, tmp_path)
    assert n == 150
    tokens = np.load(tmp_path / "tokens.npy")
    offsets = np.load(tmp_path / "offsets.npy")
    hits = {}
    for name in ("kvtide", "ref", "ref-vllm"):
        system = workers.LOADERS[name]()
        hits[name], _, _, _ = workers.replay(system, tokens, offsets, 200_000)
    assert hits["kvtide"] == hits["ref"] == hits["ref-vllm"] > 0


def test_hashing_bench_without_the_peer_venv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.argv = ["hashing.py", "--tokens", "256", "--runs", "1", "--loop-s", "0.01"]
    sys.argv += ["--peer-python", str(tmp_path / "none")]
    assert hashing.main() == 0
    printed = capsys.readouterr().out
    assert "vllm: not importable" in printed
    assert "kvtide hash_tokens (numpy int64)" in printed


# the peer venv's interpreter, as the benchmark's --peer-python defaults to it
PEER_PYTHON = Path(os.environ.get("KVTIDE_PEER_PYTHON", cache_ops.PEER_PYTHON))


@pytest.mark.slow
@pytest.mark.skipif(not PEER_PYTHON.exists(), reason="no peer venv (bench/setup_peers.sh)")
def test_vllm_hits_what_the_pool_model_hits(tmp_path: Path) -> None:
    """The real vLLM KVCacheManager, through the worker CLI, against VLLMPoolLRU."""
    reqs = synthetic_requests(300, seed=7)
    offsets = np.cumsum([0] + [len(r) for r in reqs]).astype(np.int64)
    tokens = np.concatenate(reqs).astype(np.int32)
    np.save(tmp_path / "tokens.npy", tokens)
    np.save(tmp_path / "offsets.npy", offsets)
    out = tmp_path / "vllm.json"
    cmd = [str(PEER_PYTHON), str(BENCH / "cache_workers.py"), "vllm", str(tmp_path)]
    # vLLM must fit the longest prompt: the smallest capacity just does, so it evicts a lot
    smallest = (max(len(r) for r in reqs) // 16 + 2) * 16
    cmd += ["--capacity", f"{smallest},{4 * smallest}", "--runs", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    for row in result["results"]:
        model = workers.LOADERS["ref-vllm"]()
        hit, _, _, _ = workers.replay(model, tokens, offsets, row["capacity_tokens"])
        assert row["hit_tokens"] == [hit]
