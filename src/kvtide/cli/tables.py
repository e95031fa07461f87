"""Result tables that fit the terminal: a table too wide for the console is split into several,
each repeating the key columns (router, policy, design), so no name is ever cut and no cell is
squeezed into an ellipsis. Every command's table goes through ``print_table``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    """May hold a line break: two short lines keep a numeric column narrow."""
    group: str = ""
    """Columns of one group stay in one table when the table has to be split."""
    left: bool = False


def make_console(*, stderr: bool = False) -> Console:
    """A console as wide as the terminal; 150 columns when the output is a file or a pipe,
    unless ``COLUMNS`` says otherwise."""
    stream = sys.stderr if stderr else sys.stdout
    wide = stream.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return Console(file=stream, highlight=False, width=None if wide else 150)


def print_table(
    console: Console,
    title: str,
    keys: Sequence[Column],
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    sections: Sequence[bool] = (),
    caption: str | None = None,
) -> None:
    """Prints ``rows`` (key cells, then column cells; rich markup allowed) under ``title``, in
    as many tables as the console's width needs. ``sections[i]`` draws a rule after row i."""
    parts = _split(console, title, keys, columns, rows, sections)
    for i, part in enumerate(parts):
        suffix = f" ({i + 1}/{len(parts)})" if len(parts) > 1 else ""
        console.print(_table(f"{title}{suffix}", keys, part, rows, sections, len(keys)))
    if caption:  # once, under the last part, as wide as the console
        console.print(caption)


def _split(
    console: Console,
    title: str,
    keys: Sequence[Column],
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    sections: Sequence[bool],
) -> list[list[tuple[int, Column]]]:
    indexed = list(enumerate(columns))
    groups: list[list[tuple[int, Column]]] = []
    for item in indexed:
        if groups and groups[-1][-1][1].group == item[1].group and item[1].group:
            groups[-1].append(item)
        else:
            groups.append([item])
    # Greedy by group, then by column inside a group that is too wide on its own.
    parts: list[list[tuple[int, Column]]] = [[]]

    def fits(candidate: list[tuple[int, Column]]) -> bool:
        table = _table(title, keys, candidate, rows, sections, len(keys))
        return _width(console, table) <= console.width

    for group in groups:
        if fits(parts[-1] + group):
            parts[-1] += group
            continue
        if parts[-1]:
            parts.append([])
        for item in group:
            if parts[-1] and not fits([*parts[-1], item]):
                parts.append([])
            parts[-1].append(item)
    return [p for p in parts if p] or [[]]


def _table(
    title: str,
    keys: Sequence[Column],
    part: Sequence[tuple[int, Column]],
    rows: Sequence[Sequence[str]],
    sections: Sequence[bool],
    num_keys: int,
) -> Table:
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
        title_justify="left",
    )
    for key in keys:
        table.add_column(key.header, justify="left", no_wrap=True, overflow="fold")
    for _, column in part:
        table.add_column(column.header, justify="left" if column.left else "right", no_wrap=True)
    for r, row in enumerate(rows):
        cells = [*row[:num_keys], *(row[num_keys + i] for i, _ in part)]
        table.add_row(*cells, end_section=r < len(sections) and sections[r])
    return table


def _width(console: Console, table: Table) -> int:
    unbounded = console.options.update_width(1 << 16)
    return Measurement.get(console, unbounded, table).maximum
