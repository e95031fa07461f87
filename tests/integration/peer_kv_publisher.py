"""Publishes KV events with an engine's own classes; run by test_kv_events_peers.py under the
peer-libraries venv (vLLM or SGLang installed). Not a test module.

    python peer_kv_publisher.py vllm|sglang PUB_ENDPOINT REPLAY_ENDPOINT

Prints "ready", waits for a line, publishes 5 batches, prints "published", waits for a line
(replays are served meanwhile), shuts down.
"""

from __future__ import annotations

import sys
import time


def main() -> None:
    engine, pub_ep, replay_ep = sys.argv[1:4]
    if engine == "vllm":
        from vllm.distributed.kv_events import (
            BlockRemoved,
            BlockStored,
            KVEventBatch,
            ZmqEventPublisher,
        )

        # vLLM connects its PUB to a non-wildcard endpoint: the test's subscriber binds it
        pub = ZmqEventPublisher(
            data_parallel_rank=0, endpoint=pub_ep, replay_endpoint=replay_ep, buffer_steps=100
        )
        cpu = "CPU"

        def h(i: int) -> object:
            return b"%032d" % i  # vLLM's default hashes are 32-byte sha256 digests

        def stored(hashes: list, parent: object, tokens: list, medium: str = "GPU") -> object:
            return BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=16,
                lora_id=None,
                medium=medium,
                lora_name=None,
            )

        def batch(events: list) -> object:
            return KVEventBatch(ts=time.time(), events=events)
    else:
        from sglang.srt.disaggregation.kv_events import (
            BlockRemoved,
            BlockStored,
            KVEventBatch,
            ZmqEventPublisher,
        )

        pub = ZmqEventPublisher(
            attn_dp_rank=0,
            endpoint=pub_ep,
            replay_endpoint=replay_ep,
            buffer_steps=100,
            bind=True,
        )
        cpu = "CPU_PINNED"

        def h(i: int) -> object:
            return -(i + 1) * 1_234_567_891  # SGLang publishes signed int64 hashes

        def stored(hashes: list, parent: object, tokens: list, medium: str = "GPU") -> object:
            return BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent,
                token_ids=tokens,
                block_size=16,
                lora_id=None,
                medium=medium,
            )

        def batch(events: list) -> object:
            return KVEventBatch(ts=time.time(), events=events)

    print("ready", flush=True)
    sys.stdin.readline()
    toks = list(range(1000, 1096))
    for events in (
        [stored([h(0), h(1)], None, toks[0:32])],
        [stored([h(2), h(3)], h(1), toks[32:64])],
        [BlockRemoved(block_hashes=[h(3)], medium="GPU")],
        [stored([h(3)], h(2), toks[48:64], medium=cpu)],
        [stored([h(4), h(5)], h(3), toks[64:96])],
    ):
        pub.publish(batch(events))
    time.sleep(0.5)  # let the publisher thread send before saying so
    print("published", flush=True)
    sys.stdin.readline()
    pub.shutdown()


if __name__ == "__main__":
    main()
