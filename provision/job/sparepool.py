"""Where a node for a rank comes from during a run (issue 44): a ready spare first, the
provider's replacement otherwise. The one interface the recovery paths ask
(Recovery._replace_or_drop: the relaunch and the resident restart alike).

    pool.node_for(lost, why)   -> Future[NodeRecord], the node now holding lost's rank:
        a ready spare (Inventory.spares)   taken at once (KeepsSpares.promote: the inventory
                                           says so before anything else happens); in the
                                           background the lost node is deleted (retire) and,
                                           where the provider can (refills), a new spare is
                                           made, bootstrapped and gated (nodes/spares.py),
                                           then added to Inventory.spares
        none ready                         the provider's replacement (Recoverable.replace),
                                           as without spares, once an earlier retire is done
                                           (a replacement takes the lost node's name)
    pool.held()                the spares the run pays for: ready + being made (the ledger)
    pool.wait(), pool.stop()   background work finished / no new order started

A spare that cannot be made or is not fit is said and deleted, and not ordered again in this
run (a capacity error would repeat); the run goes on with the spares it has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from provision.cluster.providers.contract import AnyProvider, KeepsSpares, Recoverable
from provision.cluster.providers.spares import next_spare
from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, Replacement
from provision.model.logsink import Log
from provision.nodes import background


@dataclass
class SparePool:
    provider: AnyProvider
    inv: Inventory
    store: InventoryStore
    log: Log
    on_change: Callable[[], None] | None = None  # a spare made or failed (ledger, publish)
    # how a new spare is made ready (default nodes/spares.prepare_spares; tests script it)
    prepare: Callable[[Inventory, InventoryStore, list[NodeRecord]], None] | None = None
    _making: int = 0  # spares ordered and not ready yet
    _retiring: list[Future[None]] = field(default_factory=list)
    _work: list[Future[None]] = field(default_factory=list)
    _stopped: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self) -> int:
        with self._lock:
            return len(self.inv.spares) + self._making

    def node_for(self, lost: NodeRecord, why: str) -> Future[NodeRecord]:
        """The node that takes `lost`'s rank: a ready spare at once, else the provider's
        replacement (MgpuError through the future when it cannot be had; at once when the
        provider cannot replace nodes at all)."""
        provider = self.provider
        if isinstance(provider, KeepsSpares):
            spare = self._live_spare(provider)
            with self._lock:  # a refill adds to inv.spares from its own thread
                new = provider.promote(self.inv, self.store, spare, lost) if spare else None
            if spare is not None and new is not None:
                self.log(f"{lost.name}: its rank moves to the warm spare {spare.name} ({why})")
                self._after_promotion(provider, lost)
                done: Future[NodeRecord] = Future()
                done.set_result(new)
                return done
        if not isinstance(provider, Recoverable):
            left = " and no spare is left" if self.inv.spares_made else ""
            raise MgpuError(f"provider {self.inv.provider!r} cannot replace nodes "
                            f"({lost.name}){left}",
                            hint="restart on the same machines with --on-node-loss restart, "
                                 "or stop with --on-node-loss fail")
        self.log(f"replacing {lost.name} ({why}) ...")
        for pending in list(self._retiring):  # the lost one's name is free again first
            pending.exception()
        return background(lambda: provider.replace(self.inv, self.store, lost))

    def _live_spare(self, provider: KeepsSpares[Any]) -> NodeRecord | None:
        """The first spare the provider does not say is gone (one that died idle is dropped
        and deleted: a rank must not move to it)."""
        while True:
            with self._lock:
                spare = self.inv.spares[0] if self.inv.spares else None
            if spare is None or not isinstance(provider, Recoverable) or provider.node_alive(
                    self.inv, spare):
                return spare
            self.log(f"the warm spare {spare.name} is gone: deleted, the next one is taken")
            with self._lock:
                self.inv.spares = [s for s in self.inv.spares if s.name != spare.name]
                self.store.save(self.inv)
            self._retiring.append(background(self._retiring_one(provider, spare)))

    def _retiring_one(self, provider: KeepsSpares[Any],
                      node: NodeRecord) -> Callable[[], None]:
        return lambda: self._retire(provider, node)

    def _after_promotion(self, provider: KeepsSpares[Any], lost: NodeRecord) -> None:
        retired = background(lambda: self._retire(provider, lost))
        self._retiring.append(retired)
        if not provider.refills or self._stopped:
            return
        with self._lock:
            template = next_spare(self.inv, lost)
            self.inv.spares_made += 1
            self._making += 1
        self.log(f"a new spare ({template.name}) is ordered in the background")
        self._work.append(background(lambda: self._refill(provider, template, retired)))

    def _retire(self, provider: KeepsSpares[Any], lost: NodeRecord) -> None:
        try:
            provider.retire(self.inv, self.store, lost)
        except MgpuError as exc:
            self.log(f"{lost.name}'s old machine could not be deleted ({exc.message}); "
                     f"`mgpu-cloud down {self.inv.name}` deletes it with the cluster")

    def _refill(self, provider: KeepsSpares[Any], template: NodeRecord,
                retired: Future[None]) -> None:
        t0 = time.monotonic()
        retired.result()  # its quota and placement freed first
        made: NodeRecord | None = None
        try:
            made = provider.make_spare(self.inv, self.store, template)
            if not self._stopped:  # the run ended meanwhile: kept as made, `down` removes it
                (self.prepare or self._prepare)(self.inv, self.store, [made])
        except MgpuError as exc:
            self.log(f"no new spare ({exc.message}); going on with {len(self.inv.spares)}")
            if made is not None:
                self._retire(provider, made)
            with self._lock:
                self._making -= 1
        else:
            with self._lock:
                self._making -= 1
                self._publish(made)
            self.log(f"spare {made.name} {'made' if self._stopped else 'ready'} "
                     f"({time.monotonic() - t0:.1f} s after it was ordered)")
        if self.on_change is not None:
            self.on_change()

    def _publish(self, made: NodeRecord) -> None:
        """`made` added to Inventory.spares, its host key pinned in the cluster's file first
        (it was prepared on a file of its own): a warm launcher is started on a spare as soon
        as it is there (job/warmspares.py), and a login before the key would be refused (seen
        in CI: 'presented an unknown ssh-ed25519 host key')."""
        def add() -> None:
            self.inv.spares = [*self.inv.spares, made]
            # counted like a replacement: the user's machine adopts a managed run's copy of
            # the cluster (Inventory.adopt) with its resources
            self.inv.replacements.append(Replacement(rank=made.rank, old=None,
                                                     new=made.resource_id, reason="spare"))
            self.store.save(self.inv)

        if not made.host_key:
            add()
            return
        from provision.nodes.sshconn import write_cluster_known_hosts  # paramiko: lazy

        write_cluster_known_hosts(self.inv, self.store, adding=[made], then=add)

    def _prepare(self, inv: Inventory, store: InventoryStore, made: list[NodeRecord]) -> None:
        from provision.nodes.spares import prepare_spares

        prepare_spares(inv, store, made, log=self.log, beside_master=False)

    def wait(self, timeout: float | None = None) -> None:
        """Until the background work (retires, refills) has ended (`timeout`: at most)."""
        end = None if timeout is None else time.monotonic() + timeout
        if any(not f.done() for f in self._work):
            self.log("waiting for the spare being made: `down` then finds it in the inventory")
        for pending in [*self._retiring, *self._work]:
            left = None if end is None else max(0.0, end - time.monotonic())
            try:
                pending.exception(timeout=left)
            except TimeoutError:
                return

    def stop(self) -> None:
        """No new spare is ordered from now on, and one being made is not prepared (the run
        ends: it is kept in the inventory as made, for `down`)."""
        self._stopped = True
