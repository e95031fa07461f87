"""Tenants: hashed keys, secret salts, concurrency and tokens-per-minute limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.gateway.config import Limits
from kvtide.gateway.status import ApiError
from kvtide.gateway.tenants import TenantTable, hash_key


def _table(tmp_path: Path, body: str, clock: ManualClock | None = None) -> TenantTable:
    path = tmp_path / "keys.yaml"
    path.write_text(body)
    table = TenantTable(b"secret", Limits(max_concurrency=4), clock or ManualClock())
    table.load(str(path))
    return table


def _entry(name: str, key: str, extra: str = "") -> str:
    return f"  - name: {name}\n    key_sha256: {hash_key(key)}\n{extra}"


def test_keys_map_to_tenants_with_distinct_secret_salts(tmp_path: Path) -> None:
    table = _table(tmp_path, "tenants:\n" + _entry("a", "ka") + _entry("b", "kb"))
    a, b = table.authenticate("Bearer ka"), table.authenticate("Bearer kb")
    assert (a.name, b.name) == ("a", "b")
    assert a.salt and b.salt and a.salt != b.salt
    assert "ka" not in (tmp_path / "keys.yaml").read_text()
    other = TenantTable(b"other secret", Limits(), ManualClock())
    assert other.salt_for("a") != a.salt  # the salt is the server's secret, not the name's
    for header in (None, "ka", "Bearer nope", "Basic ka"):
        with pytest.raises(ApiError) as err:
            table.authenticate(header)
        assert err.value.status.http == 401


def test_without_a_keys_file_everyone_is_the_unsalted_default_tenant() -> None:
    table = TenantTable(b"s", Limits(), ManualClock())
    table.load(None)
    tenant = table.authenticate(None)
    assert (tenant.name, tenant.salt) == ("default", "")


def test_concurrency_limit_then_release(tmp_path: Path) -> None:
    table = _table(tmp_path, "tenants:\n" + _entry("a", "ka", "    max_concurrency: 2\n"))
    a = table.authenticate("Bearer ka")
    table.admit(a, 10)
    table.admit(a, 10)
    with pytest.raises(ApiError) as err:
        table.admit(a, 10)
    assert err.value.status.http == 429 and err.value.retry_after_s == 1.0
    table.release(a)
    table.admit(a, 10)


def test_tokens_per_minute_refill_and_retry_after(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    table = _table(
        tmp_path, "tenants:\n" + _entry("a", "ka", "    tokens_per_minute: 600\n"), clock
    )
    a = table.authenticate("Bearer ka")
    table.admit(a, 500)
    table.release(a)
    with pytest.raises(ApiError) as err:
        table.admit(a, 200)  # 100 left, refills at 10 a second: 10 s
    assert err.value.retry_after_s == 10.0
    clock.advance(10.0)
    table.admit(a, 200)


def test_the_bucket_is_charged_what_the_engine_reports_not_what_was_asked(
    tmp_path: Path,
) -> None:
    clock = ManualClock(100.0)
    table = _table(
        tmp_path, "tenants:\n" + _entry("a", "ka", "    tokens_per_minute: 600\n"), clock
    )
    a = table.authenticate("Bearer ka")
    table.admit(a, 300)  # asked for 300 (prompt + max_tokens), took 50
    table.settle(a, 300, 50)
    table.release(a)
    table.admit(a, 500)  # 550 left: admitted, where the charge alone left 300
    table.settle(a, 500, 900)  # no max_tokens set: the engine wrote far more
    table.release(a)
    with pytest.raises(ApiError) as err:
        table.admit(a, 10)  # -350 now: 360 short, refilled at 10 a second
    assert err.value.retry_after_s == 36.0
    clock.advance(36.0)
    table.admit(a, 10)
    unlimited = table.default
    table.settle(unlimited, 10, 10_000)  # no limit: nothing booked
    assert unlimited.bucket_tokens == 0.0


def test_tokens_charged_elsewhere_come_out_of_a_bucket_that_had_refilled(
    tmp_path: Path,
) -> None:
    """Two gateway replicas' tables, exchanging what each charged (as ``SharedState`` does
    through Redis): the second one's bucket, full after an idle hour, takes the first's
    spending at once."""
    clock = ManualClock(100.0)
    entry = "tenants:\n" + _entry("a", "ka", "    tokens_per_minute: 600\n")
    here, there = _table(tmp_path, entry, clock), _table(tmp_path, entry, clock)
    here.shared = there.shared = True
    a_here, a_there = here.authenticate("Bearer ka"), there.authenticate("Bearer ka")
    there.admit(a_there, 10)
    there.release(a_there)
    clock.advance(3600.0)
    here.admit(a_here, 300)
    here.settle(a_here, 300, 500)
    here.release(a_here)
    spent = here.take_unshared()
    assert spent == {"a": 500} and here.take_unshared() == {"a": 0}
    there.spent_elsewhere(spent)
    with pytest.raises(ApiError) as err:
        there.admit(a_there, 200)  # 100 left of 600: 10 s to refill the rest
    assert err.value.retry_after_s == 10.0


def test_reload_keeps_counters_and_applies_new_limits(tmp_path: Path) -> None:
    table = _table(tmp_path, "tenants:\n" + _entry("a", "ka"))
    a = table.authenticate("Bearer ka")
    table.admit(a, 1)
    (tmp_path / "keys.yaml").write_text(
        "tenants:\n" + _entry("a", "ka2", "    max_concurrency: 1\n")
    )
    table.load(str(tmp_path / "keys.yaml"))
    again = table.authenticate("Bearer ka2")
    assert again is a and a.in_flight == 1 and a.max_concurrency == 1
    with pytest.raises(ApiError):
        table.authenticate("Bearer ka")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ("tenants: 3\n", "expected 'tenants:'"),
        ("tenants:\n  - name: a\n    key_sha256: abc\n", r"tenants\[0\].key_sha256"),
        ("tenants:\n  - key_sha256: " + "a" * 64 + "\n", r"tenants\[0\].name"),
        ("tenants:\n  - name: a\n    key: x\n", "unknown keys"),
    ],
)
def test_bad_keys_file_names_the_entry(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _table(tmp_path, body)
