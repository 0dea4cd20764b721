"""NodeGroup: the only way the controller talks to nodes.

    group = NodeGroup(inv)                          # connections are made lazily and reused
    res = group.run("hostname")                     # every node in parallel, one result each
    res.failed / res.succeeded                      # like Fabric's GroupResult
    group.upload(archive, steps)                    # one channel per node: archive -> stdin
    group.each(fn)                                  # fn(conn, node) on every node, in parallel
    group.subset(nodes).run(...)                    # some nodes, on the same connections
    group.close()

A result for EVERY node is returned, never the first failure only (`GroupResult.raise_for`
names every failed node). The transport is the seam of provision.nodes.transport.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from provision.model.errors import BootstrapError, MgpuError
from provision.model.inventory import Inventory, NodeRecord
from provision.nodes.layout import layout_of
from provision.nodes.pool import fan_out
from provision.nodes.transport import (
    SSH_DEADLINE_S,
    CommandResult,
    Connector,
    NodeConnection,
    default_connector,
    describe_exception,
    retry_open,
)

T = TypeVar("T")


@dataclass
class NodeResult(Generic[T]):
    """What happened on one node: `value` when the step ran, `error` when it could not."""

    node: NodeRecord
    value: T | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        if self.error is not None:
            return False
        return bool(getattr(self.value, "ok", True))

    def why(self) -> str:
        """One line saying why the node failed."""
        if self.error is not None:
            return self.error
        if isinstance(self.value, CommandResult):
            return f"exit {self.value.exit_code}: {self.value.tail()}"
        return "failed"


class GroupResult(dict[str, NodeResult[T]]):
    """node name -> NodeResult, in rank order."""

    @property
    def succeeded(self) -> list[NodeResult[T]]:
        return [r for r in self.values() if r.ok]

    @property
    def failed(self) -> list[NodeResult[T]]:
        return [r for r in self.values() if not r.ok]

    def raise_for(self, what: str, error: type[MgpuError] = BootstrapError,
                  hint: str | None = None) -> None:
        """`error` naming EVERY failed node, if any failed."""
        failed = self.failed
        if not failed:
            return
        detail = "\n  ".join(f"{r.node.name}: {r.why()}" for r in failed)
        raise error(
            f"{what} failed on {len(failed)} of {len(self)} node(s):\n  {detail}",
            hint=hint or "`mgpu-cloud status` shows the nodes; `mgpu-cloud ssh NAME --node R` "
            "to look",
        )


class NodeGroup:
    """Parallel operations on a cluster's nodes (all, or the `nodes` given), one result per
    node. Connections are made on first use and reused until `close()`; use as a context
    manager. Thread-safe per node (each node's connection is used by one thread at a time)."""

    def __init__(self, inv: Inventory, nodes: Iterable[NodeRecord] | None = None, *,
                 connector: Connector | None = None) -> None:
        self.inv = inv
        self.nodes = sorted(inv.nodes if nodes is None else nodes, key=lambda n: n.rank)
        self.layout = layout_of(inv)
        self.connector = connector or default_connector(inv)
        self._conns: dict[str, NodeConnection] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._owner: NodeGroup | None = None  # subset(): whose connections these are

    def __enter__(self) -> NodeGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subset(self, nodes: Iterable[NodeRecord]) -> NodeGroup:
        """A group of `nodes` (any of the cluster's, not only this group's) on this group's
        connections: an open one is used, a missing one is made here and kept here, and
        only this group closes them (a recovery logs in to each node once, not once per
        step: issue 44)."""
        sub = NodeGroup(self.inv, nodes, connector=self.connector)
        sub._owner = self._owner or self
        return sub

    def connection(self, node: NodeRecord) -> NodeConnection:
        if self._owner is not None:
            return self._owner.connection(node)
        conn = self._conns.get(node.name)
        if conn is None:
            conn = self._conns[node.name] = self.connector(self.inv, node)
        return conn

    def drop(self, node: NodeRecord) -> None:
        """Close and forget a node's connection (the next use connects again)."""
        if self._owner is not None:
            self._owner.drop(node)
            return
        conn = self._conns.pop(node.name, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in list(self._conns.values()):
            try:
                conn.close()
            except Exception:  # noqa: BLE001, S110 - closing is best effort
                pass
        self._conns.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # --- fan-out ---------------------------------------------------------------------------
    def submit(self, fn: Callable[[NodeConnection, NodeRecord], T],
               nodes: Iterable[NodeRecord] | None = None) -> dict[Future[T], NodeRecord]:
        """Start fn(conn, node) on every node at once; the caller waits (launch and monitor
        stream this way). One thread per node, however many: each call may last as long as
        the job, and a torchrun rendezvous needs every node started."""
        targets = self.nodes if nodes is None else sorted(nodes, key=lambda n: n.rank)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.nodes)))
        return {self._pool.submit(self._call, fn, n): n for n in targets}

    def _call(self, fn: Callable[[NodeConnection, NodeRecord], T], node: NodeRecord) -> T:
        return fn(self.connection(node), node)

    def each(self, fn: Callable[[NodeConnection, NodeRecord], T],
             nodes: Iterable[NodeRecord] | None = None, *,
             streaming: bool = False) -> GroupResult[T]:
        """fn(conn, node) on every node in parallel; an exception is that node's result.
        `streaming`: every node at once (calls that last as long as a job; see fan_out)."""

        def one(node: NodeRecord) -> NodeResult[T]:
            try:
                return NodeResult(node, value=fn(self.connection(node), node))
            except Exception as exc:  # noqa: BLE001 - reported per node
                self.drop(node)  # a failed transport is not reused
                return NodeResult(node, error=describe_exception(exc))

        targets = self.nodes if nodes is None else sorted(nodes, key=lambda n: n.rank)
        return GroupResult((r.node.name, r) for r in fan_out(targets, one, streaming=streaming))

    def run(self, command: str | Callable[[NodeRecord], str], *, stdin: bytes | None = None,
            timeout: float | None = None,
            nodes: Iterable[NodeRecord] | None = None) -> GroupResult[CommandResult]:
        """A shell line (or one per node) on every node; never stops early."""

        def step(conn: NodeConnection, node: NodeRecord) -> CommandResult:
            line = command(node) if callable(command) else command
            return conn.run(line, stdin=stdin, timeout=timeout)

        return self.each(step, nodes)

    def upload(self, archive: bytes, steps: list[str],
               nodes: Iterable[NodeRecord] | None = None) -> GroupResult[CommandResult]:
        """Stream a gzip tar to every node and run `steps` (joined with &&), which must
        include the `tar -xzf - ...` that reads it from stdin."""
        return self.run(" && ".join(steps), stdin=archive, nodes=nodes)

    def wait_until_reachable(self, deadline_s: float = SSH_DEADLINE_S,
                             nodes: Iterable[NodeRecord] | None = None) -> GroupResult[None]:
        """Open every node's connection (retry_open: until the deadline, through a fresh
        node's refused connections, not-yet-pinned host key and not-yet-made login user;
        only the pinned key is ever accepted)."""

        def step(conn: NodeConnection, node: NodeRecord) -> None:
            retry_open(conn, deadline_s)

        return self.each(step, nodes)


@contextlib.contextmanager
def borrowed(inv: Inventory, group: NodeGroup | None,
             nodes: Iterable[NodeRecord] | None = None) -> Iterator[NodeGroup]:
    """The caller's group (left open for its next use), or a new one closed at the end."""
    if group is not None:
        yield group
        return
    with NodeGroup(inv, nodes) as own:
        yield own
