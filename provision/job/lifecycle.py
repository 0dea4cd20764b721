"""A job's life on a cluster, in order: the ONE entry of `run` and `launch`, in every mode.

    start(cluster, job, supervision)
      cluster       a name: an existing cluster (`launch`), its lock held throughout; or a
                    NewCluster (`run`): made for the job, removed at the end unless kept or
                    handed over (cluster.pipeline.temporary_cluster)
      supervision   who supervises the job once it runs (provision/job/supervision.py):
                    this process (attached.py), the nodes alone (detached.py), the cluster's
                    controller (managed/handoff.py); picked by managed/modes.py

    check            supervision.check   flags that contradict the mode, the store: before
                                         anything is made (a new cluster: after its plan,
                                         before its confirmation)
    (new cluster)    cluster.pipeline    plan, confirm, create, bootstrap with the workdir
    refuse if busy   job.jobs            one job at a time, asked before any node is touched
    sync             nodes.bootstrap     the script's folder (+ the launcher's files) on every
                                         node (an existing cluster; a new one got it at
                                         bootstrap)
    gate             job.gate.step       the network between the nodes proven first
                                         (multi-node): in the job's own processes where this
                                         process follows them, else a run of its own
    start            supervision.start   attached: follow, keep checkpoints, detect, recover,
                                         record, fetch (attached.py); detached: started, the
                                         nodes stop themselves after it; managed: handed to
                                         the controller
    (new cluster)    removed             unless --keep, or handed over (the nodes, the
                                         controller); the jobs' logs kept first

A job's life takes what it needs as arguments (inventory, provider, stores, log sink) and
never reads the terminal: the same code supervises a job from elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

from provision.cluster.pipeline import Declined, NewCluster, sigterm_raises, temporary_cluster
from provision.cluster.providers import get_provider
from provision.cluster.providers.contract import AnyProvider
from provision.job import elastic, jobs
from provision.job.gate.step import gate_step
from provision.job.launch import workdir_of
from provision.job.supervision import Ready, Started, Supervision, Target
from provision.model import timeline
from provision.model.errors import UserInputError
from provision.model.inventory import Inventory, InventoryStore, ready_inventory
from provision.model.logsink import Log, stderr_line
from provision.model.spec import JobSpec
from provision.nodes import NodeGroup


def start(cluster: str | NewCluster, job: JobSpec, supervision: Supervision, *,
          store: InventoryStore | None = None, log: Log = stderr_line) -> Started:
    """`job` on `cluster` under `supervision` (the module doc). Returns the attached job's
    exit code or the detached job's id; `declined` when a new cluster's plan was declined."""
    store = store or InventoryStore()
    if isinstance(cluster, str):
        return _on_existing(cluster, job, supervision, store, log)

    def check(provider: AnyProvider) -> None:
        spec = cluster.spec
        elastic.check(job, spec.nodes)
        if cluster.keep and supervision.hands_over is not None:  # `run --keep --detach`
            raise UserInputError("--keep and --detach contradict each other",
                                 hint="--detach hands teardown to the nodes; leave out --keep")
        supervision.check(job, Target(spec.name, provider, spec.provider, spec.store, new=True,
                                      spares=spec.spares), log)

    try:
        with temporary_cluster(cluster, store=store, log=log, checks=check,
                               workdir=lambda inv: workdir_of(inv, job),
                               before=keep_job_logs(log)) as made:
            started = _on_ready(made.inv, made.provider, store, job, supervision, log, new=True)
            if supervision.hands_over is not None:
                made.hand_over(supervision.hands_over)
            return started
    except Declined:
        return Started(declined=True)


def _on_existing(name: str, job: JobSpec, supervision: Supervision, store: InventoryStore,
                 log: Log) -> Started:
    with store.lock(name), sigterm_raises():
        inv = store.load(name)
        provider = get_provider(inv.provider)
        elastic.check(job, len(inv.nodes))
        supervision.check(job, Target(name, provider, inv.provider,
                                      inv.spec.store if inv.spec is not None else None,
                                      new=False, inv=inv), log)
        if inv.status != "ready":
            ready_inventory(store, name)  # raises: the cluster is not ready for a job
        clock = timeline.begin(inv, "launch")
        try:
            return _on_ready(inv, provider, store, job, supervision, log, new=False)
        finally:
            if clock.phases:
                log(clock.summary())
            else:  # nothing timed (a detached job without a gate): `up`'s stays the latest
                inv.timelines = [t for t in inv.timelines if t is not clock]
                store.save(inv)


def _on_ready(inv: Inventory, provider: AnyProvider, store: InventoryStore, job: JobSpec,
              supervision: Supervision, log: Log, *, new: bool) -> Started:
    """The steps every supervision shares on a ready cluster whose lock the caller holds:
    refuse if busy, sync (an existing cluster), the gate step; then the supervision's start."""
    from provision.nodes.bootstrap import sync_workdir

    try:
        with NodeGroup(inv) as group:
            jobs.refuse_if_busy(inv, group)
            if not new:  # a new cluster's bootstrap placed the workdir
                sync_workdir(inv, workdir_of(inv, job), log=log, group=group)
            gate = gate_step(inv, job, store=store, log=log, group=group,
                             followed=supervision.follows_output)
            return supervision.start(Ready(inv, provider, store, job, group, log, gate, new))
    finally:
        timeline.finish(inv)  # gate, first output line (and recoveries) recorded
        store.save(inv)


def keep_job_logs(log: Log) -> Callable[[Inventory], None]:
    """The `before` hook of a destroy: job logs not copied yet come here (best effort)."""
    return lambda inv: jobs.before_teardown(inv, log)
