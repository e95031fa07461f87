"""`kvtide engine --scheduling-policy priority`, driven by the official `openai` client: a
request's `priority` (vLLM's extra field, lower first) decides which waiting request the engine
admits next; without the policy a nonzero priority is refused with a 400 naming the field, as
vLLM refuses it, and the server serves on."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest
from engine_process import running_engine

MODEL = "emu"


def test_without_the_policy_a_priority_is_a_400_naming_it() -> None:
    with running_engine("--speedup", "200", "--served-model-name", MODEL) as eng:
        client = openai.OpenAI(base_url=eng.url + "/v1", api_key="x", max_retries=0, timeout=30)
        for bad, says in ((3, "priority scheduling is not enabled"), ("high", "an integer")):
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(
                    model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": bad}
                )
            body = err.value.body
            assert isinstance(body, dict) and body.get("param") == "priority", body
            assert says in str(body.get("message")), body
        zero = client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": 0}
        )
        assert zero.usage is not None and zero.usage.completion_tokens == 2


def test_the_waiting_request_of_lower_priority_value_is_admitted_first() -> None:
    """One sequence at a time: a long request runs; a priority-5 request then a priority -1
    one arrive behind it. The second to arrive gets its first token first."""
    with running_engine(
        "--speedup", "1", "--served-model-name", MODEL, "--max-num-seqs", "1",
        "--scheduling-policy", "priority",
    ) as eng:  # fmt: skip
        client = openai.AsyncOpenAI(
            base_url=eng.url + "/v1", api_key="x", max_retries=0, timeout=60
        )
        first_token: dict[str, float] = {}

        async def send(name: str, priority: int, max_tokens: int) -> None:
            stream = await client.completions.create(
                model=MODEL,
                prompt=f"{name} asks about the tide",
                max_tokens=max_tokens,
                stream=True,
                extra_body={"priority": priority, "ignore_eos": True},
            )
            async for chunk in stream:
                if chunk.choices and name not in first_token:
                    first_token[name] = time.monotonic()

        async def main() -> None:
            blocker = asyncio.create_task(send("blocker", 0, 150))
            while "blocker" not in first_token:  # it runs: the others must wait
                await asyncio.sleep(0.01)
            low = asyncio.create_task(send("low", 5, 2))
            await asyncio.sleep(0.1)
            high = asyncio.create_task(send("high", -1, 2))
            await asyncio.wait_for(asyncio.gather(blocker, low, high), timeout=60)
            await client.close()

        asyncio.run(main())
        assert first_token["blocker"] < first_token["high"] < first_token["low"]
