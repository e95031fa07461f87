"""The tier flags of `kvtide replay`: parsing, the cache they build, the report."""

from __future__ import annotations

import argparse
import json

import pytest

from kvtide.cli._tiers_args import (
    add_tier_arguments,
    build_cache,
    has_tiers,
    tier_report,
)
from kvtide.clock import ManualClock
from kvtide.core.hashing import hash_block_ids
from kvtide.core.tiers import WriteMode
from kvtide.errors import ConfigError
from kvtide.types import Tier


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tier_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.parametrize(
    ("text", "tokens"), [("4096", 4096), ("512k", 512_000), ("10M", 10**7), ("1.5g", 15 * 10**8)]
)
def test_token_counts_take_decimal_suffixes(text: str, tokens: int) -> None:
    assert parse("--host-capacity", text).host_capacity == tokens


@pytest.mark.parametrize("text", ["ten", "-5", "1.5", "M", "nan", "inf"])
def test_bad_token_counts_are_refused(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--host-capacity", text)
    assert "--host-capacity: " in capsys.readouterr().err


def test_defaults_ask_for_no_tier() -> None:
    args = parse()
    assert not has_tiers(args)
    cache = build_cache(args, capacity_blocks=4, block_tokens=16, policy="lru", clock=ManualClock())
    assert list(cache.caches) == [Tier.DEVICE]


def test_flags_build_the_tiers_they_name() -> None:
    args = parse(
        "--host-capacity", "1k", "--disk-capacity", "2k", "--admission", "seen-twice",
        "--write-mode", "write-through",
    )  # fmt: skip
    assert has_tiers(args)
    cache = build_cache(args, capacity_blocks=4, block_tokens=16, policy="lru", clock=ManualClock())
    assert {t: c.capacity_blocks for t, c in cache.caches.items()} == {
        Tier.DEVICE: 4,
        Tier.HOST: 62,
        Tier.DISK: 125,
    }
    assert cache.config.write_mode is WriteMode.WRITE_THROUGH
    assert cache.config.host is not None and cache.config.host.admission == "seen-twice"
    assert cache.config.disk is not None and cache.config.disk.admission == "none"


def test_a_tier_smaller_than_a_block_is_a_config_error() -> None:
    args = parse("--host-capacity", "100")
    with pytest.raises(ConfigError, match="holds no 512-token block"):
        build_cache(args, capacity_blocks=4, block_tokens=512, policy="lru", clock=ManualClock())


def test_unknown_host_policy_is_a_config_error() -> None:
    args = parse("--host-capacity", "1k", "--host-policy", "nope")
    with pytest.raises(ConfigError, match="unknown eviction policy"):
        build_cache(args, capacity_blocks=4, block_tokens=16, policy="lru", clock=ManualClock())


def test_the_report_is_json_and_counts_by_tier() -> None:
    args = parse("--host-capacity", "128")
    cache = build_cache(args, capacity_blocks=2, block_tokens=16, policy="lru", clock=ManualClock())
    a, b = hash_block_ids([1, 2], seed=0), hash_block_ids([3, 4], seed=0)
    for hashes in (a, b, a):
        cache.access(hashes, 32)
    report = json.loads(json.dumps(tier_report(cache)))
    assert report["hit_ratio"] == report["block_hit_ratio"] == pytest.approx(1 / 3)
    assert report["hit_tokens"] == 32
    assert report["hit_ratio_by_tier"] == {"device": 0.0, "host": pytest.approx(1 / 3), "disk": 0.0}
    assert report["host_writes_blocks"] == 4
    assert report["disk_writes_blocks"] == 0
    assert report["capacity_tokens_by_tier"] == {"device": 32, "host": 128}
    assert report["admission_by_tier"] == {"host": "none"}
    assert report["write_mode"] == "write-back"
    assert report["reload_decisions"] == "llama-3-8b on h100 x1 (bf16 KV)"
    assert report["prefill_s_saved"] > 0
    assert report["prefill_s_saved_by_tier"]["host"] > 0


def test_an_unknown_cost_model_is_a_config_error() -> None:
    args = parse("--host-capacity", "1k", "--model", "gpt-9")
    with pytest.raises(ConfigError):
        build_cache(args, capacity_blocks=4, block_tokens=16, policy="lru", clock=ManualClock())
