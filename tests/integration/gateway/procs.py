"""Processes for the gateway's tests: free loopback ports, start and wait, stop by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import openai
from engine_process import Engine, start_engine

from kvtide.cli.processes import free_port

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[2] / "src"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{SRC}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def wait_http(
    url: str, timeout_s: float = 15.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"process exited ({proc.returncode}): {err[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status < 500:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not come up within {timeout_s} s")


class Proc:
    def __init__(self, args: list[str], ready_url: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.ready_url = ready_url
        self.proc = subprocess.Popen(
            args, env=_env() | (env or {}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            wait_http(ready_url, proc=self.proc)
        except BaseException:
            # no caller holds this Proc to stop it: a process that never came up is stopped
            # here, by its PID, or it outlives the test run
            self.stop(timeout_s=5.0)
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return self.proc.returncode


def backend(port: int, model: str = "m", *extra: str) -> Proc:
    args = [sys.executable, str(HERE / "backend.py"), "--port", str(port), "--model", model]
    return Proc([*args, *extra], f"http://127.0.0.1:{port}/health")


def backend_stats(port: int) -> dict[str, Any]:
    """The test backend's counters (requests, running, aborted) from its ``/stats``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as resp:
        stats: dict[str, Any] = json.load(resp)
    return stats


def wait_aborted(port: int, timeout_s: float = 5.0) -> dict[str, Any]:
    """The backend's counters once it has seen a request aborted (or ``timeout_s`` passed)."""
    deadline = time.monotonic() + timeout_s
    stats = backend_stats(port)
    while stats["aborted"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
        stats = backend_stats(port)
    return stats


def emulated_engines(n: int, *extra: str) -> list[Engine]:
    """``n`` `kvtide engine` processes (20x the modelled GPU's speed) serving model ``emu``,
    each with vLLM-format KV events and a replay socket (``extra``: more flags)."""
    out: list[Engine] = []
    try:
        for _ in range(n):
            out.append(
                start_engine(
                    "--speedup",
                    "20",
                    "--served-model-name",
                    "emu",
                    "--kv-events-port",
                    str(free_port()),
                    "--kv-events-replay-port",
                    str(free_port()),
                    *extra,
                )
            )
    except BaseException:  # the ones that came up are stopped, by PID
        for engine in out:
            engine.stop()
        raise
    return out


def gateway(port: int, *extra: str, env: dict[str, str] | None = None) -> Proc:
    """`kvtide serve` on ``port`` with ``extra`` flags (``env`` added to its environment)."""
    args = [sys.executable, "-m", "kvtide", "serve", "--port", str(port), *extra]
    return Proc(args, f"http://127.0.0.1:{port}/health", env)


@contextlib.contextmanager
def engines_behind_gateway(
    n: int, engine_flags: Sequence[str], *gateway_flags: str
) -> Iterator[tuple[int, list[Engine]]]:
    """``n`` emulated engines (``engine_flags`` added) behind `kvtide serve`
    (``gateway_flags`` added), each replica with its event and replay sockets: the gateway's
    port and the engines, every process stopped by PID afterwards."""
    engines: list[Engine] = []
    gw: Proc | None = None
    try:
        engines += emulated_engines(n, *engine_flags)
        replicas = []
        for e in engines:
            replicas += ["--replica", f"{e.url}=emu,events={e.events},replay={e.replay}"]
        port = free_port()
        gw = gateway(port, *replicas, *gateway_flags)
        yield port, engines
    finally:
        if gw is not None:
            gw.stop()
        for e in engines:
            e.stop()


def access_log_lines(path: Path, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The access log's lines once it has ``n`` (the gateway writes them every 0.5 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text() if path.exists() else ""
        lines = [json.loads(line) for line in text.splitlines()]
        if len(lines) >= n or time.monotonic() > deadline:
            assert len(lines) == n, lines
            return lines
        time.sleep(0.05)


_OPENAI_CLIENTS: list[openai.OpenAI | anthropic.Anthropic] = []


def openai_client(**kwargs: Any) -> openai.OpenAI:
    """``openai.OpenAI(**kwargs)``, closed when the test ends (conftest's autouse fixture):
    an unclosed client's sockets raise their ResourceWarning whenever the collector reaches
    them, which may be in another test or at the session's end."""
    client = openai.OpenAI(**kwargs)
    _OPENAI_CLIENTS.append(client)
    return client


def anthropic_client(**kwargs: Any) -> anthropic.Anthropic:
    """``anthropic.Anthropic(**kwargs)``, closed when the test ends, as ``openai_client``."""
    client = anthropic.Anthropic(**kwargs)
    _OPENAI_CLIENTS.append(client)
    return client


def close_openai_clients() -> None:
    while _OPENAI_CLIENTS:
        _OPENAI_CLIENTS.pop().close()
