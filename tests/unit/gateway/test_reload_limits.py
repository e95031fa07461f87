"""``Gateway.reload`` (SIGHUP): every limit of the new file reaches every part holding a copy,
and a file that fails anywhere changes nothing (the log says so, no traceback)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvtide.gateway.app import Gateway
from kvtide.gateway.config import load_config

KEY_HASH = "a" * 64


def _write(path: Path, limits: str, keys: Path, replicas: str = "[http://127.0.0.1:1=m]") -> None:
    path.write_text(f"replicas: {replicas}\napi_keys: {keys}\nlimits: {{{limits}}}\n")


def _keys(path: Path, conc: object = 2) -> Path:
    path.write_text(
        f"tenants:\n  - {{name: alice, key_sha256: '{KEY_HASH}', max_concurrency: {conc}}}\n"
    )
    return path


def test_a_reload_applies_the_prompt_limits_and_the_keyless_defaults(tmp_path: Path) -> None:
    cfg, keys = tmp_path / "gw.yaml", _keys(tmp_path / "keys.yaml")
    _write(cfg, "max_prompt_chars: 5000, max_concurrency: 8, tokens_per_minute: 0", keys)
    gw = Gateway(load_config(str(cfg), {}))
    _write(cfg, "max_prompt_chars: 100, max_prompt_tokens: 50, max_concurrency: 1, "
           "tokens_per_minute: 60, max_body_bytes: 1000", keys)  # fmt: skip
    gw.reload()
    assert (gw.prompts.max_prompt_chars, gw.prompts.max_prompt_tokens) == (100, 50)
    assert gw.config.limits.max_body_bytes == 1000  # what GatewayApp reads per request
    assert gw.tenants.default.max_concurrency == 1
    assert gw.tenants.default.tokens_per_minute == 60
    assert gw.config.limits.max_prompt_chars == 100


@pytest.mark.parametrize(
    "breakage",
    [
        "replicas",  # a wrong shape: a TypeError once, logged as a traceback
        "keys",  # an entry the keys file refuses after one it took
    ],
)
def test_a_failed_reload_changes_nothing(
    tmp_path: Path, breakage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, keys = tmp_path / "gw.yaml", _keys(tmp_path / "keys.yaml")
    _write(cfg, "max_prompt_chars: 5000, max_concurrency: 8", keys)
    gw = Gateway(load_config(str(cfg), {}))
    before = (gw.tenants.limits, gw.prompts.max_prompt_chars, gw.tenants.by_name["alice"])
    conc = gw.tenants.by_name["alice"].max_concurrency
    if breakage == "replicas":
        _write(cfg, "max_prompt_chars: 10, max_concurrency: 1", keys, replicas="5")
    else:
        bad = tmp_path / "keys2.yaml"
        bad.write_text(
            f"tenants:\n  - {{name: alice, key_sha256: '{KEY_HASH}', max_concurrency: 50}}\n"
            "  - {name: bob, key_sha256: nothex}\n"
        )
        _write(cfg, "max_prompt_chars: 10, max_concurrency: 1", bad)
    with caplog.at_level(logging.ERROR, logger="kvtide.gateway"):
        gw.reload()
    assert "reload failed, keeping the running config" in caplog.text
    assert not any(r.exc_info for r in caplog.records)
    assert (gw.tenants.limits, gw.prompts.max_prompt_chars) == before[:2]
    assert gw.tenants.by_name["alice"] is before[2]
    assert gw.tenants.by_name["alice"].max_concurrency == conc
    assert [r.replica_id for r in gw.replicas] == ["127.0.0.1:1"]
