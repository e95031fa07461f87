"""Replica health: ejection after consecutive failures, doubling ejection, slow start."""

from __future__ import annotations

from kvtide.clock import ManualClock
from kvtide.gateway.config import Failover, ReplicaSpec
from kvtide.gateway.health import apply_scrape, parse_engine_metrics
from kvtide.gateway.replicas import ReplicaSet, Stage


def _set() -> ReplicaSet:
    rs = ReplicaSet(Failover(eject_after=2, eject_s=1.0, max_eject_s=3.0), 16, ManualClock())
    rs.add(ReplicaSpec("http://h:1", "m"))
    rs.add(ReplicaSpec("http://h:2", "n"))
    return rs


def test_consecutive_failures_eject_and_success_resets() -> None:
    rs = _set()
    r = rs.get("h:1")
    assert r is not None
    assert not r.failed(0.0)
    r.succeeded()
    assert not r.failed(0.0)
    assert r.failed(0.0)  # second in a row
    assert r.is_down and not r.state.healthy and r.ejected_until_s == 1.0
    assert rs.candidates("m") == []
    r.readmit()
    assert r.failed(5.0) is False and r.failed(5.0)
    assert r.ejected_until_s == 7.0  # the ejection doubled


def test_a_passing_health_check_clears_only_what_health_checks_counted() -> None:
    """An engine that answers /health but fails every completion: passing checks between
    the failures cleared them all, so it was never ejected at moderate traffic."""
    rs = _set()
    r = rs.get("h:1")
    assert r is not None
    assert not r.failed(0.0)  # a request failed
    r.health_passed()
    assert r.failed(0.0)  # the second request failure in a row ejects
    r.readmit()
    assert not r.health_failed(5.0)  # a check failed ...
    r.health_passed()  # ... and the next passed: that failure is gone
    assert not r.failed(5.0)
    assert r.health_failed(5.0)  # a request failure and a check failure in a row
    r.readmit()
    assert not r.failed(9.0)
    r.succeeded()  # a request that succeeds clears every kind
    assert not r.health_failed(9.0)


def test_slow_start_allowance_doubles_until_uncapped() -> None:
    rs = _set()
    r = rs.get("h:1")
    assert r is not None
    r.eject(0.0)
    r.readmit()
    assert r.allowance == 1
    r.in_flight = 1
    assert not r.can_take()
    for expected in (2, 4, 8, 16, 32):
        r.succeeded()
        assert r.allowance == expected
    r.succeeded()
    assert r.allowance is None and r.can_take()


def test_candidates_follow_models_and_drain() -> None:
    rs = _set()
    assert [r.replica_id for r in rs.candidates("n")] == ["h:2"]
    assert rs.models() == ["m", "n"] and not rs.serves("o")
    r = rs.get("h:2")
    assert r is not None
    r.draining = True
    assert rs.candidates("n") == [] and rs.serves("n")


def test_least_loaded_takes_the_fewest_in_flight_and_shares_ties_in_turn() -> None:
    rs = ReplicaSet(Failover(), 16, ManualClock())
    for port in (1, 2, 3):
        rs.add(ReplicaSpec(f"http://h:{port}", "m"))
    ones = [rs.least_loaded("m") for _ in range(6)]
    assert {r.replica_id for r in ones if r is not None} == {"h:1", "h:2", "h:3"}
    a, b, c = (rs.get(f"h:{port}") for port in (1, 2, 3))
    assert a is not None and b is not None and c is not None
    a.in_flight, b.in_flight, c.in_flight = 2, 0, 1
    assert [rs.least_loaded("m") for _ in range(3)] == [b, b, b]
    assert rs.least_loaded("m", exclude=b.replica_id) is c
    b.others = 5  # another gateway's requests, as scraped
    assert rs.least_loaded("m") is c
    c.is_down = True
    assert rs.least_loaded("m") is a and rs.least_loaded("nope") is None


def test_scraped_load_adds_other_gateways_requests() -> None:
    rs = _set()
    r = rs.get("h:1")
    assert r is not None
    text = (
        b"# HELP vllm:num_requests_running x\n"
        b'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
        b'vllm:num_requests_running{model_name="m",engine="1"} 2.0\n'
        b'vllm:num_requests_waiting{model_name="m"} 4.0\n'
        b'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        b"vllm:num_requests_running_other 100\n"
    )
    scraped = parse_engine_metrics(text)
    assert scraped == {
        "vllm:num_requests_running": 5.0,
        "vllm:num_requests_waiting": 4.0,
        "vllm:kv_cache_usage_perc": 0.5,
    }
    r.in_flight = r.state.num_requests = 2
    apply_scrape(r, scraped)
    assert r.state.num_requests == 9  # 2 of ours + 7 from elsewhere
    assert r.state.kv_utilization == 0.5
    apply_scrape(r, {"vllm:num_requests_running": 2.0})
    assert r.state.num_requests == 2  # the others finished


def test_the_engines_kv_capacity_comes_from_vllms_cache_config_info() -> None:
    rs = _set()  # 16-token blocks at the gateway
    r = rs.get("h:1")
    assert r is not None
    text = (
        b"# TYPE vllm:cache_config_info gauge\n"
        b'vllm:cache_config_info{block_size="32",cache_dtype="auto",engine="0",'
        b'num_gpu_blocks="1000"} 1.0\n'
        b'vllm:cache_config_info{engine="1",num_gpu_blocks="500",block_size="32"} 1.0\n'
    )
    scraped = parse_engine_metrics(text)
    assert scraped == {"capacity_tokens": 48_000.0}  # two data-parallel engines
    apply_scrape(r, scraped)
    assert r.state.capacity_blocks == 3_000  # in the gateway's blocks
    # without the info line the capacity stays unknown (no room check), usage still counts
    other = rs.get("h:2")
    assert other is not None
    apply_scrape(other, parse_engine_metrics(b'vllm:kv_cache_usage_perc{engine="0"} 0.25\n'))
    assert other.state.capacity_blocks == 0 and other.state.kv_utilization == 0.25


def test_roles_split_a_models_replicas_into_the_two_legs_of_a_request() -> None:
    rs = ReplicaSet(Failover(), 16, ManualClock())
    for port, role in ((1, "prefill"), (2, "prefill"), (3, "decode"), (4, "both")):
        rs.add(ReplicaSpec(f"http://h:{port}", "m", role=role))
    rs.add(ReplicaSpec("http://h:5", "n"))

    def ids(stage: Stage) -> list[str]:
        return [r.replica_id for r in rs.candidates("m", stage=stage)]

    assert ids(None) == ["h:1", "h:2", "h:3", "h:4"]  # a request not split: any of them
    assert ids("prefill") == ["h:1", "h:2", "h:4"]
    assert ids("decode") == ["h:3", "h:4"]
    assert rs.disaggregated("m") and not rs.disaggregated("n")
    d, b = rs.get("h:3"), rs.get("h:4")
    assert d is not None and b is not None
    b.in_flight = 1
    assert rs.least_loaded("m", stage="decode") is d
    assert rs.least_loaded("m", exclude=d.replica_id, stage="decode") is b
    d.is_down = b.is_down = True
    assert rs.least_loaded("m", stage="decode") is None
