"""The loopback fleets kvtide starts itself (`kvtide demo`, the benches) do not take the
operator's keys from the environment: a shell that exports ``VLLM_API_KEY`` for its own vLLM
(read by `kvtide engine` as vLLM reads it) must not lock the demo's engines."""

from __future__ import annotations

import urllib.request

import pytest

from kvtide.cli.processes import ProcessGroup, start_engine


@pytest.mark.timeout(90)
def test_a_started_engine_ignores_the_shells_vllm_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "the-operators-own")
    monkeypatch.setenv("KVTIDE_ENGINE_KEY", "the-operators-own")
    with ProcessGroup() as group:
        engine = start_engine(group, "emu", ["--speedup", "50"])
        engine.wait_ready()
        with urllib.request.urlopen(f"{engine.url}/v1/models", timeout=10) as resp:
            assert resp.status == 200  # no key asked
