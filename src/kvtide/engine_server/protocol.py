"""The OpenAI / vLLM request bodies the engine accepts, checked field by field, and the response
bodies it returns, in vLLM's shapes (vllm/entrypoints/openai/protocol.py, vLLM 0.33).

Parsing never raises anything but ``ApiError`` (400 with the field as ``param``): a wrong type,
a missing field or an out-of-range value is the client's mistake, not a traceback.
Sampling parameters the emulator does not model (temperature, top_p, seed, ...) are accepted
when they have the right type and otherwise ignored, as an engine with greedy decoding would;
fields that would add to the response (``logprobs``, a chat's ``top_logprobs`` and ``echo``)
are refused when they ask for something.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kvtide.asgi import ApiError
from kvtide.engine_server.api_errors import bad_request
from kvtide.engine_server.kv_transfer import TransferParams, parse_params
from kvtide.errors import RequestError
from kvtide.text import anthropic_request, responses_request
from kvtide.text.chat_request import ChatRequest, parse_chat_request

Kind = Literal["completion", "chat", "responses", "messages"]

_NUMBER_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
)


@dataclass(frozen=True, slots=True)
class Generation:
    """One completion or chat completion request, its prompt not yet tokenized."""

    kind: Kind
    model: str | None
    prompt_text: str | None
    prompt_ids: tuple[int, ...] | None
    chat: ChatRequest | None
    """A chat's template inputs (``kvtide.text.chat_request``: the gateway renders the same)."""
    max_tokens: int | None
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    ignore_eos: bool
    cache_salt: str | None
    priority: int = 0
    """vLLM's scheduling priority (lower first), honoured under ``--scheduling-policy
    priority``."""
    add_special_tokens: bool = True
    """A text completion's: the tokenizer's BOS (or whatever its post-processor adds), on by
    default as in vLLM; off for a prompt a client rendered with its own template."""
    include_stop_str: bool = False
    """vLLM's ``include_stop_str_in_output``: the text ends after the stop string, not
    before it."""
    echo: bool = False
    """A completion's: its text starts with the prompt."""
    max_tokens_param: str = "max_tokens"
    """The field ``max_tokens`` came from (a chat's may be ``max_completion_tokens``), for
    the error that refuses it."""
    kv_transfer: TransferParams | None = None
    """vLLM's ``kv_transfer_params`` (disaggregated prefill and decode: ``kv_transfer``)."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(v), "null" if v is None else type(v).__name__
    )


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is None or isinstance(v, str):
        return v
    raise bad_request(f"'{key}' must be a string, got {_type_name(v)}", key)


def _opt_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool):
        return v
    raise bad_request(f"'{key}' must be a boolean, got {_type_name(v)}", key)


def _opt_positive_int(body: Mapping[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not _is_int(v):
        raise bad_request(f"'{key}' must be an integer, got {_type_name(v)}", key)
    if v < 1:
        raise bad_request(f"'{key}' must be at least 1, got {v}", key)
    return int(v)


def _check_common(body: Mapping[str, Any]) -> None:
    for key in _NUMBER_FIELDS:
        v = body.get(key)
        if v is not None and (
            isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        ):
            raise bad_request(f"'{key}' must be a finite number, got {_type_name(v)}", key)
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise bad_request("only n=1 is supported", "n")
    if body.get("best_of") not in (None, 1):
        raise bad_request("only best_of=1 is supported", "best_of")
    if body.get("prompt_logprobs") is not None:
        raise _unsupported("prompt_logprobs")


def _unsupported(key: str) -> ApiError:
    """A field that would change the response's shape, which the emulator cannot fill in:
    refused, so that a client learns it rather than reading nulls it did not ask for."""
    return bad_request(f"'{key}' is not supported by the emulated engine", key)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    v = body.get("stop")
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise bad_request("'stop' must be a string or an array of strings", "stop")


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    if opts and not stream:  # vLLM tests its truthiness: an empty object passes
        raise bad_request("'stream_options' is only allowed with stream=true", "stream_options")
    return _opt_bool(opts, "include_usage", False)


def _all_ints(v: Sequence[Any]) -> bool:
    """Every item an int and none a bool, checked in C: a prompt of thousands of ids is parsed
    on the event loop, ahead of every other request's tokens."""
    return set(map(type, v)) == {int}


def _token_ids(v: Sequence[Any], param: str) -> tuple[int, ...]:
    if v and (not _all_ints(v) or min(v) < 0):
        raise bad_request(f"'{param}' token ids must be non-negative integers", param)
    return tuple(v)


def parse_completion(body: object) -> Generation:
    """``POST /v1/completions``: ``prompt`` as text, token ids, or a batch of one of either."""
    body = _object(body)
    _check_common(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    text: str | None = None
    ids: tuple[int, ...] | None = None
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, list) and prompt and _all_ints(prompt):
        ids = _token_ids(prompt, "prompt")
    elif prompt is None:
        raise bad_request("'prompt' is required", "prompt")
    elif isinstance(prompt, list) and len(prompt) != 1:
        raise bad_request(
            "'prompt' must be one prompt: batched prompts are not supported", "prompt"
        )
    else:
        raise bad_request("'prompt' must be a string or an array of token ids", "prompt")
    if text is not None and not text:
        raise bad_request("'prompt' must not be empty", "prompt")
    if body.get("logprobs") is not None:  # any count, 0 included, asks for the sampled one's
        raise _unsupported("logprobs")
    stream = _opt_bool(body, "stream", False)
    return Generation(
        kind="completion",
        model=_opt_str(body, "model"),
        prompt_text=text,
        prompt_ids=ids,
        chat=None,
        max_tokens=_opt_positive_int(body, "max_tokens"),
        stream=stream,
        include_usage=_stream_options(body, stream),
        stop=_stop(body),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
        cache_salt=_cache_salt(body),
        priority=_priority(body),
        add_special_tokens=_opt_bool(body, "add_special_tokens", True),
        include_stop_str=_opt_bool(body, "include_stop_str_in_output", False),
        echo=_opt_bool(body, "echo", False),
        kv_transfer=parse_params(body, reuse_prompt=False),
    )


def parse_chat(body: object) -> Generation:
    """``POST /v1/chat/completions``: ``messages`` rendered later by the chat template."""
    body = _object(body)
    _check_common(body)
    chat = _chat_request(body)
    max_tokens_param = "max_completion_tokens"
    max_tokens = _opt_positive_int(body, max_tokens_param)
    if max_tokens is None:
        max_tokens_param = "max_tokens"
        max_tokens = _opt_positive_int(body, max_tokens_param)
    if _opt_bool(body, "logprobs", False):
        raise _unsupported("logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or top > 0):
        raise _unsupported("top_logprobs")
    if _opt_bool(body, "echo", False):  # a chat's echo repeats the last message: not modelled
        raise _unsupported("echo")
    stream = _opt_bool(body, "stream", False)
    return Generation(
        kind="chat",
        model=_opt_str(body, "model"),
        prompt_text=None,
        prompt_ids=None,
        chat=chat,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=_stream_options(body, stream),
        stop=_stop(body),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
        cache_salt=_cache_salt(body),
        priority=_priority(body),
        include_stop_str=_opt_bool(body, "include_stop_str_in_output", False),
        max_tokens_param=max_tokens_param,
        kv_transfer=parse_params(body, reuse_prompt=True),
    )


def parse_messages(body: object, merge_inline_system: bool) -> Generation:
    """``POST /v1/messages`` (Anthropic's Messages API): converted to the chat request vLLM
    renders (``kvtide.text.anthropic_request``, as the gateway converts it), its own
    ``max_tokens`` (required), ``stop_sequences``, ``stream`` and ``cache_salt``."""
    body = _object(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    max_tokens = _opt_positive_int(body, "max_tokens")
    if max_tokens is None:
        raise bad_request("'max_tokens' is required", "max_tokens")
    stops = body.get("stop_sequences")
    if stops is not None and (
        not isinstance(stops, list) or not all(isinstance(x, str) for x in stops)
    ):
        raise bad_request("'stop_sequences' must be an array of strings", "stop_sequences")
    return Generation(
        kind="messages",
        model=model,
        prompt_text=None,
        prompt_ids=None,
        chat=_converted(anthropic_request.chat_body, body, merge_inline_system),
        max_tokens=max_tokens,
        stream=_opt_bool(body, "stream", False),
        include_usage=True,
        stop=tuple(stops or ()),
        ignore_eos=False,
        cache_salt=_cache_salt(body),
        kv_transfer=parse_params(body, reuse_prompt=True),
    )


def parse_count_tokens(body: object, merge_inline_system: bool) -> tuple[str, ChatRequest]:
    """``POST /v1/messages/count_tokens``: the model and the chat request vLLM renders to
    count a Messages request's input (no ``max_tokens`` needed)."""
    body = _object(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string", "model")
    return model, _converted(anthropic_request.chat_body, body, merge_inline_system)


def parse_responses(body: object, history: Sequence[dict[str, Any]] = ()) -> Generation:
    """``POST /v1/responses`` (OpenAI's Responses API): converted to the chat request vLLM
    renders (``kvtide.text.responses_request``, as the gateway converts it; ``history``: the
    stored conversation its ``previous_response_id`` names), its ``max_output_tokens``,
    ``stream``, and vLLM's extras ``stop``, ``cache_salt`` and ``priority``."""
    body = _object(body)
    return Generation(
        kind="responses",
        model=_opt_str(body, "model"),
        prompt_text=None,
        prompt_ids=None,
        chat=_converted(responses_request.chat_body, body, history),
        max_tokens=_opt_positive_int(body, "max_output_tokens"),
        stream=_opt_bool(body, "stream", False),
        include_usage=True,
        stop=_stop(body),
        ignore_eos=_opt_bool(body, "ignore_eos", False),
        cache_salt=_cache_salt(body),
        priority=_priority(body),
        max_tokens_param="max_output_tokens",
        kv_transfer=parse_params(body, reuse_prompt=True),
    )


def _converted(convert: Callable[..., dict[str, Any]], *args: Any) -> ChatRequest:
    """The template's inputs of a request another API's ``convert`` turns into a chat
    request as vLLM does; a 400 naming the field where it is malformed."""
    try:
        chat = convert(*args)
    except RequestError as exc:
        raise bad_request(str(exc), exc.param) from None
    return _chat_request(chat)


def _chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """The template's inputs, as vLLM builds them; text parts only (no media)."""
    try:
        return parse_chat_request(body, media="refuse")
    except RequestError as exc:
        raise bad_request(str(exc), exc.param) from None


def _priority(body: Mapping[str, Any]) -> int:
    v = body.get("priority")
    if v is None:
        return 0
    if not _is_int(v):
        raise bad_request(f"'priority' must be an integer, got {_type_name(v)}", "priority")
    return int(v)


def _cache_salt(body: Mapping[str, Any]) -> str | None:
    salt = _opt_str(body, "cache_salt")
    if salt is not None and not salt:
        raise bad_request("'cache_salt' must not be empty", "cache_salt")
    return salt


def _object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    return body


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    model: str | None
    prompt: str | None
    chat: ChatRequest | None
    add_special_tokens: bool
    return_token_strs: bool = False


def parse_tokenize(body: object) -> TokenizeRequest:
    """``POST /tokenize``: ``prompt`` (completions) or ``messages`` (chat), as vLLM takes."""
    body = _object(body)
    prompt = body.get("prompt")
    messages = body.get("messages")
    token_strs = _opt_bool(body, "return_token_strs", False)
    if prompt is not None:
        if not isinstance(prompt, str):
            raise bad_request("'prompt' must be a string", "prompt")
        return TokenizeRequest(
            _opt_str(body, "model"),
            prompt,
            None,
            _opt_bool(body, "add_special_tokens", True),
            token_strs,
        )
    if messages is None:
        raise bad_request("'prompt' or 'messages' is required", "prompt")
    return TokenizeRequest(
        _opt_str(body, "model"),
        None,
        _chat_request(body),
        _opt_bool(body, "add_special_tokens", False),
        token_strs,
    )


def parse_detokenize(body: object) -> tuple[str | None, tuple[int, ...]]:
    body = _object(body)
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise bad_request("'tokens' must be an array of token ids", "tokens")
    return _opt_str(body, "model"), _token_ids(tokens, "tokens")


# --- responses ------------------------------------------------------------------------------


def usage(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int, written_tokens: int | None
) -> dict[str, Any]:
    """vLLM's ``UsageInfo`` with ``prompt_tokens_details`` (``--enable-prompt-tokens-details``):
    a chat's also counts the prompt tokens written to the prefix cache (vLLM 0.33's
    ``created_cache_tokens``), a completion's does not (``written_tokens`` None)."""
    details: dict[str, Any] = {"cached_tokens": cached_tokens}
    if written_tokens is not None:
        details["created_cache_tokens"] = written_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
    }


def completion_body(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    use: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "prompt_logprobs": None,
            }
        ],
        "usage": use,
        "system_fingerprint": None,
        "kv_transfer_params": None,
    }


def chat_body(
    rid: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    stop_reason: str | None,
    use: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": None,
                    "audio": None,
                    "function_call": None,
                    "tool_calls": [],
                    "reasoning_content": None,
                },
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": use,
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def models_body(name: str, created: int, max_model_len: int) -> dict[str, Any]:
    """``GET /v1/models`` as vLLM lists its one served model."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "kvtide",
                "root": name,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [],
            }
        ],
    }
