"""Checkpoints of a managed run: from the nodes straight to the store, and back.

StoreKeeper is recovery's CheckpointKeeper with the copy done ON the nodes: the keeper still
decides when (a node's files changed and then stayed still, provision/job/checkpoints.py), but
instead of pulling files through the supervisor it runs `remote.pyz store push` on that node
(parallel, multipart, the node's own SDK client), and before a restart `remote.pyz store pull`
on every node at once, replacements included. The store's credentials and endpoint go to each
command on stdin (remote/storesync.py --env-stdin); nothing is written on the nodes. They are
the nodes' own (nodecreds.NodeCredentials: short-lived, narrowed to the run's data prefix),
asked for at each command, so a renewal reaches the next one.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from provision.job.checkpoints import CheckpointKeeper
from provision.model.errors import BootstrapError
from provision.model.inventory import Inventory, NodeRecord
from provision.model.logsink import Log
from provision.model.nodejson import PullSummary, Unreadable, last_line, unreadable
from provision.model.nodetext import shown
from provision.nodes import Connector, NodeGroup
from remote.store import StoreURL

Creds = Callable[[], dict[str, str]]  # the environment of one node store command


class StoreKeeper(CheckpointKeeper):
    def __init__(self, inv: Inventory, url: StoreURL, creds: Creds, *, log: Log,
                 connector: Connector | None = None) -> None:
        from pathlib import Path

        super().__init__(inv, Path("/nonexistent"), log=log, connector=connector)
        self.url = url
        self.creds = creds
        self.where = f"{url}/"

    def env(self) -> bytes:
        return json.dumps(self.creds()).encode()

    def _copy(self, group: NodeGroup, node: NodeRecord, files: list[str]) -> None:
        layout = group.layout
        command = layout.remote_command("store", "push", "--url", str(self.url), "--root",
                                        layout.checkpoints, "--env-stdin", "--seal", node.name,
                                        *files)
        res = group.connection(node).run(command, stdin=self.env())
        if not res.ok:
            raise BootstrapError(f"{node.name}: pushing checkpoints to {self.url} failed: "
                                 f"{res.tail()}")

    def push_all(self, group: NodeGroup, node: NodeRecord) -> None:
        """`node` pushes every file of its checkpoint folder (BootstrapError on failure)."""
        self._copy(group, node, [])

    def restore(self, group: NodeGroup) -> int:
        """Every node of `group` pulls the store's checkpoints in parallel (its folder is
        replaced). Returns the number of files on each node."""
        layout = group.layout
        command = layout.remote_command("store", "pull", "--url", str(self.url), "--root",
                                        layout.checkpoints, "--env-stdin")
        results = group.run(command, stdin=self.env(), timeout=3600)
        results.raise_for(f"restoring the checkpoint from {self.url}", BootstrapError)
        self.mark_synced(group)
        said: list[PullSummary] = []
        for r in results.values():
            if r.value is None or not r.value.stdout.strip():
                continue
            try:
                said.append(last_line(PullSummary, r.value.stdout))
            except Unreadable as exc:  # said; the restore itself succeeded there
                self.log(unreadable(r.node.name, "restore summary", exc))
        for skipped in sorted({s for d in said for s in d.skipped}):
            self.log(f"restore: checkpoint {shown(skipped)}: skipped")
        newest = max((d.newest_step for d in said if d.newest_step is not None), default=None)
        if newest is not None:
            self.restored_step = newest
        return max((d.files for d in said), default=0)


def push_outputs(group: NodeGroup, node: NodeRecord, url: StoreURL, creds: Creds) -> str:
    """Node `node` pushes its whole $MGPU_OUTPUT_DIR to `url`; '' or why it failed."""
    layout = group.layout
    command = layout.remote_command("store", "push", "--url", str(url), "--root",
                                    layout.outputs, "--env-stdin")
    try:
        res = group.connection(node).run(command, stdin=json.dumps(creds()).encode())
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return str(exc)
    return "" if res.ok else res.tail()
