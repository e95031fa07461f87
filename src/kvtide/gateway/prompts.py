"""A request body's prompt identity: its full-block hashes and its size in tokens.

Two modes. With a tokenizer the prompt is rendered (chat template) and tokenized as the engine
will, and its blocks hashed in the engines' namespace, so the index the engines' KV events feed
matches it. Without one, the prompt's UTF-8 bytes stand for tokens, ``chunk_chars`` bytes to a
block (about ``block_tokens`` tokens): approximate, for a shadow index of the gateway's own
decisions, as sglang-router's character tree is.
"""

from __future__ import annotations

import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import orjson
from xxhash import xxh3_64_intdigest

from kvtide.core.hashing import BlockHashes, hash_tokens
from kvtide.errors import RequestError
from kvtide.gateway.status import BAD_REQUEST, TOO_LARGE, ApiError
from kvtide.text.chat_request import ChatRequest, parse_chat_request
from kvtide.text.doorkeeper import Doorkeeper

CHARS_PER_TOKEN = 4
"""Bytes per token of English text under BPE vocabularies (tiktoken, Llama): the text-mode
estimate of ``prompt_tokens``."""


Ids = npt.NDArray[np.int32]
"""Token ids as the prefix cache holds and returns them: int32, read-only."""


def _frozen(arr: Ids) -> Ids:
    """Read-only: the prefix cache hands the same array to every request that shares it;
    hashing reads int32 as is."""
    arr.flags.writeable = False
    return arr


def _join(*parts: Ids) -> Ids:
    arr = np.concatenate(parts)
    arr.flags.writeable = False
    return arr


class PromptTokenizer(Protocol):
    """What the gateway needs of ``kvtide.text.Tokenizer``."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> npt.NDArray[np.int32]: ...

    def encode_head(
        self, text: str, min_tokens: int, add_special_tokens: bool = True
    ) -> tuple[Ids, int, Callable[[], Ids]] | None: ...

    def apply_chat_template(
        self, messages: Sequence[Any], add_generation_prompt: bool = True, **variables: Any
    ) -> str: ...


@dataclass(frozen=True, slots=True)
class Prompt:
    hashes: BlockHashes
    prompt_tokens: int
    whole: Callable[[], Prompt] | None = None
    """Set on a head (``head_blocks``): ``hashes`` are the prompt's first blocks only and
    ``prompt_tokens`` an estimate; ``whole()`` tokenizes the rest and gives the prompt."""


@dataclass(frozen=True, slots=True)
class Head:
    """The ids of a text's head, the text's length in tokens as the head's ratio estimates
    it, and ``whole()``: every id (the rest tokenized then)."""

    ids: Ids
    estimated_tokens: int
    whole: Callable[[], Ids]

    @classmethod
    def of(cls, text: str, got: tuple[Ids, int, Callable[[], Ids]]) -> Head:
        """From ``Tokenizer.encode_head``'s answer for ``text``."""
        head, cut, rest = got
        return cls(head, estimate_tokens(len(head), cut, text), lambda: _join(head, rest()))

    def then(self, suffix: Ids) -> Head:
        """The same head with ``suffix``'s ids after the text (the generation prompt)."""
        whole = self.whole
        return Head(self.ids, self.estimated_tokens + len(suffix), lambda: _join(whole(), suffix))


def estimate_tokens(head_tokens: int, cut: int, text: str) -> int:
    """``text``'s tokens, its first ``cut`` characters holding ``head_tokens``."""
    return round(head_tokens * len(text) / cut)


def chat_request(body: Mapping[str, Any]) -> ChatRequest:
    """``body``'s chat template inputs as the engine builds them (``kvtide.text.chat_request``);
    media parts are skipped: their text, not their pixels, is the prefix the gateway sees."""
    try:
        return parse_chat_request(body, media="skip")
    except RequestError as exc:
        raise ApiError(BAD_REQUEST, str(exc), exc.param) from None


_PLAIN = ("role", "content")

ConversationKey = tuple[tuple[Any, ...], ...]
"""A conversation's messages as a prefix cache key: (role, content) each, plus what else a
message carries (tool calls, a tool call id) and, on the first, the request's other template
inputs (tools, documents, ``chat_template_kwargs``), all of which change the rendered text."""


def _rest(m: Mapping[str, Any]) -> bytes:
    """A message's fields beyond role and content (tool calls, a call id, a name), as JSON."""
    return orjson.dumps({k: m[k] for k in m if k not in _PLAIN})


def conversation_key(req: ChatRequest, scope: int = 0) -> ConversationKey:
    """``scope`` (the request's namespace seed: its tenant and model) goes into the first
    message's entry, so one tenant's conversations never answer another's."""
    key = [
        (m["role"], m["content"]) if len(m) == 2 else (m["role"], m["content"], _rest(m))
        for m in req.messages
    ]
    first = (scope, *key[0])
    key[0] = (*first, orjson.dumps(req.variables)) if req.variables else first
    return tuple(key)


def identity_text(req: ChatRequest) -> str:
    """Text mode's stand-in for the rendered prompt: the template inputs in the order most
    tool-aware templates write them (tools and documents first, in the system prompt)."""
    text = "".join(
        f"\x00{m['role']}\x00{m['content']}"
        if len(m) == 2
        else f"\x00{m['role']}\x00{m['content']}\x00{_rest(m).decode()}"
        for m in req.messages
    )
    if req.variables:
        text = "\x01" + orjson.dumps(req.variables).decode() + text
    return text


def completion_prompt(body: Mapping[str, Any]) -> str | list[int]:
    """``prompt``: one string or one list of token ids, or a batch of one of either (n=1), as
    the engines take it. Ids are checked here, not by the hashing: a negative or 64-bit one
    is the client's 400, not the gateway's 500."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and set(map(type, prompt)) == {int}:
        if min(prompt) < 0 or max(prompt) > _MAX_ID:
            raise ApiError(BAD_REQUEST, "'prompt' token ids must be in [0, 2**31)", "prompt")
        return prompt
    raise ApiError(BAD_REQUEST, "'prompt' must be a string or a list of token ids", "prompt")


_MAX_ID = (1 << 31) - 1
"""Token ids are int32 in every engine's tensors (and the gateway's prefix cache)."""


if sys.byteorder != "little":  # BlockHashes packs little-endian uint64
    raise ImportError("kvtide.gateway.prompts assumes a little-endian machine")


class PromptHasher:
    """Prompt -> ``Prompt`` in one namespace seed per call (the tenant's and model's)."""

    def __init__(
        self,
        block_tokens: int,
        chunk_chars: int,
        max_prompt_chars: int,
        max_prompt_tokens: int,
        tokenizer: PromptTokenizer | None = None,
        prefix_cache_tokens: int = 2_000_000,
    ) -> None:
        self.block_tokens = block_tokens
        self.chunk_chars = chunk_chars
        self.max_prompt_chars = max_prompt_chars
        self.max_prompt_tokens = max_prompt_tokens
        self.tokenizer = tokenizer
        self.prefix_cache = PrefixTokenCache(prefix_cache_tokens)

    @property
    def is_exact(self) -> bool:
        return self.tokenizer is not None

    def chat(self, body: Mapping[str, Any], seed: int, head_blocks: int = 0) -> Prompt:
        """``head_blocks``: a conversation the prefix cache has not seen and long enough to
        cut may come back as a head of that many blocks (``Prompt.whole``), the rest not
        tokenized: the caller asks for the whole where replicas hold all of the head
        (``gateway.heads``)."""
        req = chat_request(body)
        messages = req.messages
        # what the template is given, its tools and tool calls included where there are any
        rich = bool(req.variables) or any(len(m) > 2 for m in messages)
        texts = (identity_text(req),) if rich else tuple(m["content"] for m in messages)
        size = sum(map(len, texts))
        self._check_chars(size, "messages")
        tok = self.tokenizer
        if tok is None:
            return self._text(texts[0] if rich else identity_text(req), seed)
        extra = 64 * len(messages)  # the template's own text, generously
        if (
            head_blocks
            and 4 * size + extra > self.max_prompt_tokens  # else it fits whatever the text
            and not self._fits_untokenized(texts, extra)
        ):
            head_blocks = 0
        _scope_memo(tok, seed)
        ids = self.prefix_cache.tokenize(tok, req, head_blocks * self.block_tokens, seed)
        if isinstance(ids, Head):
            return self._head(ids, head_blocks, seed, "messages")
        return self._tokens(ids, seed, "messages")

    def completion(self, body: Mapping[str, Any], seed: int, head_blocks: int = 0) -> Prompt:
        """``head_blocks``: as for ``chat``, a text prompt long enough to cut."""
        prompt = completion_prompt(body)
        if isinstance(prompt, list):
            return self._tokens(prompt, seed, "prompt")
        self._check_chars(len(prompt), "prompt")
        tok = self.tokenizer
        if tok is None:
            return self._text(prompt, seed)
        # vLLM's: the tokenizer's BOS, unless a client that rendered its own template says not
        special = body.get("add_special_tokens", True)
        if type(special) is not bool:
            raise ApiError(
                BAD_REQUEST, "'add_special_tokens' must be a boolean", "add_special_tokens"
            )
        _scope_memo(tok, seed)
        if head_blocks and self._fits_untokenized((prompt,), 0):
            got = tok.encode_head(prompt, head_blocks * self.block_tokens, special)
            if got is not None:
                return self._head(Head.of(prompt, got), head_blocks, seed, "prompt")
        return self._tokens(tok.encode_ids(prompt, special), seed, "prompt")

    def _fits_untokenized(self, texts: Iterable[str], extra: int) -> bool:
        """Whether the texts are within ``max_prompt_tokens`` however they tokenize: a token
        holds at least one UTF-8 byte (``isascii`` is a flag CPython keeps: free). A prompt
        that may not fit is tokenized whole, to refuse it with its count."""
        bound = extra + sum(len(t) if t.isascii() else 4 * len(t) for t in texts)
        return bound <= self.max_prompt_tokens

    def _head(self, head: Head, blocks: int, seed: int, param: str) -> Prompt:
        hashes = hash_tokens(head.ids, self.block_tokens, seed)[:blocks]

        def whole() -> Prompt:
            return self._tokens(head.whole(), seed, param)

        return Prompt(hashes, head.estimated_tokens, whole)

    def _check_chars(self, size: int, param: str) -> None:
        if size > self.max_prompt_chars:
            raise ApiError(
                TOO_LARGE, f"prompt of {size} characters (limit {self.max_prompt_chars})", param
            )

    def _text(self, text: str, seed: int) -> Prompt:
        """Each full chunk's hash is xxh3 of its bytes seeded by its parent's hash: chained
        like the engines' blocks, about 0.3 us a chunk (numpy's per-call overhead would cost
        more than the hashing at these sizes)."""
        raw = text.encode()
        step = self.chunk_chars
        out = array("Q")
        h = seed
        for i in range(0, len(raw) - step + 1, step):
            h = xxh3_64_intdigest(raw[i : i + step], h)
            out.append(h)
        tokens = max(len(raw) // CHARS_PER_TOKEN, 1)
        return Prompt(BlockHashes(out.tobytes()), tokens)

    def _tokens(self, ids: Sequence[int] | Ids, seed: int, param: str) -> Prompt:
        if len(ids) > self.max_prompt_tokens:
            raise ApiError(
                TOO_LARGE, f"prompt of {len(ids)} tokens (limit {self.max_prompt_tokens})", param
            )
        arr = ids if isinstance(ids, np.ndarray) else np.asarray(ids, dtype=np.int64)
        return Prompt(hash_tokens(arr, self.block_tokens, seed), len(ids))


def _scope_memo(tok: PromptTokenizer, seed: int) -> None:
    """The tokenizer's chunk memo answers this request's namespace only (its tenant's):
    shared, a tenant could learn from the memo's counts on /metrics, or from the time a
    request took, whether another had sent a text."""
    memo = getattr(tok, "memo", None)
    if memo is not None:
        memo.scope = seed


class PrefixTokenCache:
    """Token ids of conversation prefixes already rendered, so turn N of a conversation
    tokenizes only what turn N-1 did not have.

    Chat templates close every message with a special token (``<|im_end|>``, ``<|eot_id|>``),
    and tokenizers never merge across special tokens, so the ids of the rendered messages
    1..k are a prefix of the ids of 1..N whenever their text is a prefix of its text. The
    cache keys each prefix by its messages; a hit is used only when that text condition holds
    (checked), else the whole prompt is tokenized.

    Bounded by the token ids it holds, not by entries: conversations grow turn by turn, so a
    count of entries bounds nothing (4,096 long conversations as Python int lists grew a
    soak's gateway by ~19 MiB/min). Ids are kept as read-only int32 numpy arrays (4 bytes a
    token, against ~36 for a list of ints; converted once from the tokenizer's list, handed to
    the block hashing as they are) and the least recently used prefixes go first once ``max_tokens``
    is passed. A turn that extends a cached prefix replaces it (the new entry's ids begin with
    its ids), so a conversation holds its latest turn only.
    The rendered text kept beside them for the prefix check is about as large again
    (one byte a character, ~4 characters a token).

    An entry may hold a head only (``tokenize`` with ``head_tokens``: a prompt routed on its
    first blocks, ``gateway.heads``): its text is the conversation's up to a cut where the ids
    on either side are the whole text's, so the same conversation or its next turn extends it
    by tokenizing what follows the cut.

    A conversation's first message (a system prompt, usually) is kept as an entry of its own
    once a second conversation opens with it: a doorkeeper of ``max_firsts`` hashes remembers
    the first messages seen once. Stored at first sight, a one-off first message (a batch job's,
    a benchmark's) was held twice, on its own and in its conversation, and cost a second
    render and tokenizer call.
    """

    def __init__(self, max_tokens: int, max_firsts: int = 65_536) -> None:
        if max_tokens < 0:
            raise ValueError("max_tokens must be >= 0")
        self.max_tokens = max_tokens
        self._firsts = Doorkeeper(max_firsts)
        # heads (``_head``): the entry's whole conversation text, while the entry holds a head
        self._head_convs: dict[ConversationKey, str] = {}
        # heads a later turn extended, their whole ids: for the head's own ``whole()`` (its
        # request's provisional entries), asked for just after; bounded, oldest out first
        self._extended: OrderedDict[ConversationKey, Ids] = OrderedDict()
        self._entries: OrderedDict[ConversationKey, tuple[str, Ids]] = OrderedDict()
        self.tokens = 0
        """Token ids held now, over every entry: never above ``max_tokens``."""
        self._suffixes: dict[int, tuple[str, Ids] | None] = {}
        self.hits = 0
        self.misses = 0

    def _generation_suffix(self, tok: PromptTokenizer) -> tuple[str, Ids] | None:
        """The text ``add_generation_prompt`` appends and its ids, when the template just
        appends it and the tokenizer splits there (checked once per tokenizer on a probe): one
        render per request then gives both the prompt and the conversation without it, and
        the suffix is never tokenized again (a tokenizer call costs ~100 us even for a few
        tokens)."""
        key = id(tok)
        if key not in self._suffixes:
            probe = [{"role": "user", "content": "probe"}]
            conv = tok.apply_chat_template(probe, add_generation_prompt=False)
            full = tok.apply_chat_template(probe, add_generation_prompt=True)
            suffix: tuple[str, Ids] | None = None
            if full.startswith(conv) and len(full) > len(conv):
                tail = full[len(conv) :]
                tail_ids = tok.encode(tail, add_special_tokens=False)
                split = tok.encode(conv, add_special_tokens=False) + tail_ids
                if split == tok.encode(full, add_special_tokens=False):
                    suffix = (tail, _frozen(np.array(tail_ids, dtype=np.int32)))
            self._suffixes[key] = suffix
        return self._suffixes[key]

    def tokenize(
        self, tok: PromptTokenizer, req: ChatRequest, head_tokens: int = 0, scope: int = 0
    ) -> Ids | Head:
        """The prompt's ids; or, with ``head_tokens``, for a conversation neither cached nor
        opening with a first message seen before, a ``Head`` of at least that many tokens
        (its entry holds the head until ``whole()`` or a later turn extends it). Entries
        answer requests of the same ``scope`` only (the gateway's: the namespace seed)."""
        if req.continue_final_message:  # ends inside the last message: rare, not cached
            return _frozen(tok.encode_ids(req.render(tok), add_special_tokens=False))
        key = conversation_key(req, scope)
        if not req.add_generation_prompt:
            return self._conversation_ids(tok, key, req.render(tok), req, head_tokens)
        full = req.render(tok)
        suffix = self._generation_suffix(tok)
        if suffix is not None and full.endswith(suffix[0]):
            conv = full[: len(full) - len(suffix[0])]
            ids = self._conversation_ids(tok, key, conv, req, head_tokens)
            if isinstance(ids, Head):
                return ids.then(suffix[1])
            return _join(ids, suffix[1])
        conv = req.render(tok, add_generation_prompt=False)
        if not full.startswith(conv):  # a template that rewrites history at the end
            return _frozen(tok.encode_ids(full, add_special_tokens=False))
        ids = self._conversation_ids(tok, key, conv, req)
        assert not isinstance(ids, Head)  # asked for no head
        return _join(ids, tok.encode_ids(full[len(conv) :], add_special_tokens=False))

    def _conversation_ids(
        self,
        tok: PromptTokenizer,
        key: ConversationKey,
        conv: str,
        req: ChatRequest | None,
        head_tokens: int = 0,
    ) -> Ids | Head:
        """``req``: the request, for its first message rendered alone (None: a head's
        ``whole()``, whose entry is found)."""
        found = self._entries.get(key)
        if found is not None and conv.startswith(found[0]):
            self._entries.move_to_end(key)
            self.hits += 1
            if len(found[0]) == len(conv):
                return found[1]
            # a head's entry (below): the rest of the text now, cut where the head was cut
            rest = tok.encode_ids(conv[len(found[0]) :], add_special_tokens=False)
            return self._stored(key, conv, _join(found[1], rest))
        ids: Ids | None = None
        for k in range(len(key) - 1, 0, -1):
            prior = self._entries.get(key[:k])
            if prior is None:
                continue
            text, prefix_ids = prior
            if conv.startswith(text):
                self.hits += 1
                head_conv = self._head_convs.get(key[:k])
                if head_conv is not None and conv.startswith(head_conv):  # a head's turn
                    # its own rest first, kept for its whole(): tokenized once, not twice
                    more = tok.encode_ids(head_conv[len(text) :], add_special_tokens=False)
                    prefix_ids = self._extended_head(key[:k], _join(prefix_ids, more))
                    text = head_conv
                    if k == 1:  # kept below: whole now
                        self._store(key[:1], text, prefix_ids)
                rest = tok.encode_ids(conv[len(text) :], add_special_tokens=False)
                ids = _join(prefix_ids, rest)
                if k > 1:  # superseded by the longer entry stored below, which begins with it:
                    # without this a conversation of N turns held 1+2+...+N turns' ids
                    self._drop(key[:k])
                else:  # a first message (system prompt) is shared by other conversations
                    self._entries.move_to_end(key[:k])
            break
        if ids is None:
            self.misses += 1
            # the tuple's hash reuses its strings' cached hashes (the entry lookups')
            seen = len(key) > 1 and self._firsts.seen_before(key[0])
            if head_tokens and not seen:
                got = tok.encode_head(conv, head_tokens, add_special_tokens=False)
                if got is not None:
                    return self._head(tok, key, conv, got)
            ids = self._first_message_apart(tok, key, conv, req if seen else None)
        return self._stored(key, conv, ids)

    def _head(
        self,
        tok: PromptTokenizer,
        key: ConversationKey,
        conv: str,
        got: tuple[Ids, int, Callable[[], Ids]],
    ) -> Head:
        """A conversation's head, stored as the entry of its messages with the head's text:
        the next turn (or the same request again) extends it, tokenizing only the rest (the
        head was cut where the ids on both sides are the whole text's)."""
        head, cut, _ = got
        head = _frozen(head)
        self._store(key, conv[:cut], head)
        self._head_convs[key] = conv

        def whole() -> Ids:
            extended = self._extended.pop(key, None)  # by a later turn, just now
            if extended is not None:
                return extended
            ids = self._conversation_ids(tok, key, conv, None)  # the entry, or extended now
            assert not isinstance(ids, Head)  # asked for no head
            return ids

        return Head(head, estimate_tokens(len(head), cut, conv), whole)

    def _first_message_apart(
        self,
        tok: PromptTokenizer,
        key: ConversationKey,
        conv: str,
        seen: ChatRequest | None,
    ) -> Ids:
        """A miss: a first message seen before (``seen``: the request, its first message a
        system prompt shared by conversations) is tokenized and stored on its own, then the
        rest; else the whole conversation at once."""
        if seen is not None:
            first = seen.render(tok, seen.messages[:1], add_generation_prompt=False)
            if conv.startswith(first):
                first_ids = _frozen(tok.encode_ids(first, add_special_tokens=False))
                self._store(key[:1], first, first_ids)
                rest = tok.encode_ids(conv[len(first) :], add_special_tokens=False)
                return _join(first_ids, rest)
        return _frozen(tok.encode_ids(conv, add_special_tokens=False))

    def __len__(self) -> int:
        return len(self._entries)

    def _extended_head(self, key: ConversationKey, ids: Ids) -> Ids:
        """A head's whole ids, tokenized by a later turn, until the head's ``whole()`` (at
        most 256 kept, outside ``max_tokens``: ~8 kB each for 2k-token prompts)."""
        self._extended[key] = ids
        while len(self._extended) > 256:
            self._extended.popitem(last=False)
        return ids

    def _drop(self, key: ConversationKey) -> None:
        self._head_convs.pop(key, None)
        gone = self._entries.pop(key, None)
        if gone is not None:
            self.tokens -= len(gone[1])

    def _stored(self, key: ConversationKey, text: str, ids: Ids) -> Ids:
        self._store(key, text, ids)
        return ids

    def _store(self, key: ConversationKey, text: str, ids: Ids) -> None:
        if len(ids) > self.max_tokens:  # would evict everything and still not fit
            return
        self._drop(key)
        self._entries[key] = (text, ids)
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            old, (_, gone) = self._entries.popitem(last=False)
            self._head_convs.pop(old, None)
            self.tokens -= len(gone)
