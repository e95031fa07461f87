"""`kvtide engine`'s KV events decoded by vLLM's and SGLang's own msgspec classes.

The engine publishes over real ZMQ; a subscriber under the peer-libraries venv
(``KVTIDE_PEER_PYTHON``, default /work/venvs/peerlibs/bin/python, built by
bench/setup_peers.sh) decodes every message with ``msgspec.msgpack.Decoder(type=KVEventBatch)``
from ``vllm.distributed.kv_events`` or ``sglang.srt.disaggregation.kv_events``: a field of the
wrong name, type or order fails the decode. Skipped when that interpreter or module is absent.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import openai
import pytest
from engine_process import running_engine
from peer_process import peer_python

SCRIPT = Path(__file__).with_name("peer_kv_decoder.py")
BT = 16

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_events_decode_with_the_engines_own_classes(engine: str) -> None:
    python = peer_python()
    args = ["--kv-events-port", "0", "--kv-events-format", engine, "--speedup", "50",
            "--kv-cache-tokens", "256", "--served-model-name", "emu"]  # fmt: skip
    with running_engine(*args) as e:
        assert e.events is not None
        with subprocess.Popen(
            [str(python), str(SCRIPT), engine, e.events],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            try:
                assert proc.stdout is not None and proc.stdin is not None
                if proc.stdout.readline().strip() != "ready":
                    pytest.skip(f"{engine}'s kv_events module is not importable by {python}")
                time.sleep(0.5)  # ZMQ's slow joiner: the subscription must reach the PUB
                client = openai.OpenAI(base_url=f"{e.url}/v1", api_key="x", max_retries=0)
                prompts = [[1000 + 7 * i + j for j in range(5 * BT + 3)] for i in range(6)]
                for prompt in prompts:  # 6 x 5 full blocks through a 16-block pool: evictions
                    client.completions.create(model="emu", prompt=prompt, max_tokens=2)
                salted = [7 for _ in range(2 * BT)]
                client.completions.create(
                    model="emu", prompt=salted, max_tokens=2, extra_body={"cache_salt": "t-x"}
                )
                time.sleep(0.5)
                proc.stdin.write("stop\n")
                proc.stdin.flush()
                out, err = proc.communicate(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
    assert proc.returncode == 0, err  # every message decoded with the engine's own class
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    stored = [r for r in rows if r["type"] == "BlockStored"]
    removed = [r for r in rows if r["type"] == "BlockRemoved"]
    assert removed, "a 16-block pool under 30 distinct blocks must evict"
    tokens = [t for r in stored for t in r["token_ids"]]
    for prompt in prompts:  # each prompt's full blocks were announced, with their token ids
        full = prompt[: len(prompt) // BT * BT]
        assert any(tokens[i : i + len(full)] == full for i in range(0, len(tokens), BT))
    assert all(r["block_size"] == BT for r in stored)
    assert all(len(r["token_ids"]) == BT * len(r["block_hashes"]) for r in stored)
    # the salt as each engine spells it: vLLM in the first block's extra keys, SGLang a field
    if engine == "vllm":
        assert any(r.get("extra_keys") and r["extra_keys"][0] == ["t-x"] for r in stored)
    else:
        assert any(r.get("cache_salt") == "t-x" for r in stored)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs)
