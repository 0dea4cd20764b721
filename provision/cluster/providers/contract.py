"""The Provider contract: what the pipeline asks of every provider.

    plan     pure with respect to the cloud: read-only calls at most; returns the provider's own
             typed Plan subclass (what `create` consumes, plus a rendering for humans/--json)
    create   makes what the plan says, recording each resource in the inventory the moment its
             id exists; on failure it just raises: the pipeline rolls back by calling `destroy`
             with what the inventory recorded (rollback lives once, in the pipeline)
    destroy  idempotent; resources already gone are not errors; TeardownError if some remain
    orphans / delete_orphans   tagged resources no inventory on this machine knows (`gc`)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec


@runtime_checkable
class Provider(Protocol):
    name: str

    def plan(self, spec: ClusterSpec) -> Plan:
        """Validate `spec` against the provider and describe what `create` would make and
        cost. Never writes. Raises UserInputError / ProviderUnavailableError for bad input,
        unreachable APIs or missing credentials."""
        ...

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        """Make the resources of `plan` (the provider's own Plan subclass, as returned by
        `plan`), recording each through `store.record` as soon as its id exists, then fill
        `inv.nodes`. Raises on failure WITHOUT cleaning up: the pipeline calls `destroy`."""
        ...

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        """Delete every resource of `inv`. Idempotent; resources already gone are not errors.
        Raises TeardownError (after trying everything) if some could not be deleted."""
        ...

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Tagged resources in the spec's scope (region/project) whose cluster is not in
        `known` (the names of the inventories on this machine)."""
        ...

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        """Delete resources returned by `orphans`. Idempotent."""
        ...


@runtime_checkable
class Recoverable(Protocol):
    """Optional capability: providers that can tell whether a node is gone and replace one.
    Without it, a lost node can only be restarted on (`--on-node-loss restart`) or fail."""

    def node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when the provider is sure the node is gone (instance terminated, container
        dead); True otherwise (alive, or cannot tell)."""
        ...

    def replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """A new node with the same name, rank and place (placement group, subnet, network
        alias) as `node`, recorded in the inventory like any resource (the old one deleted
        and forgotten). Returns the new NodeRecord, already in `inv.nodes`. Raises
        ProvisionError when no node can be made."""
        ...
