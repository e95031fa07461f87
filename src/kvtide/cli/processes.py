"""Child processes on loopback for `kvtide demo` and the gateway benchmarks: `kvtide engine`
and `kvtide serve` on free ports, started and waited for, stopped by PID (never by name).

Children run in their own session, so a Ctrl-C at the terminal reaches only the parent, which
then stops them in order (SIGTERM, a deadline, SIGKILL); on Linux a child started from the main
thread also gets SIGTERM if the parent dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvtide.errors import KvtideError

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


_EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PORT = 10_000  # below: the well-known and registered services' ports
_PICKED: set[int] = set()
_RANDOM = random.Random()


def free_port() -> int:
    """A loopback port free now, for a child to bind a moment later.

    The kernel's own pick (bind to port 0) comes from the ephemeral range, the same range
    every outgoing connection takes its source port from: between the pick and a slow child's
    bind (seconds, on a cold start), a health poll's connection could take it, and the child
    would fail with "Address already in use". So the pick comes from below that range, where
    only listeners live, and never repeats within this process. Where the range is unknown or
    leaves no room below it, the kernel picks.
    """
    low = _ephemeral_low()
    if low is not None and low - _LOWEST_PORT > 1024:  # room below the range
        for _ in range(200):
            port = _RANDOM.randrange(max(_LOWEST_PORT, low - 12_288), low)
            if port not in _PICKED and _bindable(port):
                _PICKED.add(port)
                return port
    for _ in range(200):
        port = _kernel_pick()
        if port not in _PICKED:
            _PICKED.add(port)
            return port
    raise KvtideError("no free loopback port found")


def _kernel_pick() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int | None:
    try:
        with open(_EPHEMERAL) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(OSError):  # no libc.so.6: the parent's own cleanup is the guard
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


# keys a shell may hold for the operator's own fleet: read by `kvtide engine` and `kvtide
# serve` where no flag is given, they would lock this private loopback fleet's engines, or
# send its gateway a key they do not want
_FLEET_SECRETS = ("VLLM_API_KEY", "KVTIDE_ENGINE_KEY", "KVTIDE_ADMIN_KEY", "KVTIDE_TENANT_SECRET")


def _child_env() -> dict[str, str]:
    # the children import the same kvtide as this process (a worktree's src/ wins)
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in _FLEET_SECRETS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


class ChildProcess:
    """One child process; its stderr drained into the last ``log_lines`` lines (so it never
    blocks on a full pipe) and scanned for ``banner``."""

    def __init__(
        self,
        args: Sequence[str],
        name: str,
        log_lines: int = 200,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: added to the child's environment (kept across restarts)."""
        self.args = list(args)
        self.name = name
        self.env = env or {}
        self.log: collections.deque[str] = collections.deque(maxlen=log_lines)
        self._banner = threading.Event()
        self._banner_text: str | None = None
        self._banner_word = ""
        self.proc = self._spawn()

    def _spawn(self) -> subprocess.Popen[str]:
        # PDEATHSIG fires when the spawning *thread* ends, so only the main thread asks for it
        # (a child started from a worker thread would die with that thread)
        guard = sys.platform == "linux" and threading.current_thread() is threading.main_thread()
        proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**_child_env(), **self.env},
            start_new_session=True,
            preexec_fn=_die_with_parent if guard else None,
        )
        self._reader = threading.Thread(target=self._drain, args=(proc,), daemon=True)
        self._reader.start()
        return proc

    def _drain(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line.rstrip("\n"))
            if self._banner_word and self._banner_word in line and not self._banner.is_set():
                self._banner_text = line
                self._banner.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def wait_banner(self, word: str, timeout_s: float) -> str:
        """The first stderr line containing ``word``."""
        self._banner_word = word
        for line in list(self.log):
            if word in line:
                return line
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._banner.wait(0.05):
                return self._banner_text or ""
            if not self.is_alive:
                break
        raise KvtideError(f"{self.name} did not start: {self.tail()}")

    def wait_http(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_alive:
                break
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status < 500:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise KvtideError(f"{self.name}: {url} did not answer: {self.tail()}")

    def tail(self, lines: int = 5) -> str:
        prefix = "" if self.is_alive else f"exited with {self.proc.returncode}; "
        return prefix + (" | ".join(list(self.log)[-lines:]) or "no output")

    def kill(self) -> None:
        """SIGKILL now (a crash, for fault tests)."""
        if self.is_alive:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def restart(self) -> None:
        """The same command again (same ports) after the process ended."""
        assert not self.is_alive, "restart() of a live process"
        self._banner.clear()
        self._banner_text = None
        self.log.clear()
        self.proc = self._spawn()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM (the servers drain on it), then SIGKILL after ``timeout_s``."""
        if self.is_alive:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout_s)
            except ProcessLookupError:
                pass
        self._reader.join(2.0)
        if not self._reader.is_alive() and self.proc.stderr is not None:
            self.proc.stderr.close()  # read to its end: closed here, not by the collector
        return self.proc.returncode


@dataclass
class Engine:
    """A `kvtide engine` child with its HTTP and KV-event ports."""

    process: ChildProcess
    port: int
    events_port: int
    replay_port: int
    model: str

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def replica_spec(self) -> str:
        """The engine as `kvtide serve --replica` takes it."""
        return (
            f"{self.url}={self.model},events=tcp://{LOOPBACK}:{self.events_port},"
            f"replay=tcp://{LOOPBACK}:{self.replay_port}"
        )

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self.process.wait_banner("serving", timeout_s)
        self.process.wait_http(f"{self.url}/health", timeout_s)

    def restart(self, timeout_s: float = 60.0) -> None:
        self.process.restart()
        self.wait_ready(timeout_s)


def start_engine(
    group: ProcessGroup, model: str, engine_args: Sequence[str] = (), name: str = "engine"
) -> Engine:
    """Starts (does not wait for) one emulated engine on free loopback ports, in ``group``."""
    port, events, replay = free_port(), free_port(), free_port()
    args = [sys.executable, "-m", "kvtide", "engine", "--host", LOOPBACK, "--port", str(port),
            "--served-model-name", model, "--kv-events-port", str(events),
            "--kv-events-replay-port", str(replay), *engine_args]  # fmt: skip
    # its own NIXL side channel (bound with --kv-transfer-config; vLLM's default is one port
    # per host)
    side = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    child = group.add(ChildProcess(args, f"{name} :{port}", env=side))
    return Engine(child, port, events, replay, model)


@dataclass
class Gateway:
    process: ChildProcess
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


def start_gateway(
    group: ProcessGroup,
    engines: Sequence[Engine],
    policy: str,
    gateway_args: Sequence[str] = (),
    timeout_s: float = 60.0,
    prefill: int = 0,
) -> Gateway:
    """`kvtide serve` in front of ``engines`` with ``policy``, in ``group``; returns once its
    /health answers. ``prefill``: the first that many engines only prefill and the rest only
    decode (disaggregated; the engines run with ``--kv-transfer-config``)."""
    port = free_port()
    args = [sys.executable, "-m", "kvtide", "serve", "--host", LOOPBACK, "--port", str(port),
            "--policy", policy, *gateway_args]  # fmt: skip
    for i, e in enumerate(engines):
        role = "" if not prefill else ",role=prefill" if i < prefill else ",role=decode"
        args += ["--replica", e.replica_spec + role]
    gw = Gateway(group.add(ChildProcess(args, f"gateway :{port}")), port)
    gw.process.wait_http(f"{gw.url}/health", timeout_s)
    return gw


@dataclass
class ProcessGroup:
    """Every child started for one run, stopped together (reverse order) by ``stop_all``."""

    children: list[ChildProcess] = field(default_factory=list)
    on_stop: Callable[[ChildProcess], None] | None = None

    def add(self, child: ChildProcess) -> ChildProcess:
        self.children.append(child)
        return child

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        for child in reversed(self.children):
            child.stop(timeout_s)
            if self.on_stop is not None:
                self.on_stop(child)
        self.children.clear()

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.stop_all()
            return
        # a Ctrl-C while stopping must not leave children behind: it is noted, not raised,
        # until they are stopped; then raised if nothing else is (ignored, as it was, a
        # demo interrupted between its two runs went on to the second)
        interrupted: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda signum, frame: interrupted.append(signum))
        try:
            self.stop_all()
        finally:
            signal.signal(signal.SIGINT, previous)
        if interrupted and exc_type is None:
            raise KeyboardInterrupt


def requests_served(url: str) -> float:
    """Requests an engine finished (its vllm:request_success_total, all reasons)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def wait_all_ready(engines: Sequence[Engine], timeout_s: float = 90.0) -> None:
    for e in engines:
        e.wait_ready(timeout_s)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (Linux /proc; 0.0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # fields[11], [12] are utime, stime (fields 14 and 15 of proc(5), counted from the state)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (Linux /proc; 0 where unreadable)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
