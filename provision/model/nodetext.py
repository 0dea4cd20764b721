"""A node's output as lines, and as a person is shown it: the ONE splitter and the ONE
escaping of everything a node prints (its job's output, a failed command's tail, a pod's log).

    split_lines(buffer) -> (complete lines, the unfinished rest)   `\\n` ends a line, nothing else
    lines(text)         -> every line (an unfinished last one included)
    read_lines(path)    -> a saved log's lines, the same way
    shown(line)         -> the line with every control character, escape sequence, line or
                           paragraph separator and bidirectional override escaped

Stored and printed the same way: `str.splitlines` also ends a line at `\\r`, `\\x0b`, `\\x0c`,
`\\x1c`-`\\x1e`, `\\x85`, `\\u2028` and `\\u2029`, so a node line holding one of them would show as
a line of its own without the node's `[node-R] ` prefix (a forged `[controller] ...` line,
passing `logs --node N`). Escape sequences would reach the terminal (clear the screen, move
the cursor over the tool's own lines, set the window title).

A carriage return inside a line is what a progress bar redraws with: the line shows its last
non-empty part, as a terminal would (and the node's prefix stays). Escaping leaves no control
character behind, so `shown(shown(x)) == shown(x)`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

# C0 but tab, DEL, C1; line and paragraph separators; bidirectional controls (Trojan Source)
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f"
                     "\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(line: str) -> str:
    """`line` as a person is shown it: no control character, escape sequence, separator or
    bidirectional override left (each written as `\\xNN` / `\\uNNNN`); after a carriage
    return only the last non-empty part."""
    if "\r" in line:
        parts = [p for p in line.split("\r") if p]
        line = parts[-1] if parts else ""
    return _UNSAFE.sub(_escape, line)


def split_lines(buffer: str) -> tuple[list[str], str]:
    """(the complete lines of `buffer`, what follows the last `\\n`); a `\\r\\n` ends a line
    as `\\n` does."""
    *complete, rest = buffer.split("\n")
    return [c.removesuffix("\r") for c in complete], rest


def lines(text: str) -> list[str]:
    """Every line of `text` (split on `\\n` only), an unfinished last one included."""
    complete, rest = split_lines(text)
    return complete + [rest] if rest else complete


def read_lines(path: Path) -> Iterator[str]:
    """The lines of a saved log (a node's, copied here), split as `lines` does; bytes that
    are not UTF-8 become U+FFFD."""
    with path.open(encoding="utf-8", errors="replace", newline="\n") as fh:
        for line in fh:
            yield line.removesuffix("\n").removesuffix("\r")
