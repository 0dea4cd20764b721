"""Byte sinks the node-side commands write a job's output to (remote/jobs.py)."""

from __future__ import annotations

from typing import Protocol


class Sink(Protocol):
    def write(self, data: bytes, /) -> int: ...

    def flush(self) -> None: ...


class LineEnd:
    """`out`, knowing whether what was written so far ends with a whole line (the end line
    must not be glued to a last line the job left unterminated)."""

    def __init__(self, out: Sink) -> None:
        self.out = out
        self.ended = True

    def write(self, data: bytes) -> int:
        if data:
            self.ended = data.endswith(b"\n")
        return self.out.write(data)

    def flush(self) -> None:
        self.out.flush()
