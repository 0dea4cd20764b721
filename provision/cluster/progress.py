"""Per-node progress while a cluster is created and bootstrapped.

Two observers, no change to the providers or to bootstrap:
- `ReportingStore`: an InventoryStore whose `record` (every provider calls it the moment a
  resource exists: a container, an instance, a network, ...) also reports the resource;
- `bootstrap_group`: a NodeGroup whose connections report when SSH answers and when the
  node's files were unpacked.

`NodeProgress` shows the latest state of each node/resource: a live Rich table when stderr is
a terminal, otherwise one plain line per change (logs and CI stay readable).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.nodes import CommandResult, Connector, NodeConnection, NodeGroup, Writer


class NodeProgress:
    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.states: dict[str, str] = {}
        self._lock = threading.Lock()
        self._screen: Any = None

    def update(self, what: str, state: str) -> None:
        with self._lock:
            if self.states.get(what) == state:
                return
            self.states[what] = state
            if not self.live:
                self.stream.write(f"  {what}: {state}\n")
                self.stream.flush()
                return
            if self._screen is None:
                from rich.console import Console
                from rich.live import Live

                self._screen = Live(self._render(), console=Console(file=self.stream),
                                    refresh_per_second=8, transient=False)
                self._screen.start()
            self._screen.update(self._render())

    def _render(self) -> Any:
        from rich.table import Table

        table = Table("node / resource", "state", box=None, pad_edge=False)
        for what, state in self.states.items():
            table.add_row(what, state)
        return table

    def close(self) -> None:
        with self._lock:
            if self._screen is not None:
                self._screen.stop()
                self._screen = None


class ReportingStore(InventoryStore):
    """An InventoryStore that reports every resource a provider records."""

    def __init__(self, progress: NodeProgress, home: Path | None = None) -> None:
        super().__init__(home)
        self.progress = progress

    def record(self, inv: Inventory, resource: ResourceRecord) -> None:
        super().record(inv, resource)
        self.progress.update(resource.name or resource.id, f"{resource.kind} created")


class _ReportingConnection:
    """NodeConnection that reports SSH answering and the bootstrap upload's result."""

    def __init__(self, inner: NodeConnection, node: NodeRecord, progress: NodeProgress) -> None:
        self.inner, self.node, self.progress = inner, node, progress

    def open(self) -> None:
        self.inner.open()
        self.progress.update(self.node.name, "ssh answers")

    def run(self, command: str, *, stdin: bytes | None = None, out: Writer | None = None,
            timeout: float | None = None) -> CommandResult:
        res = self.inner.run(command, stdin=stdin, out=out, timeout=timeout)
        if stdin is not None:
            self.progress.update(self.node.name, "files in place" if res.ok
                                 else f"unpacking failed (exit {res.exit_code})")
        return res

    def get(self, remote: str, local: Path) -> None:
        self.inner.get(remote, local)

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def bootstrap_group(inv: Inventory, store: InventoryStore,
                    connector: Connector | None = None) -> Iterator[NodeGroup | None]:
    """A NodeGroup reporting to the store's progress (None when the store does not report:
    bootstrap then makes its own), over `connector` (default: the provider's). Closed at
    the end."""
    if not isinstance(store, ReportingStore):
        yield None
        return
    from provision.nodes import default_connector

    inner: Connector = connector or default_connector(inv)
    progress = store.progress

    def reporting(inv_: Inventory, node: NodeRecord) -> NodeConnection:
        return _ReportingConnection(inner(inv_, node), node, progress)

    for node in inv.nodes:
        progress.update(node.name, "waiting for ssh")
    group = NodeGroup(inv, connector=reporting)
    try:
        yield group
    finally:
        group.close()
        progress.close()  # the job's own output follows: no live table under it
