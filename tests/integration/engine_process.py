"""Starts `kvtide engine` as a real process on a free loopback port, and stops it by its PID."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from kvtide.cli.processes import free_port
from kvtide.engine_server.server import EngineServer, ServerConfig

SRC = Path(__file__).resolve().parents[2] / "src"


def post_json(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """POSTs ``body`` as JSON; the status and the JSON answer, an error's too."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    port: int
    events: str | None
    replay: str | None
    log: list[str]
    _reader: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=5)
        finally:
            self._reader.join(timeout=5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()


def start_engine(*args: str, timeout_s: float = 60.0) -> Engine:
    """Runs ``kvtide engine ARGS`` and waits for its banner (which names the event sockets)."""
    port = free_port()
    # its own NIXL side channel (bound with --kv-transfer-config; vLLM's default port is one
    # per host), unless the test names one
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port()), **os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvtide", "engine", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stderr is not None
    line = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"kvtide engine exited with {proc.wait()}")
        if "serving" in line:
            break
    else:
        proc.kill()
        raise RuntimeError("kvtide engine did not start in time")
    log = [line]

    def drain() -> None:  # so that the server never blocks on a full stderr pipe
        assert proc.stderr is not None
        for rest in proc.stderr:
            log.append(rest)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    found = re.search(r"KV events on (\S+) \(replay (\S+)\)", line)
    while time.monotonic() < deadline:  # the banner precedes the listening socket
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.02)
    events = found.group(1) if found else None
    return Engine(proc, port, events, found.group(2) if found else None, log, reader)


@contextmanager
def running_engine(*args: str) -> Iterator[Engine]:
    engine = start_engine(*args)
    try:
        yield engine
    finally:
        engine.stop()


@contextmanager
def in_process_engine(config: ServerConfig) -> Iterator[EngineServer]:
    """The server in this process, on its own event loop in a thread, so that a test can read
    the engine's state; clients still talk to it over loopback sockets."""
    server = EngineServer(config)
    started = threading.Event()

    def run() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(server.serve(handle_signals=False))
            await asyncio.sleep(0)
            started.set()
            await task

        asyncio.run(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", config.port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.02)
    try:
        yield server
    finally:
        assert server.loop is not None
        server.loop.call_soon_threadsafe(server.shutdown)
        thread.join(20)


@contextmanager
def engine_client(engine: Engine, timeout_s: float = 30.0) -> Iterator[openai.OpenAI]:
    """The official client on ``engine``, closed afterwards: an unclosed client's socket
    warns wherever the collector reaches it, in a later test or at the session's end."""
    with openai.OpenAI(
        base_url=engine.url + "/v1", api_key="x", max_retries=0, timeout=timeout_s
    ) as client:
        yield client
