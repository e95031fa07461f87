"""bench/agent_prompts.py: its plan of agents, its numbers from access-log lines, bad flags."""

from __future__ import annotations

import pytest

import agent_prompts  # bench/agent_prompts.py: tests/conftest.py puts bench/ on sys.path


def test_agents_share_three_tool_sets_and_are_reproducible() -> None:
    plan = agent_prompts.agents(7, turns=4, tools=2, seed=1)
    assert plan == agent_prompts.agents(7, turns=4, tools=2, seed=1)
    assert [len(a["questions"]) for a in plan] == [4] * 7
    assert plan[0]["tools"] == plan[3]["tools"] != plan[1]["tools"]
    assert all(len(a["tools"]) == 2 for a in plan)
    assert len({a["questions"][0] for a in plan}) == 7  # each agent its own conversation


def test_summary_of_access_log_lines() -> None:
    def line(
        ours: int, engine: int | None, predicted: int, cached: int | None, status: int = 200
    ) -> dict:
        return {"prompt_tokens": ours, "engine_prompt_tokens": engine, "status": status,
                "predicted_cached_tokens": predicted, "cached_tokens": cached}  # fmt: skip

    got = agent_prompts.summarize(
        [line(100, 100, 0, 0), line(200, 180, 60, 120), line(9, None, 0, None, 503)]
    )
    assert got == {
        "requests": 3,
        "errors": 1,
        "cached_ratio": 120 / 280,
        "predicted_over_served": 0.5,
        "prompt_count_mismatches": 2,
    }


@pytest.mark.parametrize("argv", [["--agents", "0"], ["--runs", "x"], ["--compare", "a=/nope"]])
def test_bad_flags_exit_2_naming_the_flag(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["agent_prompts.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        agent_prompts.main()
    assert exit_.value.code == 2
    assert argv[0] in capsys.readouterr().err
