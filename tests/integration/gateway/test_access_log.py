"""`kvtide serve --access-log FILE`: one JSON line per completion request, through a real
gateway process over real backends, driven by the official `openai` client: who asked, where
it went and why, what was predicted cached against what the engine reported, TTFT, retries,
refusals; the file reopened on SIGHUP (logrotate) and the last lines written on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import openai
import pytest
from engine_process import Engine
from tests.integration.gateway.conftest import KEYS, write_keys
from tests.integration.gateway.procs import (
    Proc,
    access_log_lines,
    backend,
    backend_stats,
    emulated_engines,
    free_port,
    gateway,
    openai_client,
)

pytestmark = [pytest.mark.timeout(120)]

HISTORY = "The harbour master logs every vessel's draught, cargo and berth. " * 20


def _client(port: int, key: str = "x") -> openai.OpenAI:
    return openai_client(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)


def test_each_request_gets_a_line_with_its_route_and_the_engines_answer(tmp_path: Path) -> None:
    log = tmp_path / "access.jsonl"
    keys = write_keys(tmp_path / "keys.yaml", KEYS)
    bport, port = free_port(), free_port()
    be = backend(bport, "m", "--token-delay", "0.002")
    gw = gateway(
        port, "--replica", f"http://127.0.0.1:{bport}", "--api-keys", str(keys),
        "--access-log", str(log),
    )  # fmt: skip
    try:
        c = _client(port, KEYS["alpha"])
        c.completions.create(model="m", prompt=HISTORY + "Which berth?", max_tokens=3)
        stream = c.completions.create(
            model="m",
            prompt=HISTORY + "Which berth is free?",
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
        reported = [ch.usage.prompt_tokens_details.cached_tokens for ch in stream if ch.usage]
        with pytest.raises(openai.AuthenticationError):
            _client(port, "sk-wrong").completions.create(model="m", prompt="hi", max_tokens=2)
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="nope", prompt="hi", max_tokens=2)
        first, second, unauthorised, unknown = access_log_lines(log, 4)
    finally:
        gw.stop()
        be.stop()
    replica = f"127.0.0.1:{bport}"
    for line in (first, second):
        assert line["status"] == 200 and line["error"] is None
        assert line["tenant"] == "alpha" and line["model"] == "m"
        assert line["endpoint"] == "completions"
        assert line["replica"] == replica and line["attempts"] == 1 and line["failures"] == []
        assert line["route"] in ("cold", "affinity", "hot")
        assert line["prompt_tokens"] > 0 and line["duration_ms"] > 0
        assert abs(line["ts"] - time.time()) < 120
    assert first["id"] != second["id"]
    assert first["stream"] is False and first["ttft_ms"] is None  # its first byte is its last
    # text mode: an estimate, not compared with the engine's count; the engine's usage kept
    assert first["tokenized"] is False and first["engine_prompt_tokens"] > 0
    assert first["completion_tokens"] == second["completion_tokens"] == 3
    assert first["cached_tokens"] == 0 and first["predicted_cached_tokens"] == 0
    # the second shares the first's prompt up to the question: predicted (the gateway's own
    # placement) and reported by the engine
    assert second["stream"] is True
    assert second["cached_tokens"] == reported[0] > 0
    assert second["predicted_cached_tokens"] > 0
    assert 0 < second["ttft_ms"] <= second["duration_ms"]
    assert second["ts"] >= first["ts"]
    # refused before routing: the status and OpenAI code, no tenant or replica
    assert unauthorised["status"] == 401 and unauthorised["error"] == "invalid_api_key"
    assert unauthorised["tenant"] is None and unauthorised["replica"] is None
    assert unknown["status"] == 404 and unknown["error"] == "model_not_found"
    assert unknown["tenant"] == "alpha" and unknown["replica"] is None


def test_a_stream_ends_at_its_done_and_a_client_closing_then_is_no_disconnect(
    tmp_path: Path,
) -> None:
    """The `openai` client closes its connection at ``data: [DONE]``. The engine here holds
    its end of body 1 s after it: the client's stream still ends at [DONE], and its close is
    neither a 499 in the log nor a disconnect nor an abort at the engine (the gateway reads
    the engine's end of body after the client's stream has ended); the log's durations end
    at [DONE] too."""
    log = tmp_path / "access.jsonl"
    bport, port = free_port(), free_port()
    be = backend(bport, "m", "--tail-delay", "1")
    gw = gateway(port, "--replica", f"http://127.0.0.1:{bport}", "--access-log", str(log))
    try:
        text = "".join(
            chunk.choices[0].text
            for chunk in _client(port).completions.create(
                model="m", prompt="Which berth?", max_tokens=3, stream=True
            )
            if chunk.choices
        )
        body = json.dumps({"model": "m", "prompt": "Which pier?", "max_tokens": 3, "stream": True})
        raw = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body.encode(), method="POST"
        )
        start = time.monotonic()
        with urllib.request.urlopen(raw, timeout=30) as resp:  # read to the end of body
            events = resp.read()
        whole_s = time.monotonic() - start
        lines = access_log_lines(log, 2)
        time.sleep(1.5)  # past the engine's tail: an abort would have been counted by now
        stats = backend_stats(bport)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    finally:
        gw.stop()
        be.stop()
    assert text == "tok tok tok "
    assert events.endswith(b"data: [DONE]\n\n") and events.count(b"tok ") == 3
    assert [(line["status"], line["error"]) for line in lines] == [(200, None), (200, None)]
    assert stats["requests"] == 2 and stats["aborted"] == 0
    assert "kvtide_gateway_client_disconnects_total 0.0" in metrics
    assert whole_s < 0.8, whole_s  # not held for the engine's 1 s tail
    # the line's duration ends with the client's answer too, not at the engine's end of body
    assert all(line["duration_ms"] < 800 for line in lines), lines


def test_the_request_id_joins_the_line_the_engine_and_the_client(tmp_path: Path) -> None:
    """One id per request, unique across gateway processes: in the engine's ``X-Request-Id``,
    the answer's header and the line. A client's own id is logged beside it, not forwarded."""
    bport, port, port2 = free_port(), free_port(), free_port()
    be = backend(bport, "m")
    logs = {p: tmp_path / f"access-{p}.jsonl" for p in (port, port2)}
    gws = [
        gateway(p, "--replica", f"http://127.0.0.1:{bport}", "--access-log", str(logs[p]))
        for p in (port, port2)
    ]
    try:
        answered = []
        for i, p in enumerate((port, port, port2)):
            raw = _client(p).completions.with_raw_response.create(
                model="m",
                prompt=f"q{i}",
                max_tokens=2,
                extra_headers={"X-Request-Id": f"client-{i}"} if i else {"X-Request-Id": "x" * 200},
            )
            assert raw.parse().choices
            answered.append(raw.headers["x-request-id"])
        # a refusal carries its id too: the client can quote it, the log has its line
        with pytest.raises(openai.NotFoundError) as refused:
            _client(port2).completions.create(model="nope", prompt="q", max_tokens=2)
        answered.append(refused.value.response.headers["x-request-id"])
        lines = access_log_lines(logs[port], 2) + access_log_lines(logs[port2], 2)
        seen = backend_stats(bport)["request_ids"]
    finally:
        for gw in gws:
            gw.stop()
        be.stop()
    assert [line["id"] for line in lines] == answered
    assert answered[:3] == seen  # the refused one never reached the engine
    assert len(set(answered)) == 4  # two processes, yet no id twice
    assert [line["client_request_id"] for line in lines] == [None, "client-1", "client-2", None]
    assert lines[-1]["status"] == 404


def test_a_retried_request_names_the_failed_attempt_and_where_it_was_served(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.jsonl"
    bad_port, good_port, port = free_port(), free_port(), free_port()
    bad = backend(bad_port, "m", "--mode", "fail500")
    good = backend(good_port)
    gw = gateway(
        port, "--replica", f"http://127.0.0.1:{bad_port}", "--replica",
        f"http://127.0.0.1:{good_port}", "--policy", "round_robin", "--access-log", str(log),
    )  # fmt: skip
    try:
        c = _client(port)
        for i in range(6):
            c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
            )
        lines = access_log_lines(log, 6)
        retried = backend_stats(bad_port)["requests"]
    finally:
        gw.stop()
        bad.stop()
        good.stop()
    assert all(line["status"] == 200 and line["endpoint"] == "chat" for line in lines)
    assert all(line["replica"] == f"127.0.0.1:{good_port}" for line in lines)
    failed = [line for line in lines if line["failures"]]
    assert len(failed) == retried > 0  # each 500 the bad one gave was retried on the good one
    assert all(line["failures"] == ["http_500"] and line["attempts"] == 2 for line in failed)
    assert all(line["attempts"] == 1 for line in lines if not line["failures"])


def test_sighup_reopens_the_file_and_sigterm_writes_the_last_lines(
    tmp_path: Path,
) -> None:
    log = tmp_path / "access.jsonl"
    bport, port = free_port(), free_port()
    be = backend(bport, "m")
    gw: Proc | None = gateway(
        port, "--replica", f"http://127.0.0.1:{bport}", "--access-log", str(log)
    )
    assert gw is not None
    try:
        c = _client(port)
        c.completions.create(model="m", prompt="before the rotation", max_tokens=2)
        access_log_lines(log, 1)
        rotated = tmp_path / "access.jsonl.1"
        os.rename(log, rotated)  # what logrotate does, then it signals the process
        gw.signal(signal.SIGHUP)
        time.sleep(0.3)
        c.completions.create(model="m", prompt="after the rotation", max_tokens=2)
        (after,) = access_log_lines(log, 1)
        c.completions.create(model="m", prompt="just before the stop", max_tokens=2)
        assert gw.stop() == 0  # SIGTERM at once: the last line is written on the way out
        gw = None
        (before,) = access_log_lines(rotated, 1)
        assert before["status"] == after["status"] == 200
        assert [line["status"] for line in access_log_lines(log, 2, timeout_s=0)] == [200, 200]
    finally:
        if gw is not None:
            gw.stop()
        be.stop()


def test_a_bad_path_is_a_one_line_error_and_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.integration.gateway.procs import _env

    proc = subprocess.run(
        [sys.executable, "-m", "kvtide", "serve", "--replica", "http://127.0.0.1:9",
         "--port", str(free_port()), "--access-log", str(tmp_path / "no" / "such" / "dir.log")],
        capture_output=True, text=True, env=_env(), timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "access_log" in lines[0] and "cannot open" in lines[0], lines


@pytest.mark.slow
def test_the_gateway_counts_the_prompt_tokens_the_engine_counts(tmp_path: Path) -> None:
    """Token mode in front of a real `kvtide engine`: per request, the gateway's tokenizer
    count equals the engine's ``usage.prompt_tokens``, chat (template rendered) and
    completions alike, so the blocks it hashes are the engine's; and its predicted hits
    are the engine's reported ones. (Every prompt tokenized whole: ``cold_heads`` off, else
    the first of them, held nowhere, would be tokenized only as far as its head.)"""
    log = tmp_path / "access.jsonl"
    config = tmp_path / "gateway.yaml"
    config.write_text("cold_heads: false\n")
    engines: list[Engine] = []
    gw: Proc | None = None
    try:
        engines += emulated_engines(1)
        e = engines[0]
        port = free_port()
        gw = gateway(
            port, "--replica", f"{e.url}=emu,events={e.events},replay={e.replay}",
            "--tokenizer", "smollm2", "--access-log", str(log), "--config", str(config),
        )  # fmt: skip
        c = _client(port)
        system = {"role": "system", "content": HISTORY}
        for i in range(3):
            question = {"role": "user", "content": f"Which berth is free at {i} o'clock?"}
            c.chat.completions.create(model="emu", messages=[system, question], max_tokens=2)
            time.sleep(0.3)  # the engine's KV events in before the next turn routes
        c.completions.create(model="emu", prompt=HISTORY + "  Indented.\n\n", max_tokens=2)
        lines = access_log_lines(log, 4)
    finally:
        if gw is not None:
            gw.stop()
        for engine in engines:
            engine.stop()
    for line in lines:
        assert line["status"] == 200 and line["tokenized"] is True
        assert line["engine_prompt_tokens"] == line["prompt_tokens"] > 0, line
    assert [line["endpoint"] for line in lines] == ["chat"] * 3 + ["completions"]
    assert all(line["cached_tokens"] > 0 for line in lines[1:3])
    assert [line["predicted_cached_tokens"] for line in lines[1:3]] == [
        line["cached_tokens"] for line in lines[1:3]
    ]
