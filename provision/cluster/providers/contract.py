"""The Provider contract: what the pipeline asks of every provider, as a base class whose public
methods keep the rules every provider shares and call the hooks a provider fills in (TorchX's
Scheduler: `submit` = `submit_dryrun` + `schedule`; dstack's Compute + capability mixins).

    plan(spec)            read-only; -> the provider's own typed Plan        hook: _plan
    create(spec, plan, ...)  the plan refused when unresolved, typed (plan.expect), then made,
                          recording each resource the moment its id exists; on failure it
                          just raises: the pipeline rolls back with `destroy` hook: _create
    destroy(inv, store)   idempotent; TeardownError if some remain            hook: _destroy
    orphans / delete_orphans   tagged resources no inventory here knows (`gc`)
                                                          hooks: _orphans / _delete_orphans
Every public method runs its hook inside `errors(action)`: the ONE place where the provider's
SDK errors (botocore, google.api_core, docker) become MgpuErrors. A provider that can replace a
lost node names the capability `Recoverable` in its class line; one that keeps warm spares
(issue 44: `--spares K`, spares.py) names `KeepsSpares`; without it `--spares` is refused at
plan time, saying why (`spares_refused`).

    class AwsProvider(Recoverable[AwsPlan], KeepsSpares[AwsPlan]): ...

`mypy --strict` checks each provider against these signatures (get_provider is typed by it).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Generic, TypeVar

from provision.cluster.providers import spares
from provision.model.errors import MgpuError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec

P = TypeVar("P", bound=Plan)
T = TypeVar("T")


class Provider(ABC, Generic[P]):
    """A provider's public face. Subclasses fill the underscored hooks and `plan_class`."""

    name: ClassVar[str]
    # why `--spares` cannot work here (a provider that keeps spares is a KeepsSpares)
    spares_refused: ClassVar[str] = "cannot make nodes of its own"

    # --- what a provider fills in ----------------------------------------------------------
    @abstractmethod
    def plan_class(self) -> type[P]:
        """The provider's own Plan subclass (what `_plan` returns and `_create` consumes)."""

    def errors(self, action: str, *, planning: bool = False) -> AbstractContextManager[Any]:
        """Translate the provider's SDK errors raised inside into MgpuErrors naming `action`
        (`planning`: bad input found while planning is the user's to fix, not a failure).
        The default has nothing to translate."""
        return contextlib.nullcontext()

    @abstractmethod
    def _plan(self, spec: ClusterSpec) -> P:
        """Validate `spec` against the provider and describe what `create` would make and
        cost. Never writes. UserInputError / ProviderUnavailableError for bad input,
        unreachable APIs or missing credentials (a dry run may return a plan with
        `unresolved` parts instead)."""

    @abstractmethod
    def _create(self, spec: ClusterSpec, plan: P, inv: Inventory, store: InventoryStore) -> None:
        """Make the resources of `plan`, recording each through `store.record` as soon as its
        id exists, then fill `inv.nodes`. Raises on failure WITHOUT cleaning up."""

    @abstractmethod
    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Delete every resource of `inv` (forgetting each as it goes). Idempotent: resources
        already gone are not errors. TeardownError (after trying everything) if some remain."""

    @abstractmethod
    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Tagged resources in the spec's scope whose cluster is not in `known`."""

    @abstractmethod
    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        """Delete resources returned by `_orphans`. Idempotent."""

    # --- what the pipeline calls (the shared rules live here, once) ------------------------
    def plan(self, spec: ClusterSpec) -> P:
        """`_plan` of the nodes and the spares (spares.py: the provider plans N + K nodes)."""
        if spec.spares and not isinstance(self, KeepsSpares):
            raise UserInputError(f"--spares {spec.spares}: the {self.name} provider keeps no "
                                 f"spares: it {self.spares_refused}",
                                 hint="leave --spares out (spares: 0 in the YAML)")
        with self.errors(f"checking cluster {spec.name!r} with {self.name}", planning=True):
            plan = self._plan(spares.with_spares(spec))
            if isinstance(self, KeepsSpares) and spec.spares:
                spares.describe(plan, spec, self._replacement_estimate(spec), self.refills)
            return plan

    def creatable(self, plan: Plan) -> P:
        """`plan` as this provider's own type; a plan made without the provider's answers
        (`unresolved`, e.g. a dry run without credentials) is refused: it is printed, never
        created. The pipeline asks before it writes anything."""
        plan.refuse_unresolved()
        return plan.expect(self.plan_class())

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        typed = self.creatable(plan)
        with self.errors(f"creating cluster {spec.name!r}"):
            self._create(spares.with_spares(spec), typed, inv, store)
        if spec.spares:  # the last K made are the spares (spares.py)
            spares.split(inv, spec.nodes)
            store.save(inv)

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        with self.errors(f"deleting cluster {inv.name!r}"):
            self._destroy(inv, store)

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        with self.errors("looking for orphaned resources", planning=True):
            return self._orphans(spec, known)

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        with self.errors("deleting orphaned resources"):
            self._delete_orphans(spec, resources)


class Recoverable(Provider[P]):
    """Capability: the provider can tell whether a node is gone and replace one alone. Without
    it, a lost node can only be restarted on (`--on-node-loss restart`) or end the run."""

    @abstractmethod
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when the provider is sure the node is gone (instance terminated, container
        dead); True when it runs. May raise (SDK or MgpuError) when it cannot tell."""

    @abstractmethod
    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """A new node with the same name, rank and place (placement group, subnet, network
        alias) as `node`, recorded in the inventory like any resource (the old one deleted and
        forgotten), already in `inv.nodes`. ProvisionError / CapacityError when none can be
        made, with nothing of the attempt left."""

    def _client(self, key: str, make: Callable[[], T]) -> T:
        """`make()` once per key for this provider object: the clients `_node_alive` asks
        through, which a run's liveness poll (job/liveness.py) calls for every node every few
        seconds (a boto3 session and client: ~22 ms of CPU each time it is made)."""
        made: dict[str, Any] = self.__dict__.setdefault("_clients", {})
        if key not in made:
            made[key] = make()
        client: T = made[key]
        return client

    def node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False only when the provider is sure the node is gone. When it cannot tell (its API
        does not answer), True: the recovery loop then tries a fresh login instead."""
        try:
            with self.errors(f"looking up {node.name} of cluster {inv.name!r}"):
                return self._node_alive(inv, node)
        except MgpuError:
            return True

    def replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        with self.errors(f"replacing {node.name} of cluster {inv.name!r}"):
            return self._replace(inv, store, node)


class KeepsSpares(Provider[P]):
    """Capability (issue 44; spares.py): warm spares. `--spares K` makes K more nodes with the
    cluster (the provider's own create, asked for N + K), kept in Inventory.spares, idle and
    out of the ranks. During a run (job/sparepool.py) a spare takes a lost node's rank
    (`promote`), the lost node is deleted (`retire`) and a new spare is made in the
    background (`make_spare`), unless the provider cannot (`refills` False: a fixed
    allocation)."""

    refills: ClassVar[bool] = True

    @abstractmethod
    def _replacement_estimate(self, spec: ClusterSpec) -> spares.Estimate | None:
        """How long a replacement node takes here, and the figure's source (what a spare
        saves, in the plan); None: the provider cannot replace a node at all."""

    @abstractmethod
    def _retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        """Delete `node` (its rank went to a spare: lost, preempted or slow) and forget its
        resources. Idempotent (already gone is fine); `inv.nodes` is not touched."""

    def _make_spare(self, inv: Inventory, store: InventoryStore,
                    spare: NodeRecord) -> NodeRecord:
        """One more node like the cluster's, with `spare`'s name and number (spares.next_spare),
        recorded like any resource the moment its id exists; `inv.nodes` and `inv.spares` are
        not touched (the caller adds it once it is ready). Nothing of a failed attempt left.
        The default: cannot (a provider with `refills` False)."""
        raise MgpuError(f"the {self.name} provider cannot make a spare while the cluster runs")

    def promote(self, inv: Inventory, store: InventoryStore, spare: NodeRecord,
                node: NodeRecord) -> NodeRecord:
        """`spare` takes `node`'s rank and name, in the inventory at once; `node` is left for
        `retire`. The machine keeps its own name (container, VM, pod)."""
        new = spare.model_copy(update={"name": node.name, "rank": node.rank})
        inv.spares = [s for s in inv.spares if s.name != spare.name]
        inv.nodes = [new if n.rank == node.rank else n for n in inv.nodes]
        store.save(inv)
        return new

    def retire(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> None:
        with self.errors(f"deleting {node.name} of cluster {inv.name!r}"):
            self._retire(inv, store, node)

    def make_spare(self, inv: Inventory, store: InventoryStore, spare: NodeRecord) -> NodeRecord:
        with self.errors(f"making spare {spare.name} of cluster {inv.name!r}"):
            return self._make_spare(inv, store, spare)


class Supervising(Provider[P]):
    """Capability (issue 18; docs/ARCHITECTURE.md, "Where the control plane lives"): the
    provider makes the cluster's controller, the machine that supervises managed runs. It gets
    credentials that reach only this cluster, is recorded in the inventory like any resource
    (so `destroy`, rollback and `gc` remove it) and is never one of the nodes."""

    @abstractmethod
    def _create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        """Make and start the controller; how to reach it (SSH, pinned host key)."""

    @abstractmethod
    def _teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        """Run ON the controller: delete every resource of the cluster but the controller.
        Idempotent; TeardownError if some remain."""

    @abstractmethod
    def _remove_controller_from_inside(self, inv: Inventory) -> None:
        """The controller deletes itself (its last call: it may not return)."""

    def _remove_lost_controller(self, inv: Inventory, store: InventoryStore) -> None:
        """Delete a controller that is gone or no longer answers (from the user's machine,
        before a new one takes its job back: issue 36), and forget it in `inv`. Idempotent.
        A provider that cannot says so (the default)."""
        raise MgpuError(
            f"the {inv.provider} provider cannot make the controller of {inv.name!r} again yet",
            hint=f"the job goes on on the nodes; remove the cluster when it is done: "
                 f"mgpu-cloud down {inv.name}")

    def remake_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        """A new controller in place of a lost one (its record in `inv` replaced)."""
        with self.errors(f"making the controller of {inv.name!r} again"):
            self._remove_lost_controller(inv, store)
            inv.controller = None
            store.save(inv)
            inv.controller = self._create_controller(inv, store)
            store.save(inv)
            return inv.controller

    def create_controller(self, inv: Inventory, store: InventoryStore) -> NodeRecord:
        with self.errors(f"creating the controller of {inv.name!r}"):
            return self._create_controller(inv, store)

    def teardown_from_controller(self, inv: Inventory, store: InventoryStore) -> None:
        with self.errors(f"removing cluster {inv.name!r} from its controller"):
            self._teardown_from_controller(inv, store)

    def remove_controller_from_inside(self, inv: Inventory) -> None:
        with self.errors(f"removing the controller of {inv.name!r}"):
            self._remove_controller_from_inside(inv)


AnyProvider = Provider[Any]  # what the pipeline holds: some provider, whatever its plan type
