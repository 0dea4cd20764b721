"""Nodes the provider is sure are gone, asked while a job runs (issue 36: the controller's
detection of a lost node).

A node's SSH session dropping is how a run usually learns of a lost node, but only when
something closes the connection: the user's machine reaches docker nodes through the
engine's port forwarding, which closes at once; a controller reaches them on the bridge, and a
cloud node that is terminated sends nothing at all, so its session hangs until the peers'
collectives time out (measured on docker: 10 s from the kill to `node_lost` on the controller
against 1-2 s attached). So the run also asks the provider (contract.Recoverable.node_alive:
"cannot tell" is alive) every EVERY_S, on a thread of its own, and stops the job at once when
one is gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from provision.cluster.providers.contract import AnyProvider, Recoverable
from provision.model.inventory import Inventory, NodeRecord
from provision.nodes import fan_out

EVERY_S = 3.0
# "never looked", as a time.monotonic(): any interval has passed since. Not 0.0: monotonic's
# origin is the boot, and on a machine up less than every_s 0.0 put the first look off
NEVER = float("-inf")


class GoneNodes:
    """A cheap callable (polled twice a second): the names of the nodes the last look found
    gone; a new look starts in the background every `every_s`."""

    def __init__(self, provider: Recoverable[Any], inv: Inventory, every_s: float) -> None:
        self.provider, self.inv, self.every_s = provider, inv, every_s
        self.at, self.busy, self.gone = NEVER, False, list[str]()
        self.lock = threading.Lock()
        self.reset_at = 0.0

    def _alive(self, node: NodeRecord) -> bool:
        """The provider's word; an error it did not turn into "cannot tell" is "cannot
        tell" too (alive): a look that raised would leave `busy` set and end the looking
        for the rest of the job."""
        try:
            return self.provider.node_alive(self.inv, node)
        except Exception:  # noqa: BLE001 - cannot tell: alive (contract.Recoverable)
            return True

    def _look(self) -> None:
        began = time.monotonic()
        nodes = list(self.inv.nodes)  # every node asked at once: one call's time, not N
        alive = fan_out(nodes, self._alive)
        found = [n.name for n, ok in zip(nodes, alive, strict=True) if not ok]
        with self.lock:
            self.busy = False
            if began >= self.reset_at:  # a look begun before a replacement says nothing now
                self.gone = found

    def reset(self) -> None:
        """The nodes changed (a lost one replaced while the job runs: job/resident.py):
        forget what was found, and what a look under way will find; look again now."""
        with self.lock:
            self.gone, self.reset_at, self.at = [], time.monotonic(), NEVER

    def __call__(self) -> list[str]:
        with self.lock:
            if not self.busy and time.monotonic() - self.at >= self.every_s:
                self.at, self.busy = time.monotonic(), True
                threading.Thread(target=self._look, daemon=True).start()
            return list(self.gone)


def gone_nodes(provider: AnyProvider, inv: Inventory,
               every_s: float = EVERY_S) -> Callable[[], list[str]] | None:
    """GoneNodes for a provider that can tell (Recoverable) and more than one node; else
    None."""
    if not isinstance(provider, Recoverable) or len(inv.nodes) < 2:
        return None
    return GoneNodes(provider, inv, every_s)
