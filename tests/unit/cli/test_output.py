"""What the commands print reads right: every table fits an 80-column terminal with every router,
policy and design name whole; a metric that does not apply is a dash; tier hits and misses add
up; the run header names every tier; signs agree with the words beside them."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from kvtide.cli.study import findings, print_rows
from kvtide.cli.tables import Column, print_table
from kvtide.display import DASH

ROOT = Path(__file__).resolve().parents[3]
LONG_ROUTERS = "round_robin,peer_dynamo,peer_preble"
SIM = ["--requests", "80", "--replicas", "2", "--quiet", "--jobs", "1"]


def kvtide(*argv: str, columns: int = 80) -> str:
    """The command in a fresh process, its stdout a pipe and COLUMNS set, as a user would run
    it with ``| less`` in an 80-column terminal."""
    env = {**os.environ, "COLUMNS": str(columns), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, "-m", "kvtide", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_fits(out: str, names: list[str], width: int = 80) -> None:
    long = [line for line in out.splitlines() if len(line) > width]
    assert not long, f"lines over {width} columns: {long}"
    assert "…" not in out
    for name in names:
        assert re.search(rf"(^|\s){re.escape(name)}(\s|$)", out, re.M), f"{name!r} cut or missing"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (
            ["simulate", *SIM, "--router", LONG_ROUTERS, "--host-cache-tokens", "64k"],
            LONG_ROUTERS.split(","),
        ),
        (
            [
                "replay",
                "builtin:chat:sessions=12,turns=3",
                "--capacity",
                "2000,8000",
                "--policy",
                "lru,s3fifo,tide",
                "--oracle",
                "--host-capacity",
                "16000",
                "--disk-capacity",
                "32000",
                "--jobs",
                "1",
            ],
            ["lru", "s3fifo", "tide", "optimum"],
        ),
        (["cost", "--model", "llama-3-70b", "--gpu", "h800", "--tp", "8"], ["131,072"]),
        (["sweep", str(ROOT / "examples" / "sweep.yaml"), "--quiet", "--jobs", "1"], ["cost"]),
        (
            ["study", "tiers", "--requests", "60", "--quiet", "--jobs", "1"],
            ["GPU only", "host 8× + disk 32× (seen-twice)"],
        ),
        (
            ["study", "coordinator", "--requests", "40", "--replicas", "2", "--quiet"],
            ["global index: precise", "local hashing: chash", "stale (1 s lag, 1% loss)"],
        ),
    ],
    ids=["simulate", "replay", "cost", "sweep", "study-tiers", "study-coordinator"],
)
def test_every_table_fits_80_columns_with_whole_names(argv: list[str], names: list[str]) -> None:
    assert_fits(kvtide(*argv), names)


def test_a_wide_terminal_keeps_one_table() -> None:
    out = kvtide("simulate", *SIM, "--router", "round_robin,cost", columns=200)
    assert out.count("router ") == 1  # one header row


def test_a_table_too_wide_is_split_and_repeats_its_keys() -> None:
    console = Console(width=40, record=True, file=io.StringIO())
    columns = [Column(f"metric {i}", group=str(i // 2)) for i in range(8)]
    rows = [["a_long_router_name", *(f"{i}.000" for i in range(8))], ["b", *["1"] * 8]]
    print_table(console, "t", [Column("router")], columns, rows)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 40
    assert text.count("a_long_router_name") >= 2  # the key is repeated in every part
    for i in range(8):
        assert f"metric {i}" in text and f"{i}.000" in text


def test_tpot_under_prefill_only_is_a_dash_not_zero(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    out = kvtide(
        "simulate", *SIM, "--router", "cost", "--prefill-only", "--json", str(path), columns=200
    )
    (row,) = [line for line in out.splitlines() if line.startswith("cost ")]
    assert DASH in row and "0.0000" not in row
    (run,) = json.loads(path.read_text())["runs"]
    assert run["tpot_s"] == {"mean": None, "p50": None, "p90": None, "p99": None}
    assert run["ttft_s"]["p50"] > 0


def test_tier_hits_add_up_and_the_header_names_every_tier(tmp_path: Path) -> None:
    path = tmp_path / "sim.json"
    tiers = ["--gpu-cache-tokens", "16000", "--host-cache-tokens", "64000"]
    out = kvtide(
        "simulate", *SIM, "--router", "cost", *tiers, "--disk-cache-tokens", "128000",
        "--json", str(path), columns=200,
    )  # fmt: skip
    header = out.splitlines()[1]
    assert "GPU 16k tokens + host 64k tokens + disk 128k tokens" in header
    assert "all tiers" in out
    (row,) = [line for line in out.splitlines() if line.startswith("cost ")]
    shares = [float(x) for x in re.findall(r"([\d.]+)%", row)]
    total, device, host, disk = shares[:4]
    assert total == pytest.approx(device + host + disk, abs=0.15)  # each rounded to 0.1
    (run,) = json.loads(path.read_text())["runs"]
    assert run["hit_ratio"] == pytest.approx(sum(run["hit_ratio_by_tier"].values()))


def test_replay_with_tiers_labels_device_misses_and_they_add_up(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    out = kvtide(
        "replay", "builtin:chat:sessions=12,turns=3", "--capacity", "2000", "--policy", "lru",
        "--host-capacity", "4000", "--jobs", "1", "--json", str(path), columns=200,
    )  # fmt: skip
    assert "dev. miss" in out and "device hit" in out
    title = " ".join(out.split())  # rich wraps a title to its table's width
    assert "tiers: device (the capacity column) + host 4k tokens, write-back" in title
    (row,) = [line for line in out.splitlines() if line.startswith("lru ")]
    total, device, host, disk, cold, evicted, partial = (
        float(x) for x in re.findall(r"([\d.]+)%", row)[:7]
    )
    assert host > 0
    assert total == pytest.approx(device + host + disk, abs=0.02)
    assert device + cold + evicted + partial == pytest.approx(100, abs=0.02)
    (run,) = json.loads(path.read_text())["runs"]
    assert run["device_hit_tokens"] + sum(run["miss_tokens"].values()) == run["prompt_tokens"]


def _row(router: str, state: str, hit: float, loss: float, change: float) -> dict[str, object]:
    return {
        "traffic": "uniform",
        "design": f"global index: {router}",
        "router": router,
        "state": state,
        "hit_ratio": hit,
        "ttft_p50_s": 0.02,
        "ttft_p99_s": 0.1,
        "load_imbalance": 1.1,
        "hit_ratio_loss_points": loss,
        "ttft_p99_change": change,
        "index_precision": 1.0,
        "event_batches_lost": 0,
    }


def test_the_coordinator_table_and_findings_agree_in_sign() -> None:
    rows = [
        _row("precise", "fresh", 0.60, 0.0, 0.0),
        _row("chash", "none", 0.582, 1.8, 0.25),
        _row("cost", "fresh", 0.628, -2.8, -0.0004),
    ]
    console = Console(width=200, record=True, file=io.StringIO())
    print_rows(console, "uniform", "spec", rows)
    table = console.export_text()
    chash = next(line for line in table.splitlines() if "chash" in line)
    cost = next(line for line in table.splitlines() if "global index: cost" in line)
    assert " -1.8 " in chash and " +25% " in chash
    assert " +2.8 " in cost and " 0% " in cost and "-0%" not in cost
    said = {line.split(" (")[0]: line for line in findings(rows)}
    assert "1.8 points below a fresh global index" in said["uniform: chash"]
    assert "2.8 points above a fresh global index" in said["uniform: cost"]
    assert "(0%)" in said["uniform: cost"]
