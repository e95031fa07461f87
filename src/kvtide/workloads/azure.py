"""Azure LLM inference traces (CSV): real arrivals and lengths, with a synthetic prefix structure.

The file (``TIMESTAMP,ContextTokens,GeneratedTokens``) says when requests came and how long they
were, but nothing about shared prefixes. So that the simulator can still use it, the reader
adds a seeded prefix structure that keeps every arrival time and length exactly:

* a few shared system prompts (``system_prompts``, mean ``system_tokens``), chosen by Zipf
  popularity, open each new session (truncated when a request is shorter than its prompt);
* a request continues an open session with probability ``continue_prob`` when one fits: its
  last turn was at most ``session_timeout_s`` ago and its context (that turn's prompt plus
  output) is shorter than the request, which then extends that context with a new message.
  Up to ``candidates`` open sessions are tried at random; otherwise a new session starts.

Requests carry prefix-chained block ids (like Mooncake's) at the block size asked for
(default 16): a synthetic trace's native block size is whatever it was generated at.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO, Final

from kvtide.errors import ConfigError, TraceFormatError
from kvtide.types import Request
from kvtide.workloads.synthetic import lognormal_int, pick, zipf_cum_weights

COLUMNS: Final = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, slots=True)
class AzureRow:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class SyntheticPrefixes:
    """Parameters of the synthetic prefix structure (see the module docstring)."""

    system_prompts: int = 8
    system_tokens: float = 400.0
    zipf: float = 1.0
    continue_prob: float = 0.5
    session_timeout_s: float = 600.0
    candidates: int = 8


def read_azure(
    path: Path,
    *,
    block_tokens: int,
    seed: int = 0,
    prefixes: SyntheticPrefixes = SyntheticPrefixes(),
) -> Iterator[Request]:
    """Yields one request per CSV row, arrivals in seconds from the first row."""
    return add_prefixes(read_rows(path), block_tokens=block_tokens, seed=seed, prefixes=prefixes)


def read_rows(path: Path) -> Iterator[AzureRow]:
    name = str(path)
    try:
        with path.open("rb") as file:
            if file.read(2) == b"\x1f\x8b":
                raise TraceFormatError(name, 1, "a gzip-compressed file; decompress it first")
            file.seek(0)
            reader = csv.reader(_text_lines(file, name))
            header = next(reader, None)
            if header is None or not set(COLUMNS) <= {column.strip() for column in header}:
                raise TraceFormatError(
                    name, 1, f"expected a header with columns {', '.join(COLUMNS)}"
                )
            where = [[column.strip() for column in header].index(column) for column in COLUMNS]
            first: datetime | None = None
            previous_s = 0.0
            for cells in reader:
                line = reader.line_num
                if not cells or not "".join(cells).strip():
                    continue
                try:
                    stamp = datetime.fromisoformat(cells[where[0]].strip())
                    prompt_tokens = int(cells[where[1]])
                    output_tokens = int(cells[where[2]])
                except (IndexError, ValueError) as exc:
                    raise TraceFormatError(name, line, f"bad row {','.join(cells)!r}") from exc
                if first is None:
                    first = stamp
                if (stamp.tzinfo is None) != (first.tzinfo is None):
                    raise TraceFormatError(
                        name, line, "TIMESTAMP mixes times with and without a timezone"
                    )
                arrival_s = (stamp - first).total_seconds()
                if arrival_s < previous_s:
                    raise TraceFormatError(name, line, "TIMESTAMP goes backwards; sort the trace")
                if prompt_tokens < 1 or output_tokens < 0:
                    raise TraceFormatError(
                        name, line, "ContextTokens must be >= 1, GeneratedTokens >= 0"
                    )
                previous_s = arrival_s
                yield AzureRow(arrival_s, prompt_tokens, output_tokens)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read workload: {exc.strerror or exc}") from exc


def _text_lines(file: BinaryIO, name: str) -> Iterator[str]:
    """The file's lines decoded one at a time, as the JSONL readers read theirs
    (``rows.iter_jsonl``): a byte that is not UTF-8 is an error naming its line."""
    for number, line in enumerate(file, start=1):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceFormatError(name, number, "not UTF-8 text") from None


@dataclass(slots=True)
class _Session:
    index: int
    context_ids: list[int]  # ids of the full blocks of the last prompt plus its output
    context_tokens: int
    last_s: float
    turns: int = 0


class _BlockIds:
    """Hands out fresh ids; a fresh id at a position makes the whole prefix from there new."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def take(self, count: int) -> list[int]:
        start = self._next
        self._next += count
        return list(range(start, self._next))


def add_prefixes(
    rows: Iterable[AzureRow],
    *,
    block_tokens: int,
    seed: int = 0,
    prefixes: SyntheticPrefixes = SyntheticPrefixes(),
) -> Iterator[Request]:
    """Gives each row a seeded synthetic prefix; lengths and arrivals stay as they are."""
    rng = random.Random(f"{seed}/azure")
    ids = _BlockIds()
    system_lengths = [
        lognormal_int(rng, prefixes.system_tokens, 0.5) for _ in range(prefixes.system_prompts)
    ]
    system_ids = [ids.take(length // block_tokens) for length in system_lengths]
    system_cum = zipf_cum_weights(prefixes.system_prompts, prefixes.zipf)
    open_sessions: list[_Session] = []
    num_sessions = 0
    for index, row in enumerate(rows):
        session = None
        if rng.random() < prefixes.continue_prob:
            session = _pick(open_sessions, row, prefixes, rng)
        if session is None:
            system = pick(rng, system_cum)
            session = _Session(num_sessions, system_ids[system], 0, row.arrival_s)
            num_sessions += 1
            open_sessions.append(session)
        num_kept = min(len(session.context_ids), row.prompt_tokens // block_tokens)
        num_blocks = -(-row.prompt_tokens // block_tokens)
        block_ids = session.context_ids[:num_kept] + ids.take(num_blocks - num_kept)
        session.turns += 1
        yield Request(
            request_id=str(index),
            arrival_s=row.arrival_s,
            prompt_tokens=row.prompt_tokens,
            output_tokens=row.output_tokens,
            block_tokens=block_tokens,
            block_ids=tuple(block_ids),
            session_id=f"azure-{session.index}",
            extra={"turn": session.turns},
        )
        # The prompt's partial last block, once completed by the output, is new content.
        context_tokens = row.prompt_tokens + row.output_tokens
        num_full = row.prompt_tokens // block_tokens
        session.context_ids = block_ids[:num_full] + ids.take(
            context_tokens // block_tokens - num_full
        )
        session.context_tokens = context_tokens
        session.last_s = row.arrival_s


def _pick(
    open_sessions: list[_Session], row: AzureRow, prefixes: SyntheticPrefixes, rng: random.Random
) -> _Session | None:
    """A random open session whose context fits below the row's prompt; drops stale ones."""
    for _ in range(prefixes.candidates):
        if not open_sessions:
            return None
        slot = int(rng.random() * len(open_sessions))  # randrange costs 4x more
        session = open_sessions[slot]
        if row.arrival_s - session.last_s > prefixes.session_timeout_s:
            open_sessions[slot] = open_sessions[-1]
            open_sessions.pop()
        elif session.context_tokens < row.prompt_tokens:
            return session
    return None
