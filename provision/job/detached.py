"""Detached jobs: `launch --detach` and `run --detach` return as soon as the job runs.

`launch --detach` leaves the cluster as it is. `run --detach` brings a cluster up, starts the
job, and hands teardown to the nodes: when its part of the job has ended (plus
`idle_minutes`, a window for `logs`/`jobs` to copy the logs), each node runs its provider's
`ProviderInfo.self_stop` line. What that line can do differs per provider, and is said when the
run starts (ProviderInfo.self_stop_note): an AWS instance powers off and so terminates; a GCP
VM powers off but its disk stays billed (deleting it needs credentials nodes never get); a
docker node container stops (it cannot remove itself); the ssh provider's machines are the
user's and never stop. In every case the inventory stays on this machine, so `down` removes
whatever is left; a node that hangs is still bounded by --max-hours on the clouds.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from provision.cluster.pipeline import (
    create_cluster,
    destroy_cluster,
    plan_cluster,
    sigterm_raises,
)
from provision.job import jobs
from provision.job.launch import Detach, launching_nodes, workdir_of
from provision.model.inventory import Inventory, InventoryStore
from provision.model.jobstore import JobRecord
from provision.model.logsink import stderr_line
from provision.model.spec import ClusterSpec, JobSpec
from provision.nodes import NodeGroup

Log = Callable[[str], None]
Confirm = Callable[..., bool]


def start(inv: Inventory, job: JobSpec, group: NodeGroup, detach: Detach, log: Log) -> JobRecord:
    """Record and start `job` detached on a ready cluster whose workdir is in place."""
    jobs.refuse_if_busy(inv, group)
    nodes = launching_nodes(inv, job)
    rec = jobs.begin(inv, job, nodes, detached=True, self_stop=detach.then)
    jobs.start_detached(inv, job, rec, group, detach)
    log(f"job {rec.id} runs on {len(nodes)} node(s), detached; follow it with "
        f"`mgpu-cloud logs {inv.name} {rec.id} --follow`")
    return rec


def launch_detached(name: str, job: JobSpec, *, store: InventoryStore | None = None,
                    log: Log = stderr_line) -> JobRecord:
    """Sync the workdir and start `job` on an existing cluster; returns once it runs."""
    from provision.model.inventory import ready_inventory
    from provision.nodes.bootstrap import sync_workdir

    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = ready_inventory(store, name)
        with NodeGroup(inv) as group:
            jobs.refuse_if_busy(inv, group)  # before the sync touches any node
            sync_workdir(inv, workdir_of(inv, job), log=log, group=group)
            return start(inv, job, group, Detach(), log)


def run_detached(spec: ClusterSpec, job: JobSpec, *, confirm: Confirm, idle_minutes: float,
                 store: InventoryStore | None = None, log: Log = stderr_line) -> JobRecord | None:
    """up + a detached job whose nodes stop themselves after it (see the module doc).
    Returns None when the plan was declined. If the job cannot be started, the cluster is
    removed before the error is raised (nothing would ever stop it)."""
    from provision.model.registry import provider_info

    store = store or InventoryStore()
    provider, plan = plan_cluster(spec, store)
    if not confirm(plan):
        return None
    provider.creatable(plan)  # an unresolved plan is refused before anything is written
    info = provider_info(spec.provider)
    with store.lock(spec.name), sigterm_raises():
        inv = create_cluster(provider, spec, plan, store, bootstrap=True,
                             workdir=lambda inv: workdir_of(inv, job), log=log)
        try:
            with NodeGroup(inv) as group:
                rec = start(inv, job, group,
                            Detach(then=info.self_stop, then_after_s=idle_minutes * 60), log)
        except BaseException:
            log("the job could not be started; removing the cluster ...")
            destroy_cluster(provider, inv, store, log)
            raise
    when = "at once" if math.isclose(idle_minutes, 0) else f"{idle_minutes:g} min later"
    if info.self_stop:
        log(f"when the job has ended the nodes stop themselves ({when}): "
            f"{info.self_stop_note}. Logs are copied here only by `jobs`/`logs` before that.")
    else:
        log(f"{spec.provider} nodes do not stop themselves: the cluster stays until "
            f"`mgpu-cloud down {spec.name}`")
    return rec
