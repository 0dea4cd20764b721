"""GcpProvider: the Provider contract for Compute Engine (see the package docstring)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from provision.cluster.providers.contract import Recoverable
from provision.cluster.providers.gcp.options import GcpOptions
from provision.model.errors import TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.spec import ClusterSpec

if TYPE_CHECKING:  # the plan module loads google.cloud.compute (~1.4 s): only when used
    from provision.cluster.providers.gcp.plan import GcpPlan

log = logging.getLogger(__name__)


def _project_of(inv: Inventory) -> str | None:
    for rec in inv.resources:
        if rec.extra.get("project"):
            return rec.extra["project"]
    if inv.spec is not None and inv.spec.provider == "gcp":
        return inv.spec.options_as(GcpOptions).project
    return None


class GcpProvider(Recoverable["GcpPlan"]):
    name = "gcp"

    def plan_class(self) -> type[GcpPlan]:
        from provision.cluster.providers.gcp.plan import GcpPlan

        return GcpPlan

    def _plan(self, spec: ClusterSpec) -> GcpPlan:
        """Read-only: resolves project, zone, machine type, image; prices the cluster.
        Without credentials: the plan from the shipped catalog, listing what is unresolved."""
        from provision.cluster.caller_address import caller_cidr
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.plan import (
            layout_to_plan,
            offline_layout,
            region_of,
            resolve,
        )
        from provision.model.errors import ProviderUnavailableError, UserInputError

        opts = spec.options_as(GcpOptions)
        if opts.zone:
            region_of(opts.zone)  # a malformed zone fails before credentials are read
        defaulted = spec.max_hours is None
        try:
            clients = build_clients(opts.project)
        except ProviderUnavailableError as exc:
            try:
                ssh_cidr: str | None = spec.ssh_cidr or caller_cidr()
            except UserInputError:
                ssh_cidr = None
            why = f"{exc.message}; {exc.hint}" if exc.hint else exc.message
            layout, unresolved = offline_layout(spec, opts.project, ssh_cidr, why)
            return layout_to_plan(layout, max_hours_defaulted=defaulted, unresolved=unresolved)
        ssh_cidr = spec.ssh_cidr or caller_cidr()
        layout = resolve(spec, clients, ssh_cidr)
        return layout_to_plan(layout, max_hours_defaulted=defaulted)

    def _create(self, spec: ClusterSpec, plan: GcpPlan, inv: Inventory,
                store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import create
        from provision.cluster.providers.gcp.clients import build_clients

        clients = build_clients(plan.layout.project)
        create.create(spec, plan, inv, store, clients, log.warning)

    def _destroy(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients

        if not inv.resources:
            return  # every resource is recorded before its insert is sent: nothing was made
        teardown.destroy(inv, store, build_clients(_project_of(inv)))

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def _node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when Compute says the node's VM is gone (deleted, or stopping / stopped /
        suspended / terminated); True when it runs."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import node_alive

        return node_alive(build_clients(_project_of(inv)), inv, node)

    def _replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """Delete the node's VM, then make one in its place (replace.py). CapacityError /
        ProvisionError when none can be made, with nothing of the attempt left."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import replace_node

        return replace_node(build_clients(_project_of(inv)), inv, store, node)

    def _orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Instances (by label), placement policies and firewall rules (by description) of
        clusters not in `known`, in the project (and the zone / its region when given)."""
        from provision.cluster.providers.gcp import discovery
        from provision.cluster.providers.gcp.clients import build_clients

        opts = spec.options_as(GcpOptions)
        clients = build_clients(opts.project)
        found = discovery.tagged_resources(clients, opts.zone)
        return [r for r in found if r.extra.get("cluster") not in known]

    def _delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients

        clients = build_clients(spec.options_as(GcpOptions).project)
        failures = teardown.delete_records(clients, resources)
        if failures:
            raise TeardownError("could not delete every orphaned resource: " + "; ".join(failures),
                                hint="run the same `mgpu-cloud gc ... --delete` again")

