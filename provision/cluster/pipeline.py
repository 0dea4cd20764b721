"""A cluster's life: spec -> plan -> create -> inventory -> bootstrap ... destroy.

`up` is plan + create_cluster (with bootstrap); `down` is destroy_cluster. A failure anywhere
in create_cluster is rolled back here, once, by the provider's `destroy` of what the
inventory recorded (providers' `create` only raise). A job's life on a cluster (launch, run)
is provision.job.lifecycle, which calls create_cluster / destroy_cluster. SIGTERM is turned
into an exception (sigterm_raises) so that teardown in `finally` blocks runs for it too.
Functions here hold the cluster's lock; the ones they call must not take it again.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING

from provision.cluster.providers import get_provider
from provision.model.errors import (
    MgpuError,
    ProvisionError,
    TeardownError,
    UserInputError,
)
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import stderr_line
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec
from provision.model.timeline import Timeline, begin, finish, timed
from provision.nodes.pool import import_ssh_stack_while_waiting

if TYPE_CHECKING:
    from provision.cluster.providers.contract import AnyProvider
    from provision.nodes.bootstrap import Workdir

Log = Callable[[str], None]
Confirm = Callable[[Plan], bool]
BeforeDestroy = Callable[[Inventory], None]  # e.g. the job layer keeping the jobs' logs


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


def plan_cluster(spec: ClusterSpec, store: InventoryStore) -> tuple[AnyProvider, Plan]:
    """Validate everything that can be validated without writing, and plan."""
    if store.exists(spec.name):
        raise UserInputError(
            f"a cluster named {spec.name!r} already exists",
            hint=f"pick another --name, or remove it first: mgpu-cloud down {spec.name}",
        )
    provider = get_provider(spec.provider)
    return provider, provider.plan(spec)


def create_cluster(
    provider: AnyProvider,
    spec: ClusterSpec,
    plan: Plan,
    store: InventoryStore,
    *,
    bootstrap: bool,
    workdir: Callable[[Inventory], Workdir] | None,
    log: Log,
    timeline: Timeline | None = None,
) -> Inventory:
    """Caller holds the lock. `workdir`: what a job places on the nodes at bootstrap (made
    from the inventory once it exists). `timeline`: the caller's, begun before the plan
    (default: an `up` timeline from now), kept in the inventory with the phases met here.
    All-or-nothing: on any failure (or Ctrl-C) everything the inventory recorded is destroyed
    before the error is raised. This is the only rollback: providers' `create` just raises."""
    inv = Inventory(
        name=spec.name,
        provider=spec.provider,
        spec=spec,
        hourly_cost_usd=plan.hourly_cost_usd,
        unpriced=plan.unpriced,
    )
    begin(inv, "up", timeline)
    store.create(inv)
    _record_cost_event("up", inv)
    if bootstrap:
        import_ssh_stack_while_waiting()
    try:
        log(f"creating {plan.nodes} node(s) on {spec.provider} ...")
        with timed(inv, "create call"):
            provider.create(spec, plan, inv, store)
        inv.status = "ready"
        store.save(inv)
        if bootstrap:
            from provision.cluster.progress import bootstrap_group
            from provision.nodes.bootstrap import bootstrap_cluster

            log("bootstrapping nodes ...")
            with bootstrap_group(inv, store) as group, timed(inv, "bootstrap"):
                # per-node progress (issue 14)
                # a job follows (`run`) when there is a workdir: it needs the image now
                bootstrap_cluster(inv, store, workdir=workdir(inv) if workdir else None,
                                  log=log, group=group, wait_image=workdir is not None)
            store.save(inv)  # the bootstrap phase closed
    except BaseException as exc:
        log(f"up failed ({type(exc).__name__}: {exc}); rolling back ...")
        _roll_back(provider, inv, store, exc, log)
        raise
    return inv


def _roll_back(
    provider: AnyProvider, inv: Inventory, store: InventoryStore, exc: BaseException, log: Log
) -> None:
    """Destroy what `inv` recorded after `exc`; returns only to let the caller re-raise `exc`
    (an MgpuError gets told that everything was deleted). A failing rollback raises a
    TeardownError naming both failures and keeps the inventory, so `down` can finish."""
    try:
        destroy_cluster(provider, inv, store, log)
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


def destroy_cluster(provider: AnyProvider, inv: Inventory, store: InventoryStore, log: Log, *,
                    before: BeforeDestroy | None = None) -> None:
    """Caller holds the lock. Delete everything `inv` recorded, then the inventory itself;
    `before` runs first while the nodes still answer. TeardownError keeps the inventory."""
    if before is not None:
        before(inv)
    inv.status = "destroying"
    store.save(inv)
    provider.destroy(inv, store)
    store.delete(inv.name)
    _record_cost_event("down", inv)
    log(f"cluster {inv.name!r} removed")


def _record_cost_event(event: str, inv: Inventory) -> None:
    """The cost history (provision/cluster/cost.py; best effort, never fails `up`/`down`)."""
    from provision.cluster import cost

    (cost.record_up if event == "up" else cost.record_down)(inv)


def up(
    spec: ClusterSpec,
    *,
    confirm: Confirm,
    store: InventoryStore | None = None,
    bootstrap: bool = True,
    log: Log = stderr_line,
) -> Inventory | None:
    """Create and bootstrap a cluster. Returns None when the user declined the plan."""
    store = store or InventoryStore()
    clock = Timeline.begin("up")
    provider, plan = plan_cluster(spec, store)
    clock.add("plan", since=clock.started_at)
    if not confirm(plan):
        return None
    provider.creatable(plan)  # refused here, before anything is written, when unresolved
    with store.lock(spec.name), sigterm_raises():
        inv = create_cluster(provider, spec, plan, store, bootstrap=bootstrap, workdir=None,
                             log=log, timeline=clock)
        finished = finish(inv)
        store.save(inv)
    if finished is not None:
        log(finished.summary())
    return inv


def down(name: str, *, store: InventoryStore | None = None, log: Log = stderr_line,
         before: BeforeDestroy | None = None) -> None:
    """Destroy a cluster from its inventory alone. Idempotent on the provider side."""
    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = store.load(name)
        destroy_cluster(get_provider(inv.provider), inv, store, log, before=before)
