"""Edges of the command line an audit found: an output path refused before the run, not
after it; request counts past what a run can slice; a Ctrl-C while a group of children
stops; a Ctrl-C to simulate's whole process group while its workers start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvtide.cli import main
from kvtide.cli.processes import ChildProcess, ProcessGroup


@pytest.mark.parametrize("command", [["demo", "--duration", "60"], ["sweep", "GRID"]])
def test_an_unwritable_json_path_is_refused_before_the_run(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked after the runs, a missing folder cost the whole demo (then a traceback) or
    the whole sweep grid (its results lost)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("base: {workload: 'builtin:chat', requests: 50}\ngrid: {router: [cost]}\n")
    argv = [str(grid) if a == "GRID" else a for a in command]
    started = time.monotonic()
    assert main([*argv, "--json", str(tmp_path / "missing" / "out.json")]) == 2
    assert time.monotonic() - started < 5  # no engine started, no point run
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--json" in err and "Traceback" not in err
    assert out == ""  # nothing ran


@pytest.mark.parametrize("command", ["replay", "simulate", "load", "doctor"])
def test_a_request_count_past_any_run_is_one_line(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beyond sys.maxsize, itertools.islice's ValueError was a traceback."""
    assert main([command, "--requests", str(2**70)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--requests" in err


@pytest.mark.timeout(30)
def test_a_ctrl_c_while_children_stop_is_raised_once_they_are_stopped() -> None:
    """Ignored, as it was, a demo interrupted between its two runs went on to the second."""
    script = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(1), sys.exit(0)))\n"
        "time.sleep(30)\n"
    )
    child = ChildProcess([sys.executable, "-c", script], "slow")  # a second to stop, as a drain
    time.sleep(0.3)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN where the suite runs in a background job
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt), ProcessGroup() as group:
        group.add(child)
        timer.start()
        time.sleep(0.1)  # the block ends, the stop runs, the interrupt lands in it
    assert child.proc.poll() is not None  # stopped before the interrupt went on
    assert signal.getsignal(signal.SIGINT) is before  # the handler it found is back


@pytest.mark.timeout(60)
def test_ctrl_c_to_the_process_group_while_simulate_starts_is_one_line() -> None:
    """A terminal's Ctrl-C reaches the whole group: each spawned worker printed a traceback."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtide", "simulate", "--quiet", "--jobs", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while len(_children(proc.pid)) < 3 and time.monotonic() < deadline:  # the resource
        time.sleep(0.01)  # tracker and two workers, which are importing now
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err == "kvtide: interrupted\n"


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


@pytest.mark.timeout(30)  # taken for none, the flag let the gateway start and serve
@pytest.mark.parametrize(
    ("flag", "key"),
    [
        ("--admin-key=", "admin_key"),
        ("--engine-key=", "engine_key"),
        ("--engine-key=a\nb", "engine_key"),
    ],
)
def test_an_empty_or_broken_secret_flag_is_one_line(
    flag: str, key: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty flag is refused as the config refuses the empty key, not taken for none (an
    admin API quietly off, or the environment's key used in its place)."""
    monkeypatch.setenv("KVTIDE_ADMIN_KEY", "from-the-env")
    monkeypatch.setenv("KVTIDE_ENGINE_KEY", "from-the-env")
    assert main(["serve", "--replica", "http://127.0.0.1:9", flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and key in err and "Traceback" not in err
