"""The default log sink of the tool's steps: one line to stderr, flushed at once (so lines
of parallel steps and of the job's own output interleave in the order they happen)."""

from __future__ import annotations

import sys
from collections.abc import Callable

Log = Callable[[str], None]


def stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
