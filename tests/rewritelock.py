"""One test worker rewrites a test module's asserts; the others wait for its cached copy.

pytest rewrites every test module's asserts on import and keeps the result as bytecode in
__pycache__ (written atomically, so concurrent runs never read half a file). On a fresh clone
no copy exists yet, and the workers of `make test` (pytest-xdist: each collects every test
file, in the same order, at the same moment) each rewrote all ~200 modules: 4.3 CPU-s of a
worker's 7.4 s collection, four times over. Here the first worker to miss a module's copy
holds a lock file beside it while it rewrites and writes it; a worker that misses it meanwhile
waits for the lock, then reads the copy. Waiting is bounded (WAIT_S, then it rewrites for
itself, as before), so a worker that dies holding a lock (the kernel releases it anyway) or a
folder that cannot hold one never stops collection.

pytest's rewrite hook (_pytest/assertion/rewrite.py AssertionRewritingHook.exec_module) calls
three functions of its module by name, in this order, for one module at a time: `_read_pyc`
(the copy, or None), then on a miss `_rewrite_test` and, where bytecode may be written,
`_write_pyc`. Those are wrapped; pyproject.toml pins the pytest they are read from.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Any

from _pytest.assertion import rewrite

WAIT_S = 60.0
_held: list[int] = []  # the lock of the module this worker is rewriting now (one at a time)


def _release() -> None:
    while _held:
        fd = _held.pop()
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _lock(pyc: Path) -> int | None:
    """The module's lock, held; None where it cannot be made or is not given within WAIT_S."""
    try:
        fd = os.open(f"{pyc}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None
    end = time.monotonic() + WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= end:
                os.close(fd)
                return None
            time.sleep(0.02)


def install() -> None:
    read, rewrite_test, write = rewrite._read_pyc, rewrite._rewrite_test, rewrite._write_pyc

    def read_or_lock(source: Path, pyc: Path, trace: Any = lambda _: None) -> Any:
        _release()  # a module whose copy could not be written (its folder read-only)
        co = read(source, pyc, trace)
        if co is not None or sys.dont_write_bytecode:
            return co
        fd = _lock(pyc)
        if fd is not None:
            _held.append(fd)
        co = read(source, pyc, trace)  # written by the worker that held the lock
        if co is not None:
            _release()
        return co

    def rewrite_or_release(fn: Path, config: Any) -> Any:
        try:
            return rewrite_test(fn, config)
        except BaseException:
            _release()
            raise

    def write_then_release(*args: Any) -> Any:
        try:
            return write(*args)
        finally:
            _release()

    rewrite._read_pyc = read_or_lock
    rewrite._rewrite_test = rewrite_or_release
    rewrite._write_pyc = write_then_release
