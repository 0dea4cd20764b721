"""The one thread pool of the controller, and the small waiting helpers around it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")
MAX_WORKERS = 32


def fan_out(items: Iterable[U], fn: Callable[[U], T], *, streaming: bool = False) -> list[T]:
    """fn(item) for every item in parallel (results in order). The one thread pool of the
    controller: exceptions propagate (the first, after every call has ended). At most
    MAX_WORKERS at a time, unless `streaming`: calls that last as long as a job (following
    its output) each need a thread of their own, or item 33 would start only when one ends."""
    items = list(items)
    if not items:
        return []
    workers = len(items) if streaming else min(MAX_WORKERS, len(items))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def background(fn: Callable[[], T]) -> Future[T]:
    """fn() on a thread of its own while the caller goes on (e.g. one engine call that
    overlaps the tool's own work); `.result()` waits and re-raises."""
    fut: Future[T] = Future()

    def target() -> None:
        try:
            fut.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            fut.set_exception(exc)

    threading.Thread(target=target, daemon=True).start()
    return fut


def poll(check: Callable[[], bool], deadline_s: float, interval_s: float = 5.0) -> bool:
    """True as soon as `check()` is; False when the deadline passes."""
    end = time.monotonic() + deadline_s
    while True:
        if check():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(interval_s)
