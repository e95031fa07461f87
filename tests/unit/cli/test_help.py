"""The help the commands print is true and plain: no literal backticks, the presets named in
--model and --gpu, --json where the README says, and the README's sweep example runs."""

from __future__ import annotations

import argparse
import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvtide.cli import build_parser, main
from kvtide.costs.specs import GPU_PRESETS, MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[3]


def parsers(parser: argparse.ArgumentParser, name: str = "kvtide") -> Iterator[tuple[str, Any]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


ALL = dict(parsers(build_parser()))


@pytest.mark.parametrize("name", sorted(ALL))
def test_help_has_no_literal_backticks(name: str) -> None:
    assert "`" not in ALL[name].format_help()


# --gpu marks the commands whose --model is a preset (`kvtide load --model` names a served model)
@pytest.mark.parametrize("name", [n for n in sorted(ALL) if "--gpu" in ALL[n].format_help()])
def test_model_and_gpu_help_list_the_presets(name: str) -> None:
    text = " ".join(ALL[name].format_help().split())  # argparse wraps lines
    for preset in [*MODEL_PRESETS, *GPU_PRESETS]:
        assert re.search(rf"\b{re.escape(preset)}\b", text), f"{name}: {preset} not in help"


def test_the_readme_names_exactly_the_commands_that_take_json() -> None:
    takes = sorted(n.removeprefix("kvtide ") for n, p in ALL.items() if "--json" in p.format_help())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (paragraph,) = [p for p in readme.split("\n\n") if "take `--json FILE`" in p]
    named = paragraph.split("take `--json FILE`")[0]
    assert sorted(re.findall(r"`kvtide ([a-z ]+)`", named)) == takes


def test_the_shipped_sweep_example_runs(tmp_path: Path) -> None:
    example = ROOT / "examples" / "sweep.yaml"
    assert "examples/sweep.yaml" in (ROOT / "README.md").read_text(encoding="utf-8")
    out = tmp_path / "rows.csv"
    assert main(["sweep", str(example), "--out", str(out), "--quiet", "--jobs", "1"]) == 0
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert [(r["router"], r["gpu_cache_tokens"]) for r in rows][:2] == [
        ("round_robin", rows[0]["gpu_cache_tokens"]),
        ("round_robin", rows[1]["gpu_cache_tokens"]),
    ]
    assert len(rows) == 4 and {r["router"] for r in rows} == {"round_robin", "cost"}
