"""GPT-2 style byte-level BPE over a GGUF vocabulary, and SmolLM2's ChatML chat rendering.

Pre-tokenisation follows SmolLM2's tokenizer.json (and llama.cpp's "smollm" pre-type): digits
are split one by one, then the GPT-2 pattern
``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``
is applied, here by a hand-written scanner so that no regex package is needed.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache

_CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@cache
def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (Radford et al., 2019)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _kind(ch: str) -> str:
    """'s' whitespace, 'L' letter, 'N' number, 'o' anything else."""
    if ch.isspace():
        return "s"
    major = unicodedata.category(ch)[0]
    return major if major in ("L", "N") else "o"


def pre_tokenize(text: str) -> list[str]:
    """Splits text into the pieces BPE runs on, as SmolLM2's pre-tokenizer does."""
    pieces: list[str] = []
    for chunk in _split_digits(text):
        pieces.extend(_gpt2_split(chunk))
    return pieces


def _split_digits(text: str) -> Iterable[str]:
    start = 0
    for i, ch in enumerate(text):
        if _kind(ch) == "N":
            if start < i:
                yield text[start:i]
            yield ch
            start = i + 1
    if start < len(text):
        yield text[start:]


def _gpt2_split(s: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "'":
            tail = next((c for c in _CONTRACTIONS if s.startswith(c, i + 1)), None)
            if tail is not None:
                out.append(s[i : i + 1 + len(tail)])
                i += 1 + len(tail)
                continue
        j = i + 1 if ch == " " and i + 1 < n and _kind(s[i + 1]) != "s" else i
        kind = _kind(s[j])
        if kind != "s":
            j += 1
            while j < n and _kind(s[j]) == kind:
                j += 1
            out.append(s[i:j])
            i = j
            continue
        j = i
        while j < n and _kind(s[j]) == "s":
            j += 1
        # \s+(?!\S): leave the last space of a run to prefix the word after it.
        if j < n and j - i > 1:
            j -= 1
        out.append(s[i:j])
        i = j
    return out


class BpeTokenizer:
    """Byte-level BPE: token strings and ranked merges, control tokens matched verbatim."""

    def __init__(
        self,
        tokens: Sequence[str],
        merges: Sequence[str],
        control_ids: Sequence[int] = (),
        eos_id: int | None = None,
    ) -> None:
        self._tokens = list(tokens)
        self._token_to_id = {t: i for i, t in enumerate(self._tokens)}
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            left, _, right = merge.partition(" ")
            self._ranks[(left, right)] = rank
        self._control = {self._tokens[i]: i for i in control_ids}
        self._control_re = (
            re.compile("|".join(re.escape(t) for t in sorted(self._control, key=len, reverse=True)))
            if self._control
            else None
        )
        self._byte_to_char = _byte_to_char()
        self._char_to_byte = {c: b for b, c in self._byte_to_char.items()}
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self.eos_id = eos_id

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def token_id(self, token: str) -> int:
        return self._token_to_id[token]

    def encode(self, text: str, allow_control: bool = True) -> list[int]:
        """Token ids of ``text``; control tokens such as <|im_start|> map to their ids."""
        ids: list[int] = []
        start = 0
        if allow_control and self._control_re is not None:
            for found in self._control_re.finditer(text):
                ids.extend(self._encode_plain(text[start : found.start()]))
                ids.append(self._control[found.group()])
                start = found.end()
        ids.extend(self._encode_plain(text[start:]))
        return ids

    def decode(self, ids: Iterable[int], skip_control: bool = False) -> str:
        parts: list[str] = []
        buffer = bytearray()
        for token_id in ids:
            token = self._tokens[token_id]
            if token in self._control:
                parts.append(buffer.decode("utf-8", errors="replace"))
                buffer.clear()
                if not skip_control:
                    parts.append(token)
                continue
            buffer.extend(self._char_to_byte[c] for c in token)
        parts.append(buffer.decode("utf-8", errors="replace"))
        return "".join(parts)

    def _encode_plain(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in pre_tokenize(text):
            cached = self._word_cache.get(piece)
            if cached is None:
                mapped = "".join(self._byte_to_char[b] for b in piece.encode("utf-8"))
                cached = tuple(self._token_to_id[s] for s in self._bpe(mapped))
                if len(self._word_cache) < 100_000:
                    self._word_cache[piece] = cached
            ids.extend(cached)
        return ids

    def _bpe(self, word: str) -> list[str]:
        symbols = list(word)
        while len(symbols) > 1:
            best_rank, best_at = None, -1
            for i in range(len(symbols) - 1):
                rank = self._ranks.get((symbols[i], symbols[i + 1]))
                if rank is not None and (best_rank is None or rank < best_rank):
                    best_rank, best_at = rank, i
            if best_rank is None:
                break
            pair = (symbols[best_at], symbols[best_at + 1])
            merged: list[str] = []
            i = 0
            while i < len(symbols):
                if i < len(symbols) - 1 and (symbols[i], symbols[i + 1]) == pair:
                    merged.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return symbols


_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


def default_system_prompt(chat_template: str) -> str | None:
    """The system message a ChatML template inserts when the chat has none (SmolLM2 has one)."""
    found = _DEFAULT_SYSTEM.search(chat_template)
    return found.group(1) if found else None


def render_chat(
    messages: Sequence[ChatMessage],
    default_system: str | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, as SmolLM2's template."""
    parts: list[str] = []
    if default_system is not None and (not messages or messages[0].role != "system"):
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    parts.extend(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages)
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)
