"""A node's streamed output as lines: `[node-R] line` on the terminal, kept for the diagnosis
(job/cause.py), muted after a stop the user asked for. Split and shown the one way
(model/nodetext.py): `\n` ends a line, and what is printed has its control characters and
escape sequences escaped (the lines kept for the diagnosis are as the node sent them)."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

from provision.model.nodetext import shown, split_lines


class PrefixWriter:
    """File-like sink: splits a node's output into lines and prints `[node-R] line`. `take`
    may consume a line instead (the in-job fabric gate keeps its own lines)."""

    def __init__(self, node: str, out: TextIO, lock: threading.Lock, keep: int = 4000,
                 on_line: Callable[[str], None] | None = None,
                 take: Callable[[str], bool] | None = None,
                 journal: deque[str] | None = None,
                 on_show: Callable[[], None] | None = None) -> None:
        self.prefix = f"[{node}] "
        self.out = out
        self.lock = lock
        self.buf = ""
        self.lines: deque[str] = deque(maxlen=keep)
        self.on_line = on_line
        self.take = take
        self.journal = journal  # every node's lines, prefixed, in the order they arrived
        self.muted = False  # after a stop the user asked for: kept, not printed
        self.on_show = on_show  # called before lines are printed

    def write(self, data: str) -> int:
        complete, self.buf = split_lines(self.buf + data)
        if complete:
            self.show([line for line in complete if self.take is None or not self.take(line)])
            if self.on_line is not None:
                for line in complete:
                    self.on_line(line)
        return len(data)

    def show(self, lines: list[str]) -> None:
        """Print `lines` with the node's prefix (and keep them for the diagnosis)."""
        if not lines:
            return
        if self.on_show is not None:
            self.on_show()
        with self.lock:
            for line in lines:
                self.lines.append(line)
                if self.journal is not None:
                    self.journal.append(self.prefix + line)
                if not self.muted:
                    self.out.write(self.prefix + shown(line) + "\n")
            self.out.flush()

    def flush(self) -> None:
        """Called by Fabric between chunks: a partial line waits for the rest."""

    def finish(self) -> None:
        if self.buf:
            self.write("\n")
