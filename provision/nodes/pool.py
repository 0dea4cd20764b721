"""The one thread pool of the controller, and the small waiting helpers around it."""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")
U = TypeVar("U")
MAX_WORKERS = 32


def fan_out(items: Iterable[U], fn: Callable[[U], T], *, streaming: bool = False) -> list[T]:
    """fn(item) for every item in parallel (results in order). The one thread pool of the
    controller: exceptions propagate (the first, after every call has ended). At most
    MAX_WORKERS at a time, unless `streaming`: calls that last as long as a job (following
    its output) each get a thread of their own (item 33 must not wait for one to end), and
    a Ctrl-C (or any exception in the waiting thread) returns at once, leaving those calls
    to end with the process: waiting for them would swallow the user's first Ctrl-C."""
    items = list(items)
    if not items:
        return []
    if streaming:
        futures = [background(functools.partial(fn, item)) for item in items]
        wait(futures)  # a Ctrl-C raises here, in the caller's thread
        return [fut.result() for fut in futures]
    with ThreadPoolExecutor(max_workers=min(MAX_WORKERS, len(items))) as pool:
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


# What bootstrap needs to reach nodes: Fabric and paramiko, ~0.2 s of imports.
SSH_STACK = ("provision.nodes.bootstrap", "provision.nodes.sshconn", "fabric")
_ssh_stack_started = threading.Event()
_provider_waits = threading.Event()


def import_ssh_stack_while_waiting() -> None:
    """The SSH stack imported on a thread of its own (once per process) as soon as the
    provider says that it waits on its API or engine (`provider_waits`). The pipeline asks
    for it before `create` when a bootstrap follows. Sooner, the imports would share the
    interpreter with the provider's own work before that call and delay it (docker: the
    containers came 0.15 s after the network when the imports began with `create`). A
    provider that never says so loses nothing but time: bootstrap imports them itself."""
    if _ssh_stack_started.is_set():
        return
    _ssh_stack_started.set()

    def load() -> None:
        _provider_waits.wait()
        for module in SSH_STACK:
            importlib.import_module(module)

    threading.Thread(target=load, daemon=True).start()


def provider_waits() -> None:
    """Said by a provider where it next waits on its API or engine (docker: once its
    containers' creation is sent; the clouds: as they begin, their nodes take minutes)."""
    _provider_waits.set()


def poll(check: Callable[[], bool], deadline_s: float, interval_s: float = 5.0) -> bool:
    """True as soon as `check()` is; False when the deadline passes."""
    end = time.monotonic() + deadline_s
    while True:
        if check():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(interval_s)
