"""Text of a growing sequence of token ids, one piece per token, at a cost per token that does
not grow with the sequence: vLLM's incremental detokenization (its ``prefix_offset`` and
``read_offset``). Decoding the whole output at every token, as the real-model backend did,
made a long output quadratic (190 us a token at 2,048 tokens of SmolLM2's).

Each step decodes only the ids from ``prefix_offset`` on, and the same ids up to
``read_offset`` (the text already handed out from that window); the difference is the new
piece. A piece whose decoded text ends in U+FFFD (a character whose bytes span tokens) waits
for the token that completes it; ``rest`` gives what still waits when the sequence ends.
``prefix_offset`` only ever lands where the text decoded so far is whole, so a window never
starts inside a character.
"""

from __future__ import annotations

from kvtide.text.tokenizer import Tokenizer

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    __slots__ = ("_ids", "_prefix_offset", "_read_offset", "skip_special_tokens", "tokenizer")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_id: int) -> str:
        """The text ``token_id`` adds (empty while a character waits for its next bytes, or
        for a special token that is skipped)."""
        self._ids.append(token_id)
        before, now = self._window()
        if len(now) <= len(before) or now.endswith(_INCOMPLETE):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return now[len(before) :]

    def rest(self) -> str:
        """At the end: what is still held back (a character whose bytes never completed,
        decoded as U+FFFD, as decoding the whole sequence gives it)."""
        before, now = self._window()
        self._prefix_offset = self._read_offset = len(self._ids)
        return now[len(before) :]

    def _window(self) -> tuple[str, str]:
        """The window's text as handed out so far, and with every id received."""
        ids, start, skip = self._ids, self._prefix_offset, self.skip_special_tokens
        decode = self.tokenizer.decode
        return decode(ids[start : self._read_offset], skip), decode(ids[start:], skip)
