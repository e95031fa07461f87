"""KV events from the engines' own publisher classes (vLLM, SGLang), over real ZMQ sockets.

Runs the publisher in a subprocess under the peer-libraries venv (``KVTIDE_PEER_PYTHON``,
default /work/venvs/peerlibs/bin/python); skipped when that interpreter or the engine's
module is not there. Slow: importing vLLM or SGLang takes tens of seconds.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from peer_process import peer_python

from kvtide.clock import ManualClock
from kvtide.core.hashing import hash_tokens
from kvtide.routing.index import GlobalPrefixIndex
from kvtide.routing.ingest import SequencedIngest
from kvtide.state.kv_events import KvEventSubscriber
from kvtide.state.kv_translate import EngineEventSink, EventTranslator
from kvtide.state.kv_wire import EngineEventBatch
from kvtide.types import ReplicaId

SCRIPT = Path(__file__).with_name("peer_kv_publisher.py")
MODULES = {
    "vllm": "vllm.distributed.kv_events",
    "sglang": "sglang.srt.disaggregation.kv_events",
}
R = ReplicaId("engine-0")

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_publisher_classes_feed_the_index(engine: str) -> None:
    python = peer_python()
    index = GlobalPrefixIndex()
    translator = EventTranslator(16, seed=7)
    sink = EngineEventSink(index, translator)
    ingest: SequencedIngest[EngineEventBatch] = SequencedIngest(
        sink.apply, sink.clear, ManualClock()
    )
    replay = f"tcp://127.0.0.1:{_free_port()}"
    if engine == "vllm":  # vLLM's PUB connects to a concrete host: we bind
        sub = KvEventSubscriber(R, "tcp://127.0.0.1:*", ingest, replay_endpoint=replay, bind=True)
        pub_ep = sub.bound_endpoint
    else:
        pub_ep = f"tcp://127.0.0.1:{_free_port()}"
        sub = None
    with subprocess.Popen(
        [str(python), str(SCRIPT), engine, pub_ep, replay],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stdin is not None
            if proc.stdout.readline().strip() != "ready":  # the import failed
                pytest.skip(f"{MODULES[engine]} not importable by {python}")
            if sub is None:
                sub = KvEventSubscriber(R, pub_ep, ingest, replay_endpoint=replay)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "published"
            sub.poll(timeout_s=0.5)
            sub.bootstrap()  # what the slow-joiner window lost comes from the replay socket
            assert ingest.next_seq(R) == 5 and not ingest.has_gap(R)
            toks = list(range(1000, 1096))
            m = index.match(hash_tokens(toks, 16, 7))
            # blocks 0-2 on the GPU, block 3 moved to CPU, blocks 4-5 on the GPU again
            assert m.tier_blocks(R) == (3, 3, 0)
            assert translator.counters.unresolved_stores == 0
            assert translator.num_mapped(R) == 6
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
            if sub is not None:
                sub.close()
