"""Tenants: hashed keys, secret salts, concurrency and tokens-per-minute limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtide.clock import ManualClock
from kvtide.errors import ConfigError
from kvtide.gateway.config import Limits
from kvtide.gateway.status import ApiError
from kvtide.gateway.tenants import TenantTable, hash_key
from kvtide.gateway.usage import OutputCounter


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


def test_a_keys_file_with_one_bad_entry_changes_no_tenant(tmp_path: Path) -> None:
    table = _table(tmp_path, "tenants:\n" + _entry("a", "ka", "    max_concurrency: 1\n"))
    a = table.authenticate("Bearer ka")
    (tmp_path / "keys.yaml").write_text(
        "tenants:\n"
        + _entry("a", "ka", "    max_concurrency: 50\n    tokens_per_minute: 9\n")
        + "  - name: b\n    key_sha256: not-a-sha256\n"
    )
    with pytest.raises(ConfigError, match=r"tenants\[1\].key_sha256"):
        table.load(str(tmp_path / "keys.yaml"))
    assert (a.max_concurrency, a.tokens_per_minute) == (1, 0)
    assert table.authenticate("Bearer ka") is a


def test_one_admission_books_at_most_a_minute_and_a_refusal_refunds_it(
    tmp_path: Path,
) -> None:
    """``max_tokens`` of ten million on 600 a minute: admitted on a full bucket, booked 600
    (no debt); the engine refuses it (settled on 0 tokens) and the bucket is full again."""
    clock = ManualClock(100.0)
    table = _table(
        tmp_path, "tenants:\n" + _entry("a", "ka", "    tokens_per_minute: 600\n"), clock
    )
    a = table.authenticate("Bearer ka")
    charged = table.admit(a, 10_000_000)
    table.release(a)
    assert charged == 600 and a.bucket_tokens == 0.0
    with pytest.raises(ApiError) as err:
        table.admit(a, 10)
    assert err.value.retry_after_s == 1.0  # 10 tokens at 10 a second, not days
    table.settle(a, charged, 0)
    assert table.admit(a, 600) == 600


def test_tokens_spent_elsewhere_reach_a_keys_file_tenant_named_default(
    tmp_path: Path,
) -> None:
    """``--state redis://``: a keys-file tenant may be named "default"; what other gateway
    replicas charged it comes out of its bucket, not the keyless default tenant's."""
    clock = ManualClock(100.0)
    entry = "tenants:\n" + _entry("default", "kd", "    tokens_per_minute: 600\n")
    here, there = _table(tmp_path, entry, clock), _table(tmp_path, entry, clock)
    here.shared = there.shared = True
    mine = here.authenticate("Bearer kd")
    here.admit(mine, 500)
    here.settle(mine, 500, 500)
    here.release(mine)
    spent = here.take_unshared()
    assert spent == {"default": 500}
    there.spent_elsewhere(spent)
    with pytest.raises(ApiError) as err:
        there.admit(there.authenticate("Bearer kd"), 200)
    assert err.value.retry_after_s == 10.0  # 100 left of 600


def test_a_cut_off_stream_is_charged_one_token_per_output_event() -> None:
    """What a stream without its usage event is charged: one token per choice with text,
    counted in whole events however the reads split them; the role and finish events, and
    the usage event, carry none."""
    head = b'data: {"id":"c","object":"chat.completion.chunk","choices":['
    events = [
        head + b'{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        head + b'{"index":0,"delta":{"content":"He"}}]}\n\n',
        head + b'{"index":0,"delta":{"content":"\\"llo"}}]}\n\n',
        head + b'{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n',
        b'data: {"choices":[{"index":0,"text":" x","logprobs":null}]}\r\n\r\n',
        head + b'{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}\n\n',
        head + b'],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n',
    ]
    stream = b"".join(events)
    counter = OutputCounter()
    for i in range(0, len(stream), 7):  # reads that cut events anywhere
        counter.take(stream[i : i + 7])
    assert counter.tokens == 4
    counter.take(head + b'{"index":0,"delta":{"content":"unended"}}]}')
    assert counter.tokens == 4  # not yet a whole event
