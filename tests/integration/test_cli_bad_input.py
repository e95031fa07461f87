"""Every command, driven through the real `kvtide` console script as a subprocess, with malformed
and out-of-range values and sweep files of the wrong types: exit code 2, one line on stderr
naming the flag or key and the value, no traceback, each case bounded in time.

The cases are the classes issue 9 names: values that ended in a traceback (``replay --capacity
inf``, ``simulate --gpu-cache-tokens 10G``, sweep ``router: [5]``), values that were silently
accepted (``--event-delay nan``, ``--outage 0:-1:5``, ``prefill_only: "no"``, ``--router
cost,,chash``, ``--jobs 0``), suffixes that meant two things, checks that came only after the
run (output paths, a model that does not fit its GPU, a request longer than the whole pool), and
inputs that made a command run without end (rows sharing one timestamp).

The subprocesses run concurrently (a few at a time) in one fixture; each test then checks its
own case's outcome.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
KVTIDE = Path(sys.executable).with_name("kvtide")
TIMEOUT_S = 30.0
"""Bound of one bad-input case; every one of them should end in about a second."""

SIM = ["--workload", "builtin:chat:sessions=3", "--requests", "8", "--jobs", "1", "--quiet"]
SIM1 = [*SIM, "--router", "cost"]
REPLAY = ["builtin:chat:sessions=3", "--requests", "8", "--jobs", "1", "--policy", "lru"]
COST = ["--model", "llama-3-8b", "--gpu", "h100"]
STUDY = [
    "--requests",
    "8",
    "--jobs",
    "1",
    "--quiet",
    "--uniform",
    "builtin:chat:sessions=3",
    "--skewed",
    "builtin:chat:sessions=3",
]
LOAD = ["--url", "http://127.0.0.1:9", "--workload", "builtin:chat:sessions=2", "--requests", "2"]
TIERS = [*SIM, "--host-multiples", "0,1", "--disk-multiple", "0"]
pytestmark = pytest.mark.timeout(900)  # the cases share one fixture; each has TIMEOUT_S
ROWS = "new_tokens,cached_tokens,seconds\n512,0,0.01\n1024,0,0.02\n2048,0,0.04\n1024,1024,0.03\n"

BASE_YAML = "base:\n  workload: builtin:chat:sessions=3\n  requests: 8\n"


@dataclass(frozen=True)
class Case:
    argv: list[str]
    says: tuple[str, ...]
    """Substrings of the one error line: the flag or key, and the value."""
    files: tuple[tuple[str, str], ...] = ()
    """(name, content) written into the case's folder first; ``{dir}`` in argv is it."""


def sweep(grid_or_base: str, *flags: str) -> Case:
    """A sweep over a YAML file: BASE_YAML plus ``grid_or_base`` (YAML text)."""
    return Case(
        ["sweep", "{dir}/s.yaml", "--jobs", "1", "--quiet", *flags],
        (),
        (("s.yaml", BASE_YAML + grid_or_base),),
    )


def says(case: Case, *parts: str) -> Case:
    return Case(case.argv, parts, case.files)


CASES: dict[str, Case] = {
    # --- simulate: sizes, numbers, lists, names --------------------------------------------
    "simulate gpu-cache 10G": Case(
        ["simulate", *SIM1, "--gpu-cache-tokens", "10G"], ("--gpu-cache-tokens", "10,000,000,000")
    ),
    "simulate gpu-cache nan": Case(
        ["simulate", *SIM1, "--gpu-cache-tokens", "nan"], ("--gpu-cache-tokens", "'nan'")
    ),
    "simulate gpu-cache below a block": Case(
        ["simulate", *SIM1, "--gpu-cache-tokens", "8"], ("--gpu-cache-tokens", "8 tokens")
    ),
    "simulate disk-cache inf": Case(
        ["simulate", *SIM1, "--disk-cache-tokens", "inf"], ("--disk-cache-tokens", "'inf'")
    ),
    "simulate disk-cache 1e15": Case(
        ["simulate", *SIM1, "--disk-cache-tokens", "1e15"], ("--disk-cache-tokens", "'1e15'")
    ),
    "simulate requests 0": Case(["simulate", *SIM1, "--requests", "0"], ("--requests", "'0'")),
    "simulate block-tokens 0": Case(
        ["simulate", *SIM1, "--block-tokens", "0"], ("--block-tokens", "'0'")
    ),
    "simulate replicas 0": Case(["simulate", *SIM1, "--replicas", "0"], ("--replicas", "'0'")),
    "simulate replicas huge": Case(
        ["simulate", *SIM1, "--replicas", "1000000"], ("--replicas", "'1000000'")
    ),
    "simulate tp 0": Case(["simulate", *SIM1, "--tp", "0"], ("--tp", "'0'")),
    "simulate max-batched-tokens nan": Case(
        ["simulate", *SIM1, "--max-batched-tokens", "nan"], ("--max-batched-tokens", "'nan'")
    ),
    "simulate time-scale nan": Case(
        ["simulate", *SIM1, "--time-scale", "nan"], ("--time-scale", "'nan'")
    ),
    "simulate load nan": Case(["simulate", *SIM1, "--load", "nan"], ("--load", "'nan'")),
    "simulate load inf": Case(["simulate", *SIM1, "--load", "inf"], ("--load", "'inf'")),
    "simulate event-delay nan": Case(
        ["simulate", *SIM1, "--event-delay", "nan"], ("--event-delay", "'nan'")
    ),
    "simulate event-loss nan": Case(
        ["simulate", *SIM1, "--event-loss", "nan"], ("--event-loss", "'nan'")
    ),
    "simulate event-loss 1.5": Case(
        ["simulate", *SIM1, "--event-loss", "1.5"], ("--event-loss", "'1.5'")
    ),
    "simulate outage negative start": Case(
        ["simulate", *SIM1, "--outage", "0:-1:5"], ("--outage", "'0:-1:5'")
    ),
    "simulate outage ends first": Case(
        ["simulate", *SIM1, "--outage", "0:9:5"], ("--outage", "'0:9:5'")
    ),
    "simulate outage of no replica": Case(
        ["simulate", *SIM1, "--outage", "9:1"], ("--outage", "replica 9")
    ),
    "simulate router empty item": Case(
        ["simulate", *SIM, "--router", "cost,,chash"], ("--router", "'cost,,chash'")
    ),
    "simulate router unknown": Case(["simulate", *SIM, "--router", "nope"], ("'nope'",)),
    "simulate jobs 0": Case(["simulate", *SIM1, "--jobs", "0"], ("--jobs", "'0'")),
    "simulate model unknown": Case(["simulate", *SIM1, "--model", "gpt-9"], ("'gpt-9'",)),
    "simulate workload option nan": Case(
        ["simulate", *SIM1, "--workload", "builtin:chat:sessions=nan"], ("sessions",)
    ),
    # --- simulate: checks before the run ---------------------------------------------------
    "simulate json folder missing": Case(
        ["simulate", *SIM1, "--json", "{dir}/no/such/out.json"], ("--json", "no/such")
    ),
    "simulate report is a file": Case(
        ["simulate", *SIM1, "--report", "{dir}/f.txt"], ("--report", "f.txt"), (("f.txt", "x"),)
    ),
    "simulate weights do not fit": Case(
        ["simulate", *SIM1, "--model", "llama-3-70b", "--gpu", "h100"],
        ("--model", "llama-3-70b", "--tp"),
    ),
    "simulate default KV does not fit": Case(
        ["simulate", *SIM1, "--model", "llama-3-70b", "--tp", "2"],
        ("--gpu-cache-tokens", "262,144"),
    ),
    # --- study -------------------------------------------------------------------------------
    "study coordinator lag nan": Case(
        ["study", "coordinator", *STUDY, "--lag", "nan"], ("--lag", "'nan'")
    ),
    "study coordinator loss 2": Case(
        ["study", "coordinator", *STUDY, "--loss", "2"], ("--loss", "'2'")
    ),
    "study coordinator json unwritable": Case(
        ["study", "coordinator", *STUDY, "--json", "{dir}/no/x.json"], ("--json", "no/x.json")
    ),
    "study tiers host-multiples empty item": Case(
        ["study", "tiers", *TIERS, "--host-multiples", "1,,2"], ("--host-multiples", "'1,,2'")
    ),
    "study tiers disk-multiple inf": Case(
        ["study", "tiers", *TIERS, "--disk-multiple", "inf"], ("--disk-multiple", "'inf'")
    ),
    "study tiers disk-multiple huge pool": Case(
        ["study", "tiers", *TIERS, "--disk-multiple", "1e6"], ("--disk-multiple", "'1e6'")
    ),
    "study tiers router unknown": Case(["study", "tiers", *TIERS, "--router", "nope"], ("'nope'",)),
    # --- replay --------------------------------------------------------------------------------
    "replay capacity inf": Case(["replay", *REPLAY, "--capacity", "inf"], ("--capacity", "'inf'")),
    "replay capacity 1e400": Case(
        ["replay", *REPLAY, "--capacity", "1e400"], ("--capacity", "'1e400'")
    ),
    "replay capacity 10G": Case(
        ["replay", *REPLAY, "--capacity", "10G"], ("--capacity", "10,000,000,000")
    ),
    "replay capacity empty item": Case(
        ["replay", *REPLAY, "--capacity", "1000,,2000"], ("--capacity", "'1000,,2000'")
    ),
    "replay policy empty item": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--policy", "lru,,tide"],
        ("--policy", "'lru,,tide'"),
    ),
    "replay jobs 0": Case(["replay", *REPLAY, "--jobs", "0"], ("--jobs", "'0'")),
    "replay host-capacity nan": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--host-capacity", "nan"],
        ("--host-capacity", "'nan'"),
    ),
    "replay disk-capacity huge": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--disk-capacity", "1e15"],
        ("--disk-capacity", "'1e15'"),
    ),
    "replay dtype unknown": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--host-capacity", "20k", "--dtype", "fp4"],
        ("fp4",),
    ),
    "replay host-policy unknown": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--host-capacity", "20k", "--host-policy", "x"],
        ("--host-policy", "'x'"),
    ),
    "replay json unwritable": Case(
        ["replay", *REPLAY, "--capacity", "10k", "--json", "{dir}/no/r.json"],
        ("--json", "no/r.json"),
    ),
    # --- cost and calibrate --------------------------------------------------------------------
    "cost link-load nan": Case(["cost", *COST, "--link-load", "nan"], ("--link-load", "'nan'")),
    "cost link-load 1": Case(["cost", *COST, "--link-load", "1"], ("--link-load", "'1'")),
    "cost new-tokens 0": Case(["cost", *COST, "--new-tokens", "0"], ("--new-tokens", "'0'")),
    "cost block-tokens -1": Case(
        ["cost", *COST, "--block-tokens", "-1"], ("--block-tokens", "'-1'")
    ),
    "cost json unwritable": Case(
        ["cost", *COST, "--json", "{dir}/no/c.json"], ("--json", "no/c.json")
    ),
    "cost calibration not json": Case(
        ["cost", *COST, "--calibration", "{dir}/cal.json"], ("cal.json",), (("cal.json", "{"),)
    ),
    "calibrate out unwritable": Case(
        ["calibrate", "{dir}/rows.csv", *COST, "--out", "{dir}/no/cal.json"],
        ("--out", "no/cal.json"),
        (("rows.csv", ROWS),),
    ),
    # --- load (every case fails before any request: nothing listens on port 9) --------------
    "load rate nan": Case(["load", *LOAD, "--rate", "nan"], ("--rate", "'nan'")),
    "load concurrency 0": Case(["load", *LOAD, "--concurrency", "0"], ("--concurrency", "'0'")),
    "load timeout inf": Case(["load", *LOAD, "--timeout", "inf"], ("--timeout", "'inf'")),
    "load url not http": Case(
        ["load", *LOAD, "--url", "ftp://127.0.0.1:9"], ("--url", "'ftp://127.0.0.1:9'")
    ),
    "load json unwritable": Case(
        ["load", *LOAD, "--json", "{dir}/no/l.json"], ("--json", "no/l.json")
    ),
    # --- sweep YAML: wrong types and values -----------------------------------------------------
    "sweep router not a string": says(sweep("grid:\n  router: [5]\n"), "grid.router[0]", "5"),
    "sweep prefill_only string no": says(
        sweep('grid:\n  router: [cost]\n  prefill_only: ["no"]\n'),
        "grid.prefill_only[0]",
        "'no'",
    ),
    "sweep replicas word": says(
        sweep("grid:\n  replicas: [two, 4]\n"), "grid.replicas[0]", "'two'"
    ),
    "sweep gpu_cache_tokens 10G": says(
        sweep("grid:\n  gpu_cache_tokens: [10G]\n"), "gpu_cache_tokens", "10,000,000,000"
    ),
    "sweep mean-over not a grid key": says(
        sweep("grid:\n  router: [cost]\n", "--mean-over", "seed"), "--mean-over", "'seed'"
    ),
    "sweep load nan": says(sweep("grid:\n  load: [.nan]\n"), "grid.load[0]", "nan"),
    "sweep event_delay negative": says(
        sweep("grid:\n  router: [cost]\n  event_delay: [-1]\n"), "grid.event_delay[0]", "-1"
    ),
    "sweep kv_transfer yes": says(
        sweep("grid:\n  kv_transfer: ['yes']\n"), "grid.kv_transfer[0]", "'yes'"
    ),
    "sweep coordinator_outage backwards": says(
        sweep("grid:\n  coordinator_outage: [[5, 1]]\n"), "grid.coordinator_outage[0]", "[5, 1]"
    ),
    "sweep unknown key": says(sweep("grid:\n  routers: [cost]\n"), "'routers'"),
    "sweep grid value not a list": says(sweep("grid:\n  router: cost\n"), "grid.router", "'cost'"),
    "sweep unknown top-level key": says(sweep("grids:\n  router: [cost]\n"), "'grids'"),
    "sweep base workload not a string": Case(
        ["sweep", "{dir}/s.yaml", "--quiet"],
        ("base.workload", "5"),
        (("s.yaml", "base:\n  workload: 5\n"),),
    ),
    "sweep not yaml": Case(
        ["sweep", "{dir}/s.yaml"], ("s.yaml", "not valid YAML"), (("s.yaml", "a: [1\n"),)
    ),
    "sweep jobs 0": says(sweep("grid:\n  router: [cost]\n", "--jobs", "0"), "--jobs", "'0'"),
    "sweep out format": says(
        sweep("grid:\n  router: [cost]\n", "--out", "{dir}/rows.txt"), "--out", "'.txt'"
    ),
    "sweep out unwritable": says(
        sweep("grid:\n  router: [cost]\n", "--out", "{dir}/no/rows.csv"), "--out", "no/rows.csv"
    ),
}


@dataclass(frozen=True)
class Outcome:
    returncode: int | None
    """``None`` when the case ran past ``TIMEOUT_S`` and was killed."""
    stdout: str
    stderr: str
    wall_s: float
    cpu_s: float
    """User + system seconds of the process: what it cost, whatever else the machine runs
    (only meaningful when one subprocess runs at a time)."""


def kvtide(argv: list[str], cwd: Path, timeout_s: float = TIMEOUT_S) -> Outcome:
    """The real console script, with this checkout's sources first on the path, run in ``cwd``
    (a test's own folder: a bad value taken for a file name must not land in the checkout)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(
            [str(KVTIDE), *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return Outcome(None, out, err, time.perf_counter() - start, math.inf)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Outcome(done.returncode, done.stdout, done.stderr, time.perf_counter() - start, cpu_s)


def _run_case(root: Path, name: str, case: Case) -> Outcome:
    folder = root / name.replace(" ", "_")
    folder.mkdir()
    for file_name, content in case.files:
        (folder / file_name).write_text(content)
    return kvtide([arg.replace("{dir}", str(folder)) for arg in case.argv], folder)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("bad_input")
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run_case, root, name, case) for name, case in CASES.items()}
        return {name: future.result() for name, future in futures.items()}


def test_the_console_script_is_installed() -> None:
    assert KVTIDE.exists(), f"no kvtide console script next to {sys.executable}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(
    outcomes: dict[str, Outcome], name: str
) -> None:
    outcome = outcomes[name]
    assert outcome.returncode is not None, f"ran past {TIMEOUT_S} s"
    lines = outcome.stderr.strip().splitlines()
    assert "Traceback" not in outcome.stderr, outcome.stderr[-2000:]
    assert outcome.returncode == 2, (outcome.returncode, outcome.stderr[-500:])
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvtide: error: "), lines[0]
    for part in CASES[name].says:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"


# --- suffixes mean one thing everywhere -----------------------------------------------------


def test_one_m_is_a_million_tokens_in_every_command(tmp_path: Path) -> None:
    sim_json = tmp_path / "sim.json"
    sim = kvtide(["simulate", *SIM1, "--gpu-cache-tokens", "1M", "--json", str(sim_json)], tmp_path)
    assert sim.returncode == 0, sim.stderr
    setup = json.loads(sim_json.read_text())["workload"]["setup"]
    assert setup["gpu_cache_tokens"] == 1_000_000
    replay_json = tmp_path / "replay.json"
    replay = kvtide(
        ["replay", *REPLAY, "--capacity", "1M,256Ki", "--json", str(replay_json)], tmp_path
    )
    assert replay.returncode == 0, replay.stderr
    runs = json.loads(replay_json.read_text())["runs"]
    assert [r["capacity_tokens"] for r in runs] == [1_000_000, 262_144]


# --- the hang: workloads with no time span end quickly --------------------------------------


def _mooncake_rows(n: int, timestamp: int = 0) -> str:
    rows = (
        {"timestamp": timestamp, "input_length": 1500, "output_length": 300, "hash_ids": [0, i, 9]}
        for i in range(1, n + 1)
    )
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize(
    ("shape", "argv"),
    [
        ("one line", []),
        ("one instant", []),
        ("one instant", ["--load", "1000"]),
        ("one instant", ["--requests", "5"]),
    ],
)
def test_simulate_on_a_trace_with_no_time_span_ends_in_under_5_s(
    tmp_path: Path, shape: str, argv: list[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(_mooncake_rows(1 if shape == "one line" else 30))
    outcome = kvtide(
        ["simulate", "--workload", str(trace), "--jobs", "1", "--quiet", *argv],
        tmp_path,
        timeout_s=60,
    )
    if "--load" in argv:  # a load needs arrivals spread over time: refused at once
        assert outcome.returncode == 2 and "--load" in outcome.stderr
    else:
        assert outcome.returncode == 0, outcome.stderr
    # CPU seconds, not wall: a loaded test machine stretches the wall clock, not the work.
    assert outcome.cpu_s < 5.0, f"{outcome.cpu_s:.1f} CPU s ({outcome.wall_s:.1f} s wall)"


def test_simulate_on_the_shared_mooncake_trace_head_ends_in_under_5_s(tmp_path: Path) -> None:
    """The issue's own reproduction: the trace's first rows share timestamp 0."""
    trace = (
        Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
    )
    if not trace.exists():
        pytest.skip(f"{trace} is not here")
    outcome = kvtide(
        ["simulate", "--workload", str(trace), "--requests", "5", "--jobs", "1", "--quiet"],
        tmp_path,
        timeout_s=60,
    )
    assert outcome.returncode == 0, outcome.stderr
    # CPU seconds, not wall: a loaded test machine stretches the wall clock, not the work.
    assert outcome.cpu_s < 5.0, f"{outcome.cpu_s:.1f} CPU s ({outcome.wall_s:.1f} s wall)"


# --- a request longer than the whole pool: named by line, skipped, alike in both commands ---


def test_replay_and_simulate_skip_a_too_long_request_naming_its_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    long_row = {
        "timestamp": 2000,
        "input_length": 100_000,
        "output_length": 10,
        "hash_ids": list(range(100, 100 + 196)),
    }
    # Line 2 is blank: the readers skip it and still count it, as must the report.
    lines = _mooncake_rows(1).splitlines()
    trace.write_text(
        lines[0] + "\n\n" + json.dumps(long_row) + "\n" + _mooncake_rows(3, timestamp=4000)
    )
    replay_json = tmp_path / "replay.json"
    common = ["--policy", "lru", "--jobs", "1", "--json", str(replay_json)]
    replay = kvtide(["replay", str(trace), "--capacity", "64Ki", *common], tmp_path)
    sim_flags = ["--gpu-cache-tokens", "64Ki", "--quiet", "--router", "cost", "--jobs", "1"]
    simulate = kvtide(["simulate", "--workload", str(trace), *sim_flags], tmp_path)
    for outcome in (replay, simulate):
        assert outcome.returncode == 0, outcome.stderr
        assert "Traceback" not in outcome.stderr
        assert f"{trace}:3: needs 100,352 tokens of KV, more than the whole" in (
            outcome.stdout + outcome.stderr
        )
    report = json.loads(replay_json.read_text())
    assert report["requests"] == 4 and report["skipped_requests"] == 1
