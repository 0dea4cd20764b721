"""Which supervision a `run` or `launch` gets: the one place that knows all three (job/
outside managed/ never imports managed/, so the choice is made here, on top).

    supervision(detach=, store=, idle_minutes=)
        attached                      StoreAttached: this process (provision/job/attached.py),
                                      with the cluster's store for its checkpoints if it has one
        --detach, no store            detached.SelfStopping: the nodes alone
        --detach, a store             handoff.Controller: the cluster's controller

The CLI passes what it parsed (`run`: the spec's store; `launch`: the cluster's, as
`managed_url` finds it) and hands the result to provision/job/lifecycle.start.
"""

from __future__ import annotations

from provision.job.attached import Attached
from provision.job.checkpoints import CheckpointKeeper
from provision.job.detached import SelfStopping
from provision.job.managed.handoff import Controller
from provision.job.supervision import Supervision, Target
from provision.model.inventory import Inventory
from provision.model.logsink import Log
from provision.model.spec import JobSpec


class StoreAttached(Attached):
    """An attached run; on a cluster with a store its checkpoints go to the store (the nodes
    push them there: managed/keeper.StoreKeeper), checked before anything is made."""

    def check(self, job: JobSpec, target: Target, log: Log) -> None:
        super().check(job, target, log)
        if target.new and target.store:  # refused now if it cannot (issue 18)
            from provision.job.managed.checks import check_store

            check_store(target.provider_name, target.store)

    def keeper(self, inv: Inventory, log: Log) -> CheckpointKeeper:
        store = inv.spec.store if inv.spec is not None else None
        if not store:
            return super().keeper(inv, log)
        from provision.job.managed.checks import store_env
        from provision.job.managed.keeper import StoreKeeper
        from provision.job.managed.nodecreds import NodeCredentials
        from remote.store import parse_url
        from remote.storekeys import data_prefix

        url = parse_url(store)
        folder = f"{data_prefix(inv.name)}/checkpoints"
        creds = NodeCredentials(url, store_env(), write=[folder], name=f"mgpu-{inv.name}",
                                note=log)
        return StoreKeeper(inv, url.child(folder), creds, log=log)


def supervision(*, detach: bool, store: str | None, idle_minutes: float = 1.0) -> Supervision:
    """The supervision of a job (the module doc). `store`: the cluster's store URL, if any."""
    if not detach:
        return StoreAttached()
    if store:
        return Controller()
    return SelfStopping(idle_minutes)
