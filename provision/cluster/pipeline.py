"""A cluster's life: spec -> plan -> create -> inventory -> bootstrap ... destroy.

    with temporary_cluster(NewCluster(spec, confirm), store=..., log=..., workdir=...) as made:
        ... made.inv ...                  the cluster's lock is held; SIGTERM raises
        made.hand_over("the nodes")       its removal is someone else's from now on

`temporary_cluster` is the ONE set-up sequence of every command that makes a cluster: plan
(read-only) -> `checks` (what the caller refuses before anything is made) -> confirm -> the
plan's `creatable` -> the cluster's lock and SIGTERM raising -> create_cluster (bootstrap,
the job's workdir; a failure anywhere is rolled back here, once, by the provider's `destroy`
of what the inventory recorded: providers' `create` only raise) -> the block -> removal.
`run` uses it in each of its modes (provision/job/lifecycle.py) and so does `scale`; `up` is
the same sequence with the cluster handed over to the user; `down` is destroy_cluster.

Teardown policy (the handle's, `Made`): when the block ends the cluster is destroyed, after
`before` (the job layer keeping the jobs' logs) and with its cost said, on success and on any
failure (an exception, Ctrl-C, SIGTERM), unless it was kept (`run --keep`: in every case, as
its help says) or handed over once the job had started (`run --detach`: its nodes stop
themselves; `--detach --store`: its controller removes it; `up`: the user does). A declined
plan (or a dry run) creates nothing: Declined is raised before anything is written.
Functions here hold the cluster's lock; the ones they call must not take it again.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from provision.cluster.providers import get_provider
from provision.model import blocklist
from provision.model.errors import (
    MgpuError,
    ProvisionError,
    TeardownError,
    UserInputError,
)
from provision.model.inventory import Inventory, InventoryStore
from provision.model.logsink import Log, stderr_line
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec
from provision.model.timeline import Command, Timeline, begin, finish, timed
from provision.nodes.pool import import_ssh_stack_while_waiting

if TYPE_CHECKING:
    from provision.cluster.providers.contract import AnyProvider
    from provision.nodes.bootstrap import Workdir

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
    plan = provider.plan(spec)
    slow = blocklist.hosts(spec.provider)
    if slow:  # remembered, and said: no provider here can be asked to avoid a host
        last = slow[-1]
        plan.notes.append(
            f"{len(slow)} {spec.provider} node(s) were named slow and replaced before (the "
            f"last: {last['resource']} of {last['cluster']}, {last['at']}; "
            f"{blocklist.FILE}); {spec.provider} cannot be asked to avoid a host: another "
            "zone or instance type can")
    return provider, plan


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
        spares = f" + {plan.spares} warm spare(s)" if plan.spares else ""
        log(f"creating {plan.nodes - plan.spares} node(s){spares} on {spec.provider} ...")
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
            if inv.spares:  # warm spares (issue 44): ready to take a rank at once
                from provision.nodes.spares import prepare_spares

                with timed(inv, "spares"):
                    prepare_spares(inv, store, list(inv.spares), log=log)
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
    try:
        with temporary_cluster(NewCluster(spec, confirm), store=store or InventoryStore(),
                               log=log, bootstrap=bootstrap, command="up") as made:
            made.hand_over("the user (`mgpu-cloud down`)")
            return made.inv
    except Declined:
        return None


def down(name: str, *, store: InventoryStore | None = None, log: Log = stderr_line,
         before: BeforeDestroy | None = None) -> None:
    """Destroy a cluster from its inventory alone. Idempotent on the provider side."""
    store = store or InventoryStore()
    with store.lock(name), sigterm_raises():
        inv = store.load(name)
        destroy_cluster(get_provider(inv.provider), inv, store, log, before=before)


# --- a cluster for one command -------------------------------------------------------------
class Declined(Exception):  # noqa: N818 - an outcome, not a failure
    """The plan was declined (or only printed: --dry-run); nothing was created."""


@dataclass(frozen=True)
class NewCluster:
    """A cluster to make for one command: its spec, who confirms its plan, and `keep` (left
    running afterwards in every case: `run --keep`)."""

    spec: ClusterSpec
    confirm: Confirm
    keep: bool = False


@dataclass
class Made:
    """The handle of a temporary cluster inside its block (the module doc's policy)."""

    provider: AnyProvider
    inv: Inventory
    store: InventoryStore
    clock: Timeline  # begun before the plan; kept in the inventory
    keep: bool = False
    handed_to: str | None = None  # who removes it now (None: the block's end)

    def hand_over(self, to: str) -> None:
        """The cluster is `to`'s to remove from now on (the nodes, the controller, the user):
        the block's end leaves it, even when it ends by an exception."""
        self.handed_to = to

    @property
    def stays(self) -> bool:
        return self.keep or self.handed_to is not None


@contextlib.contextmanager
def temporary_cluster(new: NewCluster, *, store: InventoryStore, log: Log,
                      workdir: Callable[[Inventory], Workdir] | None = None,
                      bootstrap: bool = True, before: BeforeDestroy | None = None,
                      checks: Callable[[AnyProvider], None] | None = None,
                      command: Command = "run") -> Iterator[Made]:
    """Plan, check, confirm and create `new` (rollback on failure), yield it with its lock
    held, then remove it unless it was kept or handed over (the module doc). Declined when
    the plan was declined. `workdir`: what a job places on the nodes at bootstrap;
    `checks(provider)`: the caller's refusals, after the plan and before the confirmation;
    `command`: the timeline's name (`status --timeline`)."""
    spec = new.spec
    clock = Timeline.begin(command)
    provider, plan = plan_cluster(spec, store)
    clock.add("plan", since=clock.started_at)
    if checks is not None:
        checks(provider)
    if not new.confirm(plan):
        raise Declined(f"the plan of {spec.name!r} was not confirmed: nothing was created")
    provider.creatable(plan)  # an unresolved plan is refused before anything is written
    with store.lock(spec.name), sigterm_raises():
        inv = create_cluster(provider, spec, plan, store, bootstrap=bootstrap, workdir=workdir,
                             log=log, timeline=clock)
        made = Made(provider, inv, store, clock, keep=new.keep)
        try:
            yield made
        except BaseException:
            if not made.stays:
                log(f"removing cluster {spec.name!r} ...")
            raise
        finally:
            _end(made, spec, log, before)


def _end(made: Made, spec: ClusterSpec, log: Log, before: BeforeDestroy | None) -> None:
    """The block's end: removed (its cost said) unless kept or handed over; the timeline
    closed and summed up."""
    inv = made.inv
    finish(inv)
    if made.stays:
        made.store.save(inv)
        if made.handed_to is None:
            log(f"--keep: cluster {spec.name!r} left running; remove it with "
                f"`mgpu-cloud down {spec.name}`")
    else:
        from provision.cluster.cost import describe

        with sigterm_raises():
            destroy_cluster(made.provider, inv, made.store, log, before=before)
        log(describe(inv.hourly_cost_usd, inv.created_at, None, spec.spot))
    log(made.clock.summary())  # where the bring-up's time went, the slowest phase named
