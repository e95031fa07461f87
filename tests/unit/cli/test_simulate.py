"""`kvtide simulate` in-process: small runs, the JSON contract, determinism, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtide.cli import main

SMALL = ["simulate", "--requests", "60", "--quiet", "--jobs", "1", "--replicas", "2"]
RUN_KEYS = {
    "router",
    "eviction",
    "requests",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "hit_ratio",
    "hit_ratio_by_tier",
    "throughput_tok_s",
    "load_imbalance",
    "evictions_per_s",
    "prefill_tokens_computed",
}


def test_simulate_compares_routers_in_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--router", "round_robin,least_load"]) == 0
    out = capsys.readouterr().out
    assert "round_robin" in out and "least_load" in out and "TTFT" in out and "p99" in out


def test_simulate_json_has_exactly_the_contracted_keys(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    assert main([*SMALL, "--router", "round_robin,random", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert set(doc) == {"workload", "runs"}
    assert [run["router"] for run in doc["runs"]] == ["round_robin", "random"]
    for run in doc["runs"]:
        assert set(run) == RUN_KEYS
        assert run["requests"] == 60
        for key in ("ttft_s", "tpot_s", "e2e_s"):
            assert set(run[key]) == {"mean", "p50", "p90", "p99"}
            assert 0 < run[key]["p50"] <= run[key]["p99"]
        assert 0.0 <= run["hit_ratio"] <= 1.0
        assert set(run["hit_ratio_by_tier"]) == {"device"}
    assert doc["workload"]["requests"] == 60


def test_lower_tiers_serve_hits_and_the_filter_saves_host_writes(tmp_path: Path) -> None:
    # A GPU cache far too small for the workload: what the tiers keep shows up as their hits.
    tiers = ["--gpu-cache-tokens", "16k", "--router", "cost", "--requests", "200"]
    runs = {}
    for name, extra in {
        "gpu": [],
        "host": ["--host-cache-tokens", "256k"],
        "disk": ["--disk-cache-tokens", "256k"],
        "filtered": ["--host-cache-tokens", "256k", "--host-admission", "seen-twice"],
    }.items():
        path = tmp_path / f"{name}.json"
        assert main([*SMALL, *tiers, *extra, "--json", str(path)]) == 0
        runs[name] = json.loads(path.read_text())["runs"][0]
    assert set(runs["gpu"]["hit_ratio_by_tier"]) == {"device"}
    assert set(runs["host"]["hit_ratio_by_tier"]) == {"device", "host"}
    assert set(runs["disk"]["hit_ratio_by_tier"]) == {"device", "disk"}
    assert runs["host"]["hit_ratio_by_tier"]["host"] > 0
    assert runs["disk"]["hit_ratio_by_tier"]["disk"] > 0
    assert runs["host"]["hit_ratio"] > runs["gpu"]["hit_ratio"]
    assert (
        0
        < runs["filtered"]["hit_ratio_by_tier"]["host"]
        < runs["host"]["hit_ratio_by_tier"]["host"]
    )


def test_same_seed_gives_byte_identical_json(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = [*SMALL, "--router", "round_robin,random", "--load", "0.8"]
    assert main([*args, "--json", str(a)]) == 0
    assert main([*args, "--json", str(b), "--jobs", "2"]) == 0  # processes change nothing
    assert a.read_bytes() == b.read_bytes()
    c = tmp_path / "c.json"
    assert main([*args, "--json", str(c), "--seed", "1"]) == 0
    assert c.read_bytes() != a.read_bytes()


def test_load_rescales_arrivals(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    assert main([*SMALL, "--router", "round_robin", "--load", "0.5", "--json", str(path)]) == 0
    workload = json.loads(path.read_text())["workload"]
    assert workload["offered_load"] == pytest.approx(0.5)
    assert workload["time_scale"] != 1.0


def test_report_is_one_html_file(tmp_path: Path) -> None:
    assert main([*SMALL, "--router", "round_robin", "--report", str(tmp_path / "rep")]) == 0
    (page,) = (tmp_path / "rep").iterdir()
    html = page.read_text()
    assert page.name == "index.html" and html.count("<svg") >= 5
    assert "<script" not in html and "http" not in html.replace("http://www.w3.org", "")


def test_disaggregated_and_outage_runs(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    argv = [*SMALL, "--router", "least_load", "--decode-replicas", "1", "--outage", "0:5:20"]
    assert main([*argv, "--json", str(path)]) == 0
    (run,) = json.loads(path.read_text())["runs"]
    assert run["requests"] == 60


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--router", "nope"], "unknown router"),
        (["--workload", "builtin:nope"], "unknown built-in"),
        (["--model", "gpt-9"], "unknown model"),
        (["--load", "0.5", "--time-scale", "2"], "either a load or a time scale"),
        (["--outage", "zero"], "REPLICA:START"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*SMALL, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
