"""A trace request as real text: the same block id always gives the same words, so the trace's
prefix structure reaches the engine; a session's turns become chat messages. Or, with
``PromptBuilder.token_ids``, the prompt as token ids, with no text and no re-tokenization.

A block id's text is ``block_tokens`` words drawn by a generator seeded with (seed, block id)
from the tokenizer's one-token words (a space and lowercase ASCII letters that encode to a single
id, as in " harbour"). A byte-level BPE's pre-tokenizer splits before every such word, so a
block's text is exactly ``block_tokens`` tokens and blocks stay aligned to token positions;
other tokenizers get close. A token-level trace's ids are detokenized instead; synthetic ids
(a built-in workload's, ``ids_as_words``) become one word each, the word an id picks from the
same pool: random ids drawn over a vocabulary detokenize into glued pieces no one writes
("assicconcept enjoy Battorneys"), on which a byte-level BPE costs ~2.5x as much a token as on
words (the tokenizing servers' CPU is then overstated) and which re-tokenize to about, not
exactly, their count.

As token ids, a token-level trace's prompt is its own ids, exactly as the simulator hashes them;
a block-level trace's is the ids of its blocks' words (the text's tokens, without a tokenizer
round trip), so the server receives ``prompt_tokens`` ids with the trace's prefix sharing.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtide.errors import ConfigError
from kvtide.text import Tokenizer
from kvtide.types import Request

MIN_WORDS = 64
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / the golden ratio: spreads consecutive ids
_MASK64 = 2**64 - 1
_BLOCK_CACHE = 65_536


def _is_plain_word(piece: str) -> bool:
    word = piece[1:]
    return (
        piece.startswith(" ")
        and 3 <= len(word) <= 9
        and word.isascii()
        and word.isalpha()
        and word.islower()
    )


def one_token_vocabulary(tokenizer: Tokenizer) -> list[tuple[str, int]]:
    """The pool, (word, its token id), sorted so that it is the same on every run for the same
    tokenizer."""
    size = tokenizer.vocab_size
    pieces = tokenizer.backend.decode_batch([[i] for i in range(size)], skip_special_tokens=True)
    candidates = sorted({p for p in pieces if _is_plain_word(p)})
    encoded = tokenizer.encode_batch(candidates, add_special_tokens=False)
    words = [(w, ids[0]) for w, ids in zip(candidates, encoded, strict=True) if len(ids) == 1]
    if len(words) < MIN_WORDS:
        raise ConfigError(
            f"tokenizer {tokenizer.name!r} has only {len(words)} one-token words "
            f"(need {MIN_WORDS}) to turn block ids into text"
        )
    return words


@dataclass(frozen=True, slots=True)
class Prompt:
    """What is sent: chat messages (role, content) in order; ``text`` joins their contents.
    A token-id prompt has no messages and its ``token_ids``."""

    messages: tuple[tuple[str, str], ...]
    token_ids: tuple[int, ...] | None = None

    @property
    def text(self) -> str:
        return "".join(content for _, content in self.messages)


@dataclass(slots=True)
class _Turn:
    prompt_tokens: int
    output_tokens: int
    boundaries: tuple[int, ...]


class PromptBuilder:
    """Turns requests, in arrival order, into prompts. Stateful only through sessions: turn k+1
    of a session is split at turn k's prompt end and output end (user, assistant, user ...),
    taken from the trace and never from the engine's replies, so every run sends the same text."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, ids_as_words: bool = False) -> None:
        self.tokenizer = tokenizer
        self.seed = seed
        self.ids_as_words = ids_as_words
        """Token-level requests' ids are synthetic: each becomes a word (``id_words``), not
        its detokenized text."""
        vocabulary = one_token_vocabulary(tokenizer)
        self.words = [word for word, _ in vocabulary]
        self._word_ids = {word: token_id for word, token_id in vocabulary}
        self._blocks: OrderedDict[tuple[int, int], tuple[str, ...]] = OrderedDict()
        self._sessions: dict[str, _Turn] = {}

    def block_words(self, block_id: int, block_tokens: int) -> tuple[str, ...]:
        key = (block_id, block_tokens)
        found = self._blocks.get(key)
        if found is not None:
            self._blocks.move_to_end(key)
            return found
        # str seeds hash with SHA-512 in CPython: the same words on every run and platform
        rng = random.Random(f"kvtide-loadgen:{self.seed}:{block_id}")
        pool, n = self.words, len(self.words)
        words = tuple(pool[rng.randrange(n)] for _ in range(block_tokens))
        self._blocks[key] = words
        if len(self._blocks) > _BLOCK_CACHE:
            self._blocks.popitem(last=False)
        return words

    def span(self, request: Request, start: int, stop: int) -> str:
        """The text of the prompt's tokens ``[start, stop)``."""
        if stop <= start:
            return ""
        if request.token_ids is not None:
            ids = request.token_ids
            chunk = ids[start:stop]
            as_list = chunk.tolist() if isinstance(chunk, np.ndarray) else list(chunk)
            if self.ids_as_words:
                return "".join(self.id_words(as_list))
            return self.tokenizer.decode(as_list, skip_special_tokens=False)
        bt = request.block_tokens
        block_ids = self._block_ids(request)
        parts: list[str] = []
        for index in range(start // bt, (stop - 1) // bt + 1):
            words = self.block_words(block_ids[index], bt)
            lo, hi = max(start - index * bt, 0), min(stop - index * bt, bt)
            parts.append("".join(words[lo:hi]))
        return "".join(parts)

    def id_words(self, ids: Sequence[int]) -> list[str]:
        """One word for each synthetic id, the same for the same id and seed: a multiplicative
        hash of (id, seed) into the pool (ids apart by the pool's size get different words,
        as they would not under ``id % len(pool)``)."""
        pool, n = self.words, len(self.words)
        salt = self.seed * _GOLDEN
        return [pool[((i * _GOLDEN + salt) & _MASK64) % n] for i in ids]

    def _block_ids(self, request: Request) -> Sequence[int]:
        if request.block_ids is not None:
            return request.block_ids
        # no identity in the trace: ids of this request only (shares nothing)
        base = int.from_bytes(request.request_id.encode()[:6].ljust(6, b"\0"), "little") << 20
        return range(base, base + request.prompt_tokens // request.block_tokens + 1)

    def build(self, request: Request) -> Prompt:
        total = request.prompt_tokens
        boundaries: tuple[int, ...] = ()
        if request.session_id is not None:
            prev = self._sessions.get(request.session_id)
            if prev is not None and total >= prev.prompt_tokens + prev.output_tokens:
                boundaries = (
                    *prev.boundaries,
                    prev.prompt_tokens,
                    prev.prompt_tokens + prev.output_tokens,
                )
            self._sessions[request.session_id] = _Turn(total, request.output_tokens, boundaries)
        edges = (0, *boundaries, total)
        roles = ("user", "assistant")
        return Prompt(
            tuple(
                (roles[i % 2], self.span(request, edges[i], edges[i + 1]))
                for i in range(len(edges) - 1)
            )
        )

    def token_ids(self, request: Request) -> Prompt:
        """The whole prompt as ``prompt_tokens`` token ids, no chat turns: the trace's own ids
        when it has them, else its blocks' words as ids (the same ids for the same block)."""
        total = request.prompt_tokens
        if request.token_ids is not None:
            chunk = request.token_ids[:total]
            ids = chunk.tolist() if isinstance(chunk, np.ndarray) else list(chunk)
            return Prompt((), tuple(int(t) for t in ids))
        bt = request.block_tokens
        block_ids = self._block_ids(request)
        word_ids = self._word_ids
        out: list[int] = []
        for index in range(-(-total // bt)):
            words = self.block_words(block_ids[index], bt)
            out.extend(word_ids[w] for w in words[: min(bt, total - index * bt)])
        return Prompt((), tuple(out))
