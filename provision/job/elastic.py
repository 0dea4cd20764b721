"""Elastic continue (issue 36): fewer nodes when a replacement cannot be had, all of them
again when it can.

    --min-nodes M     a lost node whose replacement fails (a capacity or quota error, any
                      provider error) or takes longer than --replace-timeout is dropped, if
                      M nodes remain: the job restarts from its checkpoint on those (the
                      launchers' ranks stay contiguous: launch.launch_rank; WORLD_SIZE and
                      the ranks' own variables say the new size); `shrunk` is recorded
    Grower            meanwhile, every GROW_EVERY_S, the replacement is asked for again (a
                      replacement that only timed out is waited for instead); once one is
                      made and bootstrapped, the run grows back at a checkpoint boundary: the
                      job is stopped after the next checkpoint copy, the node joins, every
                      node restores and the job starts on all of them (`grown`; it is not
                      one of --max-restarts)

A launcher whose runner fans out over a hostfile (DeepSpeed's pdsh mode) cannot drop a node
(the hostfile lists them all): --min-nodes is refused for it before anything is made.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from provision.cluster.providers.contract import AnyProvider, Recoverable
from provision.model.errors import MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.logsink import Log
from provision.model.spec import JobSpec

GROW_EVERY_S = 30.0  # how often a missing node is asked for again ($MGPU_GROW_EVERY_S)


def check(job: JobSpec, nodes: int | None) -> None:
    """UserInputError for a --min-nodes that cannot work (before anything is made)."""
    if job.min_nodes is None:
        return
    if job.launcher == "deepspeed" and job.deepspeed_launcher == "pdsh":
        raise UserInputError("--min-nodes: DeepSpeed's pdsh runner starts every node of its "
                             "hostfile, so it cannot go on with fewer",
                             hint="use --deepspeed-launcher no_ssh, or leave --min-nodes out")
    if nodes is not None and job.min_nodes > nodes:
        raise UserInputError(f"--min-nodes {job.min_nodes} is more than the cluster's {nodes} "
                             "node(s)", hint=f"--min-nodes 1..{nodes}")


@dataclass
class Missing:
    node: NodeRecord  # as it was before it was lost (its rank names its replacement)
    pending: Future[NodeRecord] | None = None  # a replacement still being made


@dataclass
class Grower:
    """Replacements of dropped nodes, asked for in the background; `ready` the ones made and
    bootstrapped, waiting for a checkpoint boundary to join."""

    provider: AnyProvider
    inv: Inventory
    store: InventoryStore
    job: JobSpec
    log: Log
    missing: list[Missing] = field(default_factory=list)
    ready: list[NodeRecord] = field(default_factory=list)
    ready_at: float = 0.0  # monotonic time the first ready one was
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def drop(self, node: NodeRecord, pending: Future[NodeRecord] | None) -> None:
        with self._lock:
            self.missing.append(Missing(node, pending))
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def due(self, last_copy: float) -> bool:
        """A node is ready and a checkpoint was copied since: time to grow back."""
        with self._lock:
            return bool(self.ready) and last_copy > self.ready_at

    def take(self) -> list[NodeRecord]:
        with self._lock:
            out, self.ready, self.ready_at = self.ready, [], 0.0  # the next wait is its own
            return out

    def made(self, item: Missing, node: NodeRecord) -> None:
        """`item`'s replacement is made and bootstrapped: ready to join."""
        with self._lock:
            self.missing.remove(item)
            self.ready.append(node)
            self.ready_at = self.ready_at or time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        every = float(os.environ.get("MGPU_GROW_EVERY_S", GROW_EVERY_S))
        while not self._stop.wait(every):
            with self._lock:
                missing = list(self.missing)
            for item in missing:
                new = self._attempt(item)
                if new is not None:
                    self._bootstrap(new)
                    self.made(item, new)
                    self.log(f"{new.name} is back (a replacement could be made): the run "
                             "grows back to it after the next checkpoint")

    def _attempt(self, item: Missing) -> NodeRecord | None:
        if item.pending is not None:
            if not item.pending.done():
                return None
            try:
                return item.pending.result()
            except MgpuError:
                item.pending = None
                return None
        if not isinstance(self.provider, Recoverable):
            return None
        try:
            return self.provider.replace(self.inv, self.store, item.node)
        except MgpuError as exc:
            self.log(f"{item.node.name}: still no replacement ({exc.message})")
            return None

    def _bootstrap(self, node: NodeRecord) -> None:
        from provision.job.launch import workdir_of
        from provision.nodes import NodeGroup
        from provision.nodes.bootstrap import bootstrap_cluster

        view = self.inv.model_copy(update={"nodes": [*self.inv.nodes, node]})
        with NodeGroup(view, [node]) as group:
            bootstrap_cluster(view, self.store, workdir=workdir_of(self.inv, self.job),
                              log=self.log, group=group)
