"""Run under the peer-libraries venv: vLLM's own request classes for its tokenizer and pooling
endpoints, asked to parse each body read from stdin as JSON ``[[path, body], ...]``. Prints
``[[cache_salt, error], ...]`` (the parsed request's salt, or the validation error); exit 3
when vLLM's modules are missing.

    echo '[["/v1/embeddings", {"input": "x"}]]' | python peer_pooling_requests.py
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main() -> int:
    try:
        from pydantic import TypeAdapter, ValidationError
        from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
        from vllm.entrypoints.pooling.scoring.protocol import RerankRequest
        from vllm.entrypoints.serve.tokenize.protocol import (
            TokenizeChatRequest,
            TokenizeCompletionRequest,
        )
    except ImportError as exc:
        print(exc, file=sys.stderr)
        return 3
    embedding: TypeAdapter[Any] = TypeAdapter(EmbeddingRequest)
    out: list[list[Any]] = []
    for path, body in json.load(sys.stdin):
        try:
            if path == "/v1/embeddings":
                request = embedding.validate_python(body)
            elif path in ("/rerank", "/v1/rerank"):
                request = RerankRequest.model_validate(body)
            elif path == "/tokenize":
                kind = TokenizeChatRequest if "messages" in body else TokenizeCompletionRequest
                request = kind.model_validate(body)
            else:
                raise SystemExit(f"no vLLM class named for {path}")
        except ValidationError as exc:
            out.append([None, str(exc)])
            continue
        out.append([getattr(request, "cache_salt", None), None])
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
