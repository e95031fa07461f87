"""bench/gateways.py's bad flags: one line naming the flag, exit 2, before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

import gateways  # bench/gateways.py: tests/conftest.py puts bench/ on sys.path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeat", "0"], "--repeat: expected at least 1 run per gateway, got 0"),
        (["--rows", "{file}/rows"], "--rows: cannot make directory"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    with pytest.raises(SystemExit) as exit_:
        gateways.main([a.replace("{file}", str(afile)) for a in argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in err and message in err  # argparse's prog is the runner's argv[0]
