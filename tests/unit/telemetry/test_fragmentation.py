"""Fragmentation measures against simple references, and the profile on real engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtide.cli import main
from kvtide.clock import ManualClock
from kvtide.core.cache import CacheConfig, KVCache
from kvtide.costs.cost_model import CostModel
from kvtide.costs.specs import gpu_preset, resolve_model
from kvtide.telemetry.fragmentation import (
    copy_cost_ratio,
    free_runs,
    replication,
    runs_in_order,
    tree_hashes,
)

MODEL = CostModel(resolve_model("llama-3-8b"), gpu_preset("h100"))


@given(st.sets(st.integers(0, 300)))
def test_free_runs_match_a_walk_over_the_sorted_ids(ids: set[int]) -> None:
    walk: list[int] = []
    for x in sorted(ids):
        if walk and x - 1 in ids:
            walk[-1] += 1
        else:
            walk.append(1)
    assert free_runs(list(ids)).tolist() == walk
    assert sum(walk) == len(ids)


def test_runs_in_order_counts_breaks_in_the_given_order() -> None:
    assert runs_in_order([]) == 0
    assert runs_in_order([5, 6, 7]) == 1
    assert runs_in_order([7, 6, 5]) == 3  # descending ids are three copies
    assert runs_in_order([1, 2, 9, 10, 4]) == 3


def test_splitting_a_copy_costs_more_through_the_small_chunk_ramp() -> None:
    assert copy_cost_ratio(MODEL, 16, 64, 1) == pytest.approx(1.0)
    ratios = [copy_cost_ratio(MODEL, 16, 64, r) for r in (1, 2, 8, 64)]
    assert ratios == sorted(ratios) and ratios[-1] > 2 * ratios[0]


def test_replication_counts_blocks_held_by_several_caches() -> None:
    clock = ManualClock()
    caches = [KVCache(CacheConfig(capacity_blocks=16, block_tokens=4), clock) for _ in range(3)]
    caches[0].insert([1, 2, 3])
    caches[1].insert([1, 2])
    caches[2].insert([9])
    assert sorted(tree_hashes(caches[0]).tolist()) == [1, 2, 3]
    rep = replication(caches)
    assert (rep.distinct_blocks, rep.held_blocks, rep.held_by_two_or_more) == (4, 6, 2)
    assert rep.factor == pytest.approx(1.5)


def test_profile_prints_the_report_and_block_sizes(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    argv = ["profile", "--requests", "80", "--replicas", "2", "--block-sizes", "16,64"]
    assert main([*argv, "--gpu-cache-tokens", "32Ki", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    sizes = [row["block_tokens"] for row in doc["block_sizes"]]
    assert sizes == [16, 64]
    for row in doc["block_sizes"]:
        assert 0 <= row["partial_waste_share"] < 1 and 0 <= row["reserved_waste_share"] < 1
        assert row["snapshots"] > 0 and row["copy_cost_ratio"] >= 1.0
    # Larger blocks waste more of their last block on the same requests.
    assert (
        doc["block_sizes"][1]["partial_waste_share"] > doc["block_sizes"][0]["partial_waste_share"]
    )


def test_profile_bad_block_size_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--block-sizes", "16,x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--block-sizes" in err[0]


@pytest.mark.timeout(60)
def test_profile_of_requests_arriving_at_one_instant_ends(tmp_path: Path) -> None:
    """Every arrival at one instant made the snapshot interval 5 ns of simulated time: a
    three-request profile never ended. The interval has a floor and grows as the run
    outlasts its arrivals, so the snapshots stay few."""
    trace = tmp_path / "same_time.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"token_ids": list(range(i * 1000, i * 1000 + 200)), "output_length": 50})
            + "\n"
            for i in range(3)
        )
    )
    out = tmp_path / "p.json"
    argv = ["profile", "--workload", str(trace), "--block-sizes", "16", "--json", str(out)]
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["block_sizes"]
    assert 0 < row["snapshots"] < 10_000
