"""Decodes KV events with an engine's own msgspec classes; run by
test_engine_server_events_peers.py under the peer-libraries venv. Not a test module.

    python peer_kv_decoder.py vllm|sglang PUB_ENDPOINT

Subscribes to PUB_ENDPOINT (a `kvtide engine`'s KV-event socket), prints "ready", then one
JSON line per event as the engine's own decoder typed it, until a line arrives on stdin.
"""

from __future__ import annotations

import json
import select
import sys


def main() -> None:
    engine, pub_ep = sys.argv[1:3]
    if engine == "vllm":
        from vllm.distributed.kv_events import KVEventBatch
    else:
        from sglang.srt.disaggregation.kv_events import KVEventBatch
    import msgspec
    import zmq

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)  # strict: a wrong field fails here
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    print("ready", flush=True)
    while True:
        if select.select([sys.stdin], [], [], 0)[0]:
            break
        if not sub.poll(100):
            continue
        _topic, seq, payload = sub.recv_multipart()
        batch = decoder.decode(payload)
        for event in batch.events:
            row = {"seq": int.from_bytes(seq, "big"), "type": type(event).__name__}
            for field in event.__struct_fields__:
                value = getattr(event, field)
                row[field] = (
                    value if isinstance(value, (int, str, list, type(None))) else repr(value)
                )
            print(json.dumps(row), flush=True)
    sub.close(0)


if __name__ == "__main__":
    main()
