"""Per-node progress while a cluster is created and bootstrapped.

Two observers, no change to the providers or to bootstrap:
- `ReportingStore`: an InventoryStore whose `record` (every provider calls it the moment a
  resource exists: a container, an instance, a network, ...) also reports the resource;
- `bootstrap_group`: a NodeGroup whose connections report when SSH answers and when the
  node's files were unpacked.

`NodeProgress` shows the latest state of each node/resource: a live Rich table when stderr is
a terminal, otherwise one plain line per change (logs and CI stay readable). A rollback (a
failure or Ctrl-C during `up`) shows too: every row becomes "removing ...", then "removed" once
the inventory is gone. After a bootstrap that succeeded the progress is over: the job's own
output follows, and `run`'s teardown at the end says "cluster removed" by itself.
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
        self.done = False  # the nodes are up: nothing more to show
        self._lock = threading.Lock()
        self._screen: Any = None

    def update(self, what: str, state: str, *, plain: bool = True) -> None:
        """Show `what`'s new state (`plain`: also as a line when not live)."""
        with self._lock:
            if self.done or self.states.get(what) == state:
                return
            self.states[what] = state
            if not self.live:
                if plain:
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

    def close(self, *, done: bool = False) -> None:
        """Stop the live table (`done`: for good; a rollback after a plain close shows)."""
        with self._lock:
            self.done = self.done or done
            if self._screen is not None:
                self._screen.stop()
                self._screen = None


class ReportingStore(InventoryStore):
    """An InventoryStore that reports every resource a provider records."""

    def __init__(self, progress: NodeProgress, home: Path | None = None) -> None:
        super().__init__(home)
        self.progress = progress
        self.kinds: dict[str, str] = {}  # row -> the kind of resource it shows

    def record(self, inv: Inventory, resource: ResourceRecord) -> None:
        super().record(inv, resource)
        what = resource.name or resource.id
        self.kinds[what] = resource.kind
        self.progress.update(what, f"{resource.kind} created")

    def save(self, inv: Inventory) -> None:
        super().save(inv)
        if inv.status == "destroying":  # a rollback (or teardown) starts
            for what in list(self.progress.states):
                self.progress.update(what, "removing ...", plain=False)

    def delete(self, name: str) -> None:
        super().delete(name)
        for what in list(self.progress.states):
            kind = self.kinds.get(what)
            self.progress.update(what, f"{kind} removed" if kind else "removed",
                                 plain=kind is not None)


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

    def run_to_file(self, command: str, local: Path) -> CommandResult:
        return self.inner.run_to_file(command, local)

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
    up = False
    try:
        yield group
        up = True
    finally:
        group.close()
        # the job's own output follows: no live table under it (a rollback still shows)
        progress.close(done=up)
