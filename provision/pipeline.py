"""The pipeline: spec -> plan -> create -> inventory -> bootstrap -> launch -> collect -> destroy.

`up` stops after bootstrap; `run` is the whole line with destroy in a `finally` (SIGTERM is
turned into an exception so the `finally` runs for it too); `down` is destroy.
Functions here hold the cluster's lock; the ones they call must not take it again.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from provision.errors import (
    MgpuError,
    ProviderUnavailableError,
    ProvisionError,
    TeardownError,
    UserInputError,
)
from provision.inventory import Inventory, InventoryStore
from provision.plan import Plan
from provision.providers import get_provider
from provision.providers.contract import Provider
from provision.spec import ClusterSpec, JobSpec

if TYPE_CHECKING:
    from provision.jobs import JobRecord
    from provision.nodes import NodeGroup
    from provision.recovery import Gate

Log = Callable[[str], None]
Confirm = Callable[[Plan], bool]


class Terminated(BaseException):
    """Raised in the main thread on SIGTERM so that teardown in `finally` blocks runs."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise Terminated(f"received signal {signum}")

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def refuse_unresolved(plan: Plan) -> None:
    """A plan made without the cloud's answers (e.g. `--dry-run` without credentials) is
    printed, never created: ProviderUnavailableError before anything is written."""
    if plan.unresolved:
        raise ProviderUnavailableError(
            "this plan cannot be created: " + "; ".join(plan.unresolved),
            hint="make the provider's credentials available, or add --dry-run to only print "
            "the plan",
        )


def plan_cluster(spec: ClusterSpec, store: InventoryStore) -> tuple[Provider, Plan]:
    """Validate everything that can be validated without writing, and plan."""
    if store.exists(spec.name):
        raise UserInputError(
            f"a cluster named {spec.name!r} already exists",
            hint=f"pick another --name, or remove it first: mgpu-cloud down {spec.name}",
        )
    provider = get_provider(spec.provider)
    return provider, provider.plan(spec)


def _create_and_bootstrap(
    provider: Provider,
    spec: ClusterSpec,
    plan: Plan,
    store: InventoryStore,
    *,
    bootstrap: bool,
    job: JobSpec | None,
    log: Log,
) -> Inventory:
    """Caller holds the lock. All-or-nothing: on any failure (or Ctrl-C) everything the
    inventory recorded is destroyed before the error is raised. This is the only rollback:
    providers' `create` just raises."""
    inv = Inventory(
        name=spec.name,
        provider=spec.provider,
        spec=spec,
        hourly_cost_usd=plan.hourly_cost_usd,
        unpriced=plan.unpriced,
    )
    store.create(inv)
    _record_cost_event("up", inv)
    if bootstrap:
        # Import Fabric/paramiko while the provider waits on its API (saves ~0.3 s of `up`).
        threading.Thread(target=importlib.import_module, args=("provision.bootstrap",),
                         daemon=True).start()
    try:
        log(f"creating {plan.nodes} node(s) on {spec.provider} ...")
        provider.create(spec, plan, inv, store)
        inv.status = "ready"
        store.save(inv)
        if bootstrap:
            from provision.bootstrap import bootstrap_cluster
            from provision.progress import bootstrap_group

            log("bootstrapping nodes ...")
            with bootstrap_group(inv, store) as group:  # per-node progress (issue 14)
                bootstrap_cluster(inv, store, job=job, log=log, group=group)
    except BaseException as exc:
        log(f"up failed ({type(exc).__name__}: {exc}); rolling back ...")
        _roll_back(provider, inv, store, exc, log)
        raise
    return inv


def _roll_back(
    provider: Provider, inv: Inventory, store: InventoryStore, exc: BaseException, log: Log
) -> None:
    """Destroy what `inv` recorded after `exc`; returns only to let the caller re-raise `exc`
    (an MgpuError gets told that everything was deleted). A failing rollback raises a
    TeardownError naming both failures and keeps the inventory, so `down` can finish."""
    try:
        _destroy(provider, inv, store, log)
    except MgpuError as rollback:
        raise TeardownError(
            f"{exc}; rolling back also failed: {rollback.message}", hint=rollback.hint,
        ) from exc
    if isinstance(exc, MgpuError):
        exc.message += " (everything created so far was deleted)"
    elif isinstance(exc, Exception):
        raise ProvisionError(
            f"creating cluster {inv.name!r} failed: {type(exc).__name__}: {exc} "
            "(everything created so far was deleted)"
        ) from exc


def _destroy(provider: Provider, inv: Inventory, store: InventoryStore, log: Log) -> None:
    _save_job_logs(inv, log)
    inv.status = "destroying"
    store.save(inv)
    provider.destroy(inv, store)
    store.delete(inv.name)
    _record_cost_event("down", inv)
    log(f"cluster {inv.name!r} removed")


def _record_cost_event(event: str, inv: Inventory) -> None:
    """The cost history (provision/cost.py; best effort, never fails `up`/`down`)."""
    from provision import cost

    (cost.record_up if event == "up" else cost.record_down)(inv)


def up(
    spec: ClusterSpec,
    *,
    confirm: Confirm,
    store: InventoryStore | None = None,
    bootstrap: bool = True,
    log: Log = _stderr,
) -> Inventory | None:
    """Create and bootstrap a cluster. Returns None when the user declined the plan."""
    store = store or InventoryStore()
    provider, plan = plan_cluster(spec, store)
    if not confirm(plan):
        return None
    refuse_unresolved(plan)
    with store.lock(spec.name), sigterm_raises():
        return _create_and_bootstrap(
            provider, spec, plan, store, bootstrap=bootstrap, job=None, log=log
        )


def down(name: str, *, store: InventoryStore | None = None, log: Log = _stderr) -> None:
    """Destroy a cluster from its inventory alone. Idempotent on the provider side."""
    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = store.load(name)
        _destroy(get_provider(inv.provider), inv, store, log)


def launch(
    name: str, job: JobSpec, *, store: InventoryStore | None = None, log: Log = _stderr
) -> int:
    """Run `job` on an existing cluster; copies rank 0's outputs back. Returns the exit code."""
    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = store.load(name)
        if inv.status != "ready":
            raise MgpuError(f"cluster {name!r} is {inv.status}, not ready")
        gate = _fabric_gate(inv, job, store, log)
        return _sync_run_fetch(get_provider(inv.provider), inv, store, job, log, gate=gate)


def _sync_run_fetch(provider: Provider, inv: Inventory, store: InventoryStore, job: JobSpec,
                    log: Log, *, sync: bool = True, gate: Gate | None = None) -> int:
    """The job on every node: workdir sync, the supervised run (checkpoints kept, failures
    recovered up to --max-restarts; `gate`: the fabric gate first, in the job's processes),
    rank 0's outputs back."""
    from provision.bootstrap import sync_workdir
    from provision.collect import fetch_outputs
    from provision.nodes import NodeGroup
    from provision.recovery import run_supervised

    with NodeGroup(inv) as group:
        if sync:
            sync_workdir(inv, job, log=log, group=group)

        records: dict[str, JobRecord] = {}  # every attempt is a job of its own

        def begin(nodes: NodeGroup) -> str:
            rec = _begin_job(inv, job, nodes, log)
            records[rec.id] = rec
            return rec.id

        def end(job_id: str, nodes: NodeGroup) -> None:
            _end_job(inv, records[job_id], nodes)

        code = run_supervised(provider, inv, store, job, log=log, group=group,
                              begin=begin, end=end, gate=gate)
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
    from provision import jobs
    from provision.launch import launching_nodes

    jobs.refuse_if_busy(inv, group)
    rec = jobs.begin(inv, job, launching_nodes(inv, job), detached=False)
    log(f"job {rec.id} (its log: mgpu-cloud logs {inv.name} {rec.id})")
    return rec


def _save_job_logs(inv: Inventory, log: Log) -> None:
    """Job logs not copied yet come here before the nodes go (best effort)."""
    from provision.jobs import before_teardown

    before_teardown(inv, log)


def _end_job(inv: Inventory, rec: JobRecord, group: NodeGroup) -> None:
    """Per-node exit codes into the record; the nodes' logs copied here."""
    from provision.jobs import refresh

    refresh(inv, [rec], group)


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
    refuse_unresolved(plan)
    with store.lock(spec.name), sigterm_raises():
        inv = _create_and_bootstrap(
            provider, spec, plan, store, bootstrap=True, job=job, log=log
        )
        try:
            gate = _fabric_gate(inv, job, store, log)
            # bootstrap already placed the workdir
            return _sync_run_fetch(provider, inv, store, job, log, sync=False, gate=gate)
        finally:
            if keep:
                log(f"--keep: cluster {spec.name!r} left running; remove it with "
                    f"`mgpu-cloud down {spec.name}`")
            else:
                with sigterm_raises():
                    _destroy(provider, inv, store, log)
                from provision.cost import describe

                log(describe(inv.hourly_cost_usd, inv.created_at, None, spec.spot))


# --- the fabric gate (provision/gate.py): before a multi-node job, stop on a degraded network
def _fabric_gate(inv: Inventory, job: JobSpec, store: InventoryStore, log: Log) -> Gate | None:
    """Where the job's processes can run the gate themselves (provision/gate_injob.py), the
    factory of each launch attempt's in-job gate; else the separate gate runs now: raises
    FabricGateError (a LaunchError) when it fails and the job did not say
    --allow-slow-network, and records the result in the inventory either way. None: no
    gate, or it ran already."""
    from provision.gate import gate_before_job
    from provision.gate_injob import InJobGate, placement

    where, why = placement(inv, job)
    if where == "in-job":
        log(f"fabric gate: in the job's own processes on {len(inv.nodes)} nodes, before its "
            "script (--fabric-check off skips it)")
        return lambda: InJobGate(inv, job, store, log)
    if where == "separate":
        log(f"fabric gate: a run of its own before the job ({why})")
    gate_before_job(inv, job, store=store, log=log)
    return None
