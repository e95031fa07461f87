"""Ctrl-C is one line on stderr and exit code 130 wherever it lands: while the subcommands
import (a cold start takes a second or more) as while a command runs."""

from __future__ import annotations

import argparse
import importlib

import pytest

import kvtide.cli as cli


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_ctrl_c_while_the_subcommands_import(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(importlib, "import_module", _interrupt)  # what the CLI loads them by
    assert cli.main(["simulate"]) == 130
    out = capsys.readouterr()
    assert out.err == "kvtide: interrupted\n"
    assert out.out == ""


def test_ctrl_c_while_a_command_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    parser.set_defaults(func=_interrupt)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "kvtide: interrupted\n"


def test_a_command_error_is_still_one_line_and_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--gpu-cache-tokens", "lots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvtide: error: --gpu-cache-tokens") and err.count("\n") == 1


def test_ctrl_c_while_the_cli_itself_imports(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script's entry (``kvtide.__main__:run``) imports the CLI inside its own
    handler: an interrupt there (argparse and kvtide's modules loading) is the same line."""
    import builtins
    from importlib.metadata import entry_points

    from kvtide.__main__ import run

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "kvtide"]
    assert script.load() is run
    real_import = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "kvtide.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert run() == 130
    assert capsys.readouterr().err == "kvtide: interrupted\n"
