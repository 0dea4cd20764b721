"""A job's life on a cluster, in order: sync -> gate -> start -> follow (keep checkpoints,
detect, recover) -> fetch -> record; `run` wraps it in create ... destroy.

    launch(name, job)      the job on an existing cluster (lock held; returns its exit code)
    run(spec, job)         create + launch + destroy (destroy in every case unless `keep`)
    down(name)             the jobs' logs kept, then the cluster destroyed

Each step is a call into the module that owns it (provision.nodes.bootstrap, job.gate,
job.recovery, job.collect, job.jobs); this module only orders them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from provision.cluster.pipeline import (
    Confirm,
    create_cluster,
    destroy_cluster,
    plan_cluster,
    sigterm_raises,
)
from provision.cluster.pipeline import down as destroy_by_name
from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import AnyProvider
from provision.job import jobs
from provision.job.launch import launching_nodes, workdir_of
from provision.model.errors import MgpuError
from provision.model.inventory import Inventory, InventoryStore
from provision.model.jobstore import JobRecord
from provision.model.spec import ClusterSpec, JobSpec
from provision.nodes import NodeGroup

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ready_inventory(store: InventoryStore, name: str) -> Inventory:
    """The inventory of cluster `name`, which must be ready for a job."""
    inv = store.load(name)
    if inv.status != "ready":
        raise MgpuError(f"cluster {name!r} is {inv.status}, not ready")
    return inv


def launch(
    name: str, job: JobSpec, *, store: InventoryStore | None = None, log: Log = _stderr
) -> int:
    """Run `job` on an existing cluster; copies rank 0's outputs back. Returns the exit code."""
    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = ready_inventory(store, name)
        _fabric_gate(inv, job, store, log)
        return _sync_run_fetch(get_provider(inv.provider), inv, store, job, log)


def _sync_run_fetch(provider: AnyProvider, inv: Inventory, store: InventoryStore, job: JobSpec,
                    log: Log, *, sync: bool = True) -> int:
    """The job on every node: workdir sync, the supervised run (checkpoints kept, failures
    recovered up to --max-restarts), rank 0's outputs back."""
    from provision.job.collect import fetch_outputs
    from provision.job.recovery import run_supervised
    from provision.nodes.bootstrap import sync_workdir

    with NodeGroup(inv) as group:
        if sync:
            sync_workdir(inv, workdir_of(inv, job), log=log, group=group)

        records: dict[str, JobRecord] = {}  # every attempt is a job of its own

        def begin(nodes: NodeGroup) -> str:
            rec = _begin_job(inv, job, nodes, log)
            records[rec.id] = rec
            return rec.id

        def end(job_id: str, nodes: NodeGroup) -> None:
            jobs.refresh(inv, [records[job_id]], nodes)  # exit codes; logs copied here

        code = run_supervised(provider, inv, store, job, log=log, group=group,
                              begin=begin, end=end)
    try:
        fetch_outputs(inv, Path("mgpu-outputs") / inv.name, log=log)
    except MgpuError as exc:
        if code == 0:
            raise
        log(f"could not copy the outputs back: {exc.message}")  # the job's failure matters more
    return code


def _begin_job(inv: Inventory, job: JobSpec, group: NodeGroup, log: Log) -> JobRecord:
    """The job's record (its id names its log on the nodes and here); refuses to start while
    a detached job of this cluster still runs."""
    jobs.refuse_if_busy(inv, group)
    rec = jobs.begin(inv, job, launching_nodes(inv, job), detached=False)
    log(f"job {rec.id} (its log: mgpu-cloud logs {inv.name} {rec.id})")
    return rec


def keep_job_logs(log: Log) -> Callable[[Inventory], None]:
    """The `before` hook of a destroy: job logs not copied yet come here (best effort)."""
    return lambda inv: jobs.before_teardown(inv, log)


def down(name: str, *, store: InventoryStore | None = None, log: Log = _stderr) -> None:
    """`mgpu-cloud down`: the jobs' logs kept, then everything the inventory recorded deleted."""
    destroy_by_name(name, store=store, log=log, before=keep_job_logs(log))


def run(
    spec: ClusterSpec,
    job: JobSpec,
    *,
    confirm: Confirm,
    keep: bool = False,
    store: InventoryStore | None = None,
    log: Log = _stderr,
) -> int:
    """up + launch + fetch + down; teardown in every case unless `keep`."""
    store = store or InventoryStore()
    provider, plan = plan_cluster(spec, store)
    if not confirm(plan):
        return 1
    provider.creatable(plan)  # an unresolved plan is refused before anything is written
    with store.lock(spec.name), sigterm_raises():
        inv = create_cluster(provider, spec, plan, store, bootstrap=True,
                             workdir=lambda inv: workdir_of(inv, job), log=log)
        try:
            _fabric_gate(inv, job, store, log)
            # bootstrap already placed the workdir
            return _sync_run_fetch(provider, inv, store, job, log, sync=False)
        finally:
            if keep:
                log(f"--keep: cluster {spec.name!r} left running; remove it with "
                    f"`mgpu-cloud down {spec.name}`")
            else:
                with sigterm_raises():
                    destroy_cluster(provider, inv, store, log, before=keep_job_logs(log))
                from provision.cluster.cost import describe

                log(describe(inv.hourly_cost_usd, inv.created_at, None, spec.spot))


# --- the fabric gate (provision/job/gate.py): before a multi-node job, stop on a degraded network
def _fabric_gate(inv: Inventory, job: JobSpec, store: InventoryStore, log: Log) -> None:
    """Raises FabricGateError (a LaunchError) when the gate fails and the job did not say
    --allow-slow-network; records the result in the inventory either way."""
    from provision.job.gate import gate_before_job

    gate_before_job(inv, job, store=store, log=log)
