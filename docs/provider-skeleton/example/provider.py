"""ExampleProvider: the hooks of the contract (provision/cluster/providers/contract.py):
_plan (pure, typed), _create (records each resource at once, raises on failure WITHOUT
cleaning up), _destroy (idempotent), _orphans/_delete_orphans (`gc`). The base class keeps the
shared rules (an unresolved plan refused, the plan typed, errors translated in `errors`)."""

from __future__ import annotations

from provision.cluster.providers.contract import Provider
from provision.model.base import StrictModel
from provision.model.errors import TeardownError, UserInputError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan, PlannedResource
from provision.model.spec import ClusterSpec

from .options import ExampleOptions


class Reservation(StrictModel):
    """What `create` consumes: the typed request `plan` resolved."""

    hosts: list[str]
    user: str


class ExamplePlan(Plan):
    reservation: Reservation


class ExampleProvider(Provider[ExamplePlan]):
    name = "example"

    def plan_class(self) -> type[ExamplePlan]:
        return ExamplePlan

    def _plan(self, spec: ClusterSpec) -> ExamplePlan:
        opts = spec.options_as(ExampleOptions)
        hosts = [h for h in opts.hosts.split(",") if h]
        if len(hosts) < spec.nodes:
            raise UserInputError(f"{spec.nodes} nodes asked, {len(hosts)} hosts given",
                                 hint="list one address per node: --example-hosts a,b")
        hosts = hosts[:spec.nodes]
        return ExamplePlan(
            provider=self.name, cluster=spec.name, nodes=spec.nodes,
            slots_per_node=spec.gpus_per_node or 1,
            resources=[PlannedResource(kind="reservation", name=h) for h in hosts],
            reservation=Reservation(hosts=hosts, user=opts.user),
        )

    def _create(self, spec: ClusterSpec, plan: ExamplePlan, inv: Inventory,
                store: InventoryStore) -> None:
        request = plan.reservation
        for rank, host in enumerate(request.hosts):
            store.record(inv, ResourceRecord(kind="reservation", id=host))  # before it exists
            if host == "fail":
                raise UserInputError(f"host {host!r} refused the reservation")
            inv.nodes.append(NodeRecord(name=f"node-{rank}", rank=rank, address=host,
                                        private_address=host, user=request.user,
                                        slots=plan.slots_per_node))
        store.save(inv)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        left = [r.id for r in inv.resources_of("reservation") if r.id == "stuck"]
        for r in list(inv.resources_of("reservation")):
            if r.id not in left:
                store.forget(inv, r.kind, r.id)
        if left:
            raise TeardownError(f"could not release {left}")

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        return []

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        return None
