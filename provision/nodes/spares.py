"""Warm spares made ready (issue 44; cluster/providers/spares.py): bootstrapped as a node is
(SSH answers, remote.pyz, the cluster key and the other nodes' names, the training image
pulled) and gated by their preflight against node 0's, so that taking a rank costs a
spare only what any node's restart costs (the job's folder, the peers' new addresses).
"""

from __future__ import annotations

from provision.model.errors import BootstrapError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord
from provision.model.logsink import Log
from provision.nodes.group import NodeGroup


def prepare_spares(inv: Inventory, store: InventoryStore, spares: list[NodeRecord], *,
                   log: Log, beside_master: bool = True) -> None:
    """Bootstrap `spares` (in `inv.spares` already, or about to be: they are pinned as if)
    and judge their preflight (`beside_master`: beside node 0's, run at the same time; a
    spare made during a run is judged alone: a preflight imports torch, which node 0's
    training would pay for). BootstrapError names every spare that is not fit (unreachable,
    an upload failing, a preflight error such as another torch or fewer GPUs); nothing is
    changed in `inv.spares`."""
    known = {s.name for s in inv.spares}
    adding = [s for s in spares if s.name not in known]
    view = inv.model_copy(update={"spares": [*inv.spares, *adding]})
    if not adding:
        _ready(view, store, spares, log, beside_master)
        return
    # Made during a run: pinned in a file of their own until they are in `inv` (the cluster's
    # file is rewritten from `inv` meanwhile, e.g. by a recovery's refresh_peers: the spare's
    # key would be gone before its preflight logs in).
    own = store.keys_dir(inv.name) / ("known_hosts.preparing-" + "-".join(s.name for s in adding))
    view.known_hosts_path = str(own)
    try:
        _ready(view, store, spares, log, beside_master)
    finally:
        own.unlink(missing_ok=True)


def _ready(view: Inventory, store: InventoryStore, spares: list[NodeRecord], log: Log,
           beside_master: bool) -> None:
    """prepare_spares' bootstrap and preflight gate, in the inventory `view` holding them."""
    from provision.nodes.bootstrap import bootstrap_cluster
    from provision.nodes.checks import compare_preflights
    from provision.nodes.preflight import gather_preflights

    with NodeGroup(view, spares) as nodes:
        bootstrap_cluster(view, store, log=lambda m: log(f"spare(s): {m}"), group=nodes)
    judged = [view.master, *spares] if beside_master else spares
    with NodeGroup(view, judged) as nodes:
        reports = gather_preflights(view, group=nodes)
    names = {s.name for s in spares}
    gpus = view.spec.gpus_per_node if view.spec is not None else None
    bad = [f for f in compare_preflights(reports, gpus)
           if f.severity == "error" and names & set(f.nodes)]
    if bad:
        raise BootstrapError("spare(s) not fit to take a rank: " + "; ".join(
            f"{', '.join(f.nodes)}: {f.message}" for f in bad),
            hint=bad[0].hint or "`mgpu-cloud check NAME` shows every node's preflight")
