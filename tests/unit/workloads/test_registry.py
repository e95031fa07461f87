from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from kvtide.errors import ConfigError, TraceFormatError
from kvtide.workloads.registry import detect_format, open_workload

from .conftest import WriteLines, fields

MOONCAKE_ROW = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}
BAILIAN_ROW = {
    "chat_id": 1,
    "timestamp": 0.5,
    "input_length": 20,
    "output_length": 2,
    "hash_ids": [7, 8],
}


def test_formats_are_detected_from_the_extension_and_first_keys(write_lines: WriteLines) -> None:
    assert detect_format(write_lines("a.jsonl", ["", MOONCAKE_ROW])) == "mooncake"
    assert detect_format(write_lines("b.jsonl", [BAILIAN_ROW])) == "bailian"
    assert detect_format(write_lines("c.json", [{"token_ids": [1], "extra": 0}])) == "tokens"
    assert (
        detect_format(write_lines("d.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens"])) == "azure"
    )
    assert (
        detect_format(write_lines("d.txt", ["TIMESTAMP,ContextTokens,GeneratedTokens"])) == "azure"
    )


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ([], "empty workload file"),
        (["not json"], "neither an Azure CSV nor a JSON object a line"),
        (['"token_ids"'], "neither an Azure CSV nor a JSON object a line"),
        ([{"prompt": "hi"}], "unknown trace format"),
    ],
)
def test_unknown_files_are_trace_format_errors(
    write_lines: WriteLines, lines: list[object], problem: str
) -> None:
    with pytest.raises(TraceFormatError, match=problem):
        open_workload(str(write_lines("x.jsonl", lines)))


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.jsonl: cannot read workload: No such file"):
        open_workload(str(tmp_path / "nope.jsonl"))


def test_id_traces_keep_their_native_block_size_token_traces_take_the_asked_one(
    write_lines: WriteLines,
) -> None:
    mooncake = open_workload(str(write_lines("m.jsonl", [MOONCAKE_ROW])), block_tokens=16)
    bailian = open_workload(str(write_lines("b.jsonl", [BAILIAN_ROW])), block_tokens=64)
    tokens = open_workload(str(write_lines("t.jsonl", [{"token_ids": [1, 2]}])), block_tokens=64)

    assert (mooncake.block_tokens, [r.block_tokens for r in mooncake]) == (512, [512])
    assert (bailian.block_tokens, [r.block_tokens for r in bailian]) == (16, [16])
    assert (tokens.block_tokens, [r.block_tokens for r in tokens]) == (64, [64])
    assert (mooncake.name, mooncake.format) == ("m", "mooncake")


def test_limit_and_time_scale_apply_to_traces(write_lines: WriteLines) -> None:
    rows = [{**MOONCAKE_ROW, "timestamp": 1000 * i} for i in range(5)]
    workload = open_workload(str(write_lines("m.jsonl", rows)), limit=3, time_scale=0.5)

    assert [r.arrival_s for r in workload] == [0.0, 0.5, 1.0]
    assert workload.description["limit"] == 3


def test_builtin_specs_take_typed_options() -> None:
    workload = open_workload("builtin:chat:sessions=3, turns=2", seed=7, block_tokens=32)

    assert (workload.name, workload.format, workload.block_tokens) == ("chat", "builtin", 32)
    assert workload.description["params"] == {
        "spec": "builtin:chat:sessions=3, turns=2",
        "seed": 7,
        "sessions": 3,
        "turns": 2.0,
        "duration_s": 600.0,
        "system_prompts": 4,
        "system_tokens": 800.0,
        "user_tokens": 200.0,
        "output_tokens": 300.0,
        "think_s": 60.0,
        "max_prompt_tokens": 16384,
    }
    assert {r.session_id for r in workload} == {"chat-0", "chat-1", "chat-2"}


def test_a_workload_pickles_for_parallel_workers(write_lines: WriteLines) -> None:
    for spec in ("builtin:rag:requests=5", str(write_lines("b.jsonl", [BAILIAN_ROW]))):
        workload = open_workload(spec)
        copy = pickle.loads(pickle.dumps(workload))

        assert [fields(r) for r in copy] == [fields(r) for r in workload]


def test_a_bare_builtin_is_the_default_mix() -> None:
    assert open_workload("builtin").name == "mixed"
    assert open_workload("builtin:").name == "mixed"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("builtin:nosuch", "unknown built-in workload 'nosuch'; choose from mixed, chat, agent"),
        ("builtin:chat:users=3", "bad option 'users=3' for builtin:chat; options are sessions=300"),
        ("builtin:chat:sessions", "bad option 'sessions' for builtin:chat"),
        ("builtin:chat:sessions=1.5", "option sessions must be an integer, got '1.5'"),
        ("builtin:rag:zipf=x", "option zipf must be a number, got 'x'"),
        ("builtin:chat:sessions=0", "chat workload: sessions must be positive, got 0"),
        ("builtin:burst:on_s=-1", "burst workload: on_s must be positive, got -1.0"),
        ("builtin:rag:zipf=-0.5", "rag workload: zipf must be non-negative, got -0.5"),
        ("builtin:tenants:burst_at_s=590", "the burst must end within duration_s"),
        ("builtin:agent:tool_s=inf", "agent workload: tool_s must be positive, got inf"),
        # past what a generator can plan: these hung or ended in a MemoryError
        ("builtin:chat:system_tokens=1e12", "system_tokens must be at most 16,777,216"),
        ("builtin:chat:sessions=1000000000", "sessions must be at most 1,000,000"),
        ("builtin:rag:documents=1000000", "documents must be at most 100,000"),
        ("builtin:rag:documents=100000,doc_tokens=5000", "documents x doc_tokens must be at"),
    ],
)
def test_bad_builtin_specs_are_config_errors(spec: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        open_workload(spec)

    assert problem in str(caught.value)


def test_a_zero_rate_is_allowed_where_it_means_silence() -> None:
    workload = open_workload("builtin:burst:off_rate=0,duration_s=200")

    assert all(r.extra["is_burst"] for r in workload)
