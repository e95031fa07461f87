"""`kvtide engine`'s bad flags: one line naming the flag, exit code 2, no traceback."""

from __future__ import annotations

import socket

import pytest

from kvtide.cli import main


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--speedup", "nan"], "--speedup"),
        (["--speedup", "0"], "--speedup"),
        (["--kv-cache-tokens", "1.5x"], "--kv-cache-tokens"),
        (["--port", "70000"], "--port"),
        (["--model", "nope"], "nope"),
        (["--eviction", "bogus"], "bogus"),
        (["--kv-events-format", "zmq"], "--kv-events-format"),
        (["--scheduling-policy", "lifo"], "--scheduling-policy"),
        (["--model", "smollm2-135m", "--scheduling-policy", "priority"], "--scheduling-policy"),
    ],
)
def test_bad_flag_is_one_line_and_exit_2(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # on a free port (an argv's own --port comes after and wins): the engine binds its port
    # before it reads its model, and a default 8000 held by anything else on the machine
    # answered every such case with the port's error instead
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = str(probe.getsockname()[1])
    try:
        code = main(["engine", "--port", free, *argv])
    except SystemExit as exc:  # argparse's own exit
        code = int(exc.code or 0)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and names in err and "Traceback" not in err


def test_a_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["engine", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvtide: error: --port:") and len(err.splitlines()) == 1
