"""The same ids as a Hugging Face byte-level BPE backend, 4-10x faster, through ``tiktoken``.

``tiktoken`` splits text with one regex and merges each piece's bytes by the rank of the merged
token; Hugging Face merges by the rank of the pair in its merges list. ``build(backend)`` takes
the tokenizer apart (its JSON) and returns a ``FastBpe`` only when the two provably agree on it,
else raises ``NotExactError`` naming what differs (the caller keeps Hugging Face):

- model: BPE, no dropout, no unknown token, no subword prefix or suffix, no byte fallback, no
  ``ignore_merges``. A byte missing from the vocabulary (SmolLM2 lacks some control characters
  and the lead bytes of unassigned planes) Hugging Face drops, joining its neighbours: the
  fast encoder gives it a placeholder id and ``encode`` answers None for such a text (the
  caller asks Hugging Face);
- merges: each merge's result is in the vocabulary and the results' ids rise with the merges'
  order (so "lowest merged id" and "earliest merge" pick the same pair);
- every merge result, tokenized alone by the backend's own model, comes back as itself. Then
  ``tiktoken`` can never merge a pair the merges list lacks: such a pair (x, y) adjacent in a
  piece, with x+y no later than the backend's next merge, means the merges inside the span of
  x+y ran as they would on x+y alone and stopped at [x, y], and x+y alone would not give itself;
- pre-tokenizer: ByteLevel(add_prefix_space=False, use_regex=True), optionally after
  Digits(individual_digits=True), or an isolating Split regex then ByteLevel without its regex;
  each turned into one ``tiktoken`` pattern (the digit split becomes ``\\p{N}`` pieces and a
  whitespace run before a digit ending its piece, ``\\s+(?=\\p{N})``);
- no normalizer, no truncation or padding; added tokens without lstrip / rstrip / single_word,
  matched as the backend does (leftmost-longest, those not ``normalized`` first); a
  post-processor that only adds fixed special ids around the text (TemplateProcessing,
  ByteLevel).

Where whitespace comes one character at a time, a second ``tiktoken`` encoding whose pattern
lacks the whitespace lookaheads gives the same pieces (there every whitespace run is one
character, which the lookaheads split exactly as plain ``\\s+`` does), and fancy-regex runs a
lookahead-free pattern 2-3x faster. A text with runs of two or more (paragraph breaks, a
message that starts with a space after the chat template's newline, indented code) is cut
around each run: the run and the non-whitespace after it go through the full pattern, the
rest through the fast one. The cuts are exact because no piece of either supported pattern
holds a non-whitespace character followed by a whitespace one (whitespace only opens a letter,
number or punctuation piece), so every such pair is a piece boundary in the whole text, and
the pieces after a boundary depend only on the text after it (lookaheads, no lookbehinds).
Tests: ``tests/unit/text/test_fast_bpe.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import tiktoken

from kvtide.text.gguf_tokenizer import bytes_to_unicode

_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_DIGITS_THEN_GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?=\p{N})|\s+(?!\S)|\s+"""
)


MISSING_BYTE_ID = 2**31
"""Placeholder ids from here up stand for bytes the vocabulary lacks (tiktoken needs all 256)."""

# What the lookahead-free pattern drops, per supported pattern.
_LOOKAHEADS = {_GPT2_PATTERN: r"|\s+(?!\S)", _DIGITS_THEN_GPT2_PATTERN: r"|\s+(?=\p{N})|\s+(?!\S)"}
_ASCII_WHITESPACE = b" \t\n\x0b\x0c\r"
# UTF-8 of the other characters of Unicode's White_Space (what ``\s`` is in tiktoken's regex)
_OTHER_WHITESPACE_UTF8 = re.compile(
    rb"\xc2[\x85\xa0]|\xe1\x9a\x80|\xe2\x80[\x80-\x8a\xa8\xa9\xaf]|\xe2\x81\x9f|\xe3\x80\x80"
)
# in the marks of a text's bytes (``FastBpe._byte_marks``: ASCII whitespace is b" "), a run of
# two or more and the non-whitespace after it, up to the next boundary (see above)
_RUN_AND_NEXT = re.compile(rb" {2,}[^ ]*")
# Runs closer together than this on average (indented code) take the full pattern for the whole
# text: each cut costs two more tiktoken calls. Measured on 3,000 words of prose, the full
# pattern's time over the cut one's with a paragraph break every 128 bytes: 1.04x, 256: 1.23x,
# 1,024: 1.44x; code with a run every ~20 bytes was 0.8x cut
_MIN_BYTES_PER_RUN = 256

# a cut (``FastBpe.cut``): a printable ASCII character other than the space, then a space
_CUT_AFTER = re.compile(r"[!-~](?= )")

NEVER_SPECIAL = "<|kvtide:never-allowed|>"
"""The one special token of the ``tiktoken`` encodings, never allowed (met in a text, it is
ordinary text). ``encode_to_numpy`` writes ids into a buffer, where ``encode_ordinary`` builds
a list that costs ~18 ns an id more to turn into an array; but with no special token at all
tiktoken's special-token search made that path ~3.4x slower than the whole encode (2k tokens:
690 us, against 203 for ``encode_ordinary`` and 190 with this token)."""

ARRAY_CHARS = 512
"""Pieces this long or longer go through ``encode_to_numpy``; shorter ones through
``encode_ordinary``, gathered into one list. The buffer costs ~1.5 us more a call than the
list (0.5 us), which its ~18 ns an id saved repays from ~100 tokens up."""

Ids = npt.NDArray[np.int32]
"""Token ids as ``encode_ids`` gives them."""


def encoding(name: str, pattern: str, ranks: dict[bytes, int]) -> tiktoken.Encoding:
    """A ``tiktoken`` encoding of ``ranks`` under ``pattern``, with ``NEVER_SPECIAL``."""
    return tiktoken.Encoding(
        name,
        pat_str=pattern,
        mergeable_ranks=ranks,
        special_tokens={NEVER_SPECIAL: MISSING_BYTE_ID - 1},
    )


class _IdsOut:
    """A text's ids as its pieces come: short pieces' lists joined in one list, long pieces'
    arrays (``as_arrays``) kept apart, concatenated once at the end."""

    __slots__ = ("arrays", "as_arrays", "ints")

    def __init__(self, as_arrays: bool) -> None:
        self.as_arrays = as_arrays
        self.ints: list[int] = []
        self.arrays: list[npt.NDArray[np.uint32]] = []

    def add(self, enc: tiktoken.Encoding, text: str) -> None:
        if self.as_arrays and len(text) >= ARRAY_CHARS:
            self._flush()
            self.arrays.append(enc.encode_to_numpy(text, disallowed_special=()))
        else:
            self.ints += enc.encode_ordinary(text)

    def _flush(self) -> None:
        if self.ints:
            self.arrays.append(np.fromiter(self.ints, dtype=np.uint32, count=len(self.ints)))
            self.ints = []

    def to_list(self) -> list[int]:
        """The ids gathered with ``as_arrays`` off (all in ``ints``)."""
        assert not self.arrays
        return self.ints

    def to_array(self) -> Ids:
        self._flush()
        arrays = self.arrays
        if len(arrays) == 1:
            return arrays[0].view(np.int32)
        if not arrays:
            return np.zeros(0, dtype=np.int32)
        return np.concatenate(arrays).view(np.int32)


class NotExactError(ValueError):
    """The backend has a shape the fast encoder does not reproduce exactly."""


def _byte_level_regex(spec: Mapping[str, Any], use_regex: bool) -> None:
    if spec.get("type") != "ByteLevel":
        raise NotExactError(f"pre-tokenizer {spec.get('type')!r} is not ByteLevel")
    if spec.get("add_prefix_space"):
        raise NotExactError("ByteLevel adds a prefix space")
    if bool(spec.get("use_regex", True)) != use_regex:
        raise NotExactError(f"ByteLevel use_regex is not {use_regex}")


def pattern_of(pre_tokenizer: Mapping[str, Any] | None) -> str:
    """The one ``tiktoken`` pattern that splits text as ``pre_tokenizer`` does."""
    if pre_tokenizer is None:
        raise NotExactError("no pre-tokenizer")
    if pre_tokenizer.get("type") == "ByteLevel":
        _byte_level_regex(pre_tokenizer, use_regex=True)
        return _GPT2_PATTERN
    steps = pre_tokenizer.get("pretokenizers")
    if pre_tokenizer.get("type") != "Sequence" or not isinstance(steps, list) or len(steps) != 2:
        raise NotExactError(f"pre-tokenizer {pre_tokenizer.get('type')!r} is not supported")
    first, second = steps
    if first.get("type") == "Digits" and first.get("individual_digits") is True:
        _byte_level_regex(second, use_regex=True)
        return _DIGITS_THEN_GPT2_PATTERN
    if first.get("type") == "Split":
        regex = first.get("pattern", {}).get("Regex")
        if not isinstance(regex, str):
            raise NotExactError("Split on a string, not a regex")
        if first.get("behavior") != "Isolated" or first.get("invert"):
            raise NotExactError("Split is not isolated, or inverted")
        _byte_level_regex(second, use_regex=False)
        return regex
    raise NotExactError(f"pre-tokenizer {first.get('type')!r} then ByteLevel is not supported")


def _check_model(model: Mapping[str, Any]) -> None:
    if model.get("type") != "BPE":
        raise NotExactError(f"model {model.get('type')!r} is not BPE")
    for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            raise NotExactError(f"BPE {key} is set")
    for key in ("byte_fallback", "ignore_merges", "fuse_unk"):
        if model.get(key):
            raise NotExactError(f"BPE {key} is on")


def _merge_ranks(backend: Any, model: Mapping[str, Any]) -> dict[bytes, int]:
    """Byte strings -> ids of the tokens the backend's merges can make, checked as the module
    docstring says."""
    vocab: dict[str, int] = model["vocab"]
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    results: list[int] = []
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        result = vocab.get(left + right)
        if result is None or left not in vocab or right not in vocab:
            raise NotExactError(f"merge {left!r} {right!r} makes a token not in the vocabulary")
        if results and result <= results[-1]:
            raise NotExactError(f"merge {left!r} {right!r}: ids are not in the merges' order")
        results.append(result)
    id_to_token = {i: t for t, i in vocab.items()}
    bpe = backend.model
    for result in results:
        token = id_to_token[result]
        alone = bpe.tokenize(token)
        if len(alone) != 1 or alone[0].id != result:
            raise NotExactError(f"token {token!r} alone does not tokenize to itself")
    table = str.maketrans({c: chr(b) for c, b in to_byte.items()})
    ranks = {id_to_token[i].translate(table).encode("latin-1"): i for i in results}
    for c, b in to_byte.items():
        ranks[bytes([b])] = vocab.get(c, MISSING_BYTE_ID + b)
    return ranks


def _post_processor_ids(spec: Mapping[str, Any] | None) -> tuple[list[int], list[int]]:
    """The ids ``add_special_tokens=True`` puts before and after a single text."""
    if spec is None or spec.get("type") == "ByteLevel":
        return [], []
    if spec.get("type") == "Sequence":
        before: list[int] = []
        after: list[int] = []
        for step in spec.get("processors", []):
            b, a = _post_processor_ids(step)
            before, after = b + before, after + a
        return before, after
    if spec.get("type") != "TemplateProcessing":
        raise NotExactError(f"post-processor {spec.get('type')!r} is not supported")
    specials = spec.get("special_tokens", {})
    before, after = [], []
    seen_text = False
    for item in spec.get("single", []):
        if "Sequence" in item:
            if seen_text or item["Sequence"].get("id") != "A":
                raise NotExactError("TemplateProcessing single is not one $A")
            seen_text = True
        elif "SpecialToken" in item:
            ids = specials.get(item["SpecialToken"].get("id"), {}).get("ids")
            if not isinstance(ids, list):
                raise NotExactError("TemplateProcessing names an unknown special token")
            (after if seen_text else before).extend(int(i) for i in ids)
        else:
            raise NotExactError("TemplateProcessing has an item of an unknown kind")
    if not seen_text:
        raise NotExactError("TemplateProcessing single has no $A")
    return before, after


def _added_token_regex(tokens: Iterable[str]) -> re.Pattern[str] | None:
    """Leftmost-longest over ``tokens``: longest first in the alternation."""
    ordered = sorted(set(tokens), key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in ordered)) if ordered else None


class FastBpe:
    """Ids of a text as the backend's ``encode`` gives them; build with ``build(backend)``."""

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        added_to_id: Mapping[str, int],
        raw_added: re.Pattern[str] | None,
        normalized_added: re.Pattern[str] | None,
        special_ids: tuple[list[int], list[int]],
        missing_bytes: bytes = b"",
        single_space_encoding: tiktoken.Encoding | None = None,
    ) -> None:
        self.encoding = encoding
        self.single_space_encoding = single_space_encoding
        """The same ranks under the pattern without its whitespace lookaheads (~3x faster), for
        a text with no two whitespace characters in a row: there a whitespace run is one
        character and every lookahead alternative matches what plain ``\\s+`` does."""
        self._byte_marks = bytes(
            ord("!") if b in missing_bytes else ord(" ") if b in _ASCII_WHITESPACE else ord("x")
            for b in range(256)
        )
        self.added_to_id = dict(added_to_id)
        self._raw = raw_added
        self._normalized = normalized_added
        self.before_ids, self.after_ids = special_ids
        self.cuts = single_space_encoding is not None and not any(
            c.isspace() for token in self.added_to_id for c in token
        )
        """Whether ``cut`` can split a text: the pattern is one of the GPT-2 ones (whose pieces
        never hold a non-whitespace character followed by whitespace, see the module
        docstring) and no added token holds whitespace (so none spans a cut)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int] | None:
        """The ids, or None when ``text`` holds a byte the vocabulary lacks."""
        out = self._encode(text, add_special_tokens, as_arrays=False)
        return None if out is None else out.to_list()

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> Ids | None:
        """``encode`` as an int32 array: long pieces written into it by tiktoken, with no
        list in between (``ARRAY_CHARS``)."""
        out = self._encode(text, add_special_tokens, as_arrays=True)
        return None if out is None else out.to_array()

    def cut(self, text: str, start: int) -> int | None:
        """The first index from ``start`` on where ``text`` can be cut in two whose ids,
        each encoded alone (no special tokens added), are the whole text's: a space after a
        printable ASCII character. There every supported pattern ends a piece (the module
        docstring), added tokens hold no whitespace (``cuts``), and the pieces after the cut
        depend only on the text after it. None: no such index (or ``cuts`` is off)."""
        if not self.cuts:
            return None
        found = _CUT_AFTER.search(text, max(start - 1, 0))
        return None if found is None else found.end()

    def _encode(self, text: str, add_special_tokens: bool, as_arrays: bool) -> _IdsOut | None:
        try:
            raw = text.encode()
        except UnicodeEncodeError:  # a lone surrogate: Hugging Face's to refuse
            return None
        marks = raw.translate(self._byte_marks)
        if b"!" in marks:
            return None
        out = _IdsOut(as_arrays)
        if add_special_tokens:
            out.ints += self.before_ids
        fast = self.single_space_encoding
        if fast is None:
            ordinary = self._full
        elif b"  " not in marks and (text.isascii() or not _OTHER_WHITESPACE_UTF8.search(raw)):
            ordinary = self._fast
        else:
            ordinary = self._around_runs
        self._split(out, ordinary, text, self._raw, self._normalized)
        if add_special_tokens:
            out.ints += self.after_ids
        return out

    def _full(self, out: _IdsOut, text: str) -> None:
        out.add(self.encoding, text)

    def _fast(self, out: _IdsOut, text: str) -> None:
        assert self.single_space_encoding is not None
        out.add(self.single_space_encoding, text)

    def _around_runs(self, out: _IdsOut, text: str) -> None:
        """Ids of ordinary text that has whitespace runs: each run with the non-whitespace
        after it through the full pattern, what lies between through the fast one. Runs are
        found in the bytes (``bytes.find`` is ~6x faster than a regex scan of the text); a cut
        falls on an ASCII whitespace byte, so every part decodes whole. A text with other
        White_Space characters (no-break spaces, ideographic ones), or with runs closer than
        ``_MIN_BYTES_PER_RUN`` on average, takes the full pattern."""
        fast = self.single_space_encoding
        assert fast is not None
        full = self.encoding
        raw = text.encode()
        if not text.isascii() and _OTHER_WHITESPACE_UTF8.search(raw):
            out.add(full, text)
            return
        marks = raw.translate(self._byte_marks)
        if marks.count(b"  ") * _MIN_BYTES_PER_RUN > len(marks):
            out.add(full, text)
            return
        start = 0
        while (at := marks.find(b"  ", start)) >= 0:
            run = _RUN_AND_NEXT.match(marks, at)
            assert run is not None
            if at > start:
                out.add(fast, raw[start:at].decode())
            out.add(full, raw[at : run.end()].decode())
            start = run.end()
        if start < len(raw):
            out.add(fast, raw[start:].decode() if start else text)

    def _split(
        self,
        out: _IdsOut,
        ordinary: Callable[[_IdsOut, str], None],
        text: str,
        pattern: re.Pattern[str] | None,
        then: re.Pattern[str] | None,
    ) -> None:
        """Added tokens out first (those matched on the raw text, then the normalized ones in
        what is left, as the backend does), the text between them through ``ordinary``."""
        if pattern is None:
            if then is None:
                if text:
                    ordinary(out, text)
            else:
                self._split(out, ordinary, text, then, None)
            return
        start = 0
        for found in pattern.finditer(text):
            if found.start() > start:
                self._split(out, ordinary, text[start : found.start()], then, None)
            out.ints.append(self.added_to_id[found.group()])
            start = found.end()
        if start < len(text):
            self._split(out, ordinary, text[start:], then, None)


def build(backend: Any) -> FastBpe:
    """The fast encoder for a ``tokenizers.Tokenizer``, or ``NotExactError`` (see the module
    docstring for what is checked)."""
    spec = json.loads(backend.to_str())
    for key in ("normalizer", "truncation", "padding"):
        if spec.get(key) is not None:
            raise NotExactError(f"the tokenizer has a {key}")
    if getattr(backend, "encode_special_tokens", False):
        raise NotExactError("special tokens are split as text")
    pattern = pattern_of(spec.get("pre_tokenizer"))
    _check_model(spec["model"])
    ranks = _merge_ranks(backend, spec["model"])
    added = spec.get("added_tokens", [])
    for token in added:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            raise NotExactError(f"added token {token['content']!r} strips or is single-word")
    try:
        full = encoding("kvtide", pattern, ranks)
    except ValueError as exc:  # a pattern fancy-regex does not compile
        raise NotExactError(f"tiktoken refuses the pattern: {exc}") from exc
    single_space = None
    if pattern in _LOOKAHEADS:
        single_space = encoding(
            "kvtide-single-space", pattern.replace(_LOOKAHEADS[pattern], ""), ranks
        )
    missing = bytes(b for b in range(256) if ranks[bytes([b])] >= MISSING_BYTE_ID)
    return FastBpe(
        full,
        {t["content"]: int(t["id"]) for t in added},
        _added_token_regex(t["content"] for t in added if not t.get("normalized")),
        _added_token_regex(t["content"] for t in added if t.get("normalized")),
        _post_processor_ids(spec.get("post_processor")),
        missing,
        single_space,
    )
