"""Plain tables that fit the terminal and cut nothing (`jobs`, `cost`, `check`).

A table wider than the terminal is made narrower in two ways, in this order: the columns
named in `spill` leave the table, one at a time, and their values follow each row on an
indented line of their own ("created 2025-01-02 03:04Z  removed ..."); then the last column's
text wraps under itself (or, with less than MIN_LAST columns left for it, onto indented lines
below its row). No value is ever shortened.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from collections.abc import Sequence

from provision.operations.status import text_table

MIN_LAST = 20
INDENT = "    "
UNLIMITED = 10**6  # the width of a pipe: nothing wraps


def terminal_width() -> int | None:
    """The width output must fit: $COLUMNS, else the terminal's; None for a pipe or a file
    (whatever reads it gets whole lines)."""
    cols = os.environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def fit_table(rows: Sequence[Sequence[str]], right: set[int] | None = None,
              spill: Sequence[int] = (), width: int | None = None) -> list[str]:
    """`rows` (the header first) as aligned lines no wider than `width` (default: the
    terminal's), as the module docstring says. `right`: right-aligned columns; `spill`: the
    columns that may move to a line of their own, the first to go first. Only the last
    column's cells may hold line breaks (each part starts a line under it)."""
    width = width or terminal_width() or UNLIMITED
    right = right or set()
    keep = list(range(len(rows[0])))
    lines = _lines(rows, keep, right)
    if any("\n" in row[-1] for row in rows):
        lines = [line for row_lines in _wrap_last(rows, keep, right, width) for line in row_lines]
    if _fits(lines, width):
        return lines
    moved: list[int] = []
    for col in spill:
        keep.remove(col)
        moved.append(col)
        if _fits(_lines(rows, keep, right), width):
            break
    return _layout(rows, keep, moved, right, width)


def _fits(lines: list[str], width: int) -> bool:
    return all(len(line) <= width for line in lines)


def _lines(rows: Sequence[Sequence[str]], keep: list[int], right: set[int]) -> list[str]:
    """text_table of the `keep` columns; multi-line cells show their first line."""
    picked = [[row[c].split("\n")[0] for c in keep] for row in rows]
    return text_table(picked, {i for i, c in enumerate(keep) if c in right})


def _layout(rows: Sequence[Sequence[str]], keep: list[int], moved: list[int],
            right: set[int], width: int) -> list[str]:
    kept = _lines(rows, keep, right)
    multiline = any("\n" in row[keep[-1]] for row in rows)
    per_row = [[line] for line in kept] if _fits(kept, width) and not multiline else \
        _wrap_last(rows, keep, right, width)
    out: list[str] = []
    for n, (row, lines) in enumerate(zip(rows, per_row, strict=True)):
        out += lines
        pairs = [f"{rows[0][c].lower()} {row[c]}" for c in sorted(moved) if row[c]]
        if pairs and n > 0:  # each moved value is named: the header row needs no line
            out += [INDENT + line for line in _pack(pairs, width - len(INDENT))]
    return out


def _wrap_last(rows: Sequence[Sequence[str]], keep: list[int], right: set[int],
               width: int) -> list[list[str]]:
    """Each row's lines: the last column's text wrapped under itself, or below the row."""
    last = keep[-1]
    if len(keep) > 1:
        head = _lines(rows, keep[:-1], right)
        start = max(len(h) for h in head) + 2
    else:
        head, start = [""] * len(rows), 0
    out: list[list[str]] = []
    for row, prefix in zip(rows, head, strict=True):
        room = width - start
        if room >= MIN_LAST:
            wrapped = _wrap(row[last], room)
            lines = [(prefix.ljust(start) + wrapped[0]).rstrip()]
            lines += [" " * start + w for w in wrapped[1:]]
        else:
            lines = [prefix.rstrip()] + [INDENT + w for w in _wrap(row[last], width - len(INDENT))]
        out.append(lines)
    return out


def _pack(items: list[str], room: int) -> list[str]:
    """`items` two spaces apart, in lines of at most `room` characters where each fits; an
    item is never split unless it alone is longer than a line."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= room:
            lines[-1] += "  " + item
        else:
            lines += _wrap(item, room)
    return lines


def _wrap(text: str, room: int) -> list[str]:
    """`text` in lines of at most `room` characters; its own line breaks kept."""
    out: list[str] = []
    for part in text.split("\n"):
        out += textwrap.wrap(part, room, break_on_hyphens=False) or [""]
    return out


def fit_lines(text: str, width: int | None = None) -> str:
    """Free text (a report's lines) made to fit `width` (default: the terminal's): a longer
    line wraps, its continuation indented under the line's own text."""
    width = width or terminal_width() or UNLIMITED
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(line.strip(), width, initial_indent=lead,
                             subsequent_indent=lead + INDENT, break_on_hyphens=False)
    return "\n".join(out)
