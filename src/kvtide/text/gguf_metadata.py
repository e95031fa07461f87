"""The key/value metadata of a GGUF file (ggml's format, version 2 and 3), read without its tensors.

A tokenizer needs only this header: reading it ourselves keeps ``kvtide.text`` free of numpy
array parsing and of torch, and takes well under a second for a 49k-token vocabulary where
``gguf.GGUFReader`` takes seconds (it builds a numpy view per array element).
Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable
from pathlib import Path

from kvtide.errors import ConfigError

MAGIC = b"GGUF"
Value = int | float | bool | str | list["Value"]

# value type id -> struct format of one scalar (little-endian, as llama.cpp writes them)
_SCALARS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9


class _Cursor:
    __slots__ = ("at", "buf", "path")

    def __init__(self, buf: bytes | mmap.mmap, path: str) -> None:
        self.buf, self.at, self.path = buf, 0, path

    def take(self, fmt: str) -> int | float | bool:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.buf):
            raise ConfigError(f"{self.path}: GGUF header ends early at byte {self.at}")
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += size
        return value  # type: ignore[no-any-return]

    def string(self) -> str:
        size = int(self.take("<Q"))
        end = self.at + size
        if end > len(self.buf):
            raise ConfigError(f"{self.path}: GGUF string runs past the end at byte {self.at}")
        raw = bytes(self.buf[self.at : end])
        self.at = end
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Value:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = int(self.take("<I")), int(self.take("<Q"))
            read: Callable[[], Value] = (
                self.string if item_kind == _STRING else lambda: self.value(item_kind)
            )
            return [read() for _ in range(count)]
        fmt = _SCALARS.get(kind)
        if fmt is None:
            raise ConfigError(f"{self.path}: unknown GGUF value type {kind} at byte {self.at}")
        return self.take(fmt)


def read_gguf_metadata(path: Path | str) -> dict[str, Value]:
    """Every metadata key of the file (``general.*``, ``tokenizer.*``, ...) with its value."""
    name = str(path)
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cursor = _Cursor(buf, name)
            if bytes(buf[:4]) != MAGIC:
                raise ConfigError(f"{name}: not a GGUF file (magic {bytes(buf[:4])!r})")
            cursor.at = 4
            version = int(cursor.take("<I"))
            if version not in (2, 3):
                raise ConfigError(f"{name}: GGUF version {version} is not supported (2 or 3)")
            cursor.take("<Q")  # tensor count: the tensors are not read here
            num_keys = int(cursor.take("<Q"))
            metadata: dict[str, Value] = {}
            for _ in range(num_keys):
                key = cursor.string()
                metadata[key] = cursor.value(int(cursor.take("<I")))
            return metadata
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot read GGUF: {exc}") from exc
