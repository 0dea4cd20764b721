"""GcpProvider: the Provider contract for Compute Engine (see the package docstring)."""

from __future__ import annotations

import logging

from provision.cluster.providers.gcp.options import GcpOptions
from provision.model.errors import MgpuError, TeardownError
from provision.model.inventory import Inventory, InventoryStore, NodeRecord, ResourceRecord
from provision.model.plan import Plan
from provision.model.spec import ClusterSpec

log = logging.getLogger(__name__)


def _project_of(inv: Inventory) -> str | None:
    for rec in inv.resources:
        if rec.extra.get("project"):
            return rec.extra["project"]
    if inv.spec is not None and inv.spec.provider == "gcp":
        return inv.spec.options_as(GcpOptions).project
    return None


class GcpProvider:
    name = "gcp"

    def plan(self, spec: ClusterSpec) -> Plan:
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

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import create
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.plan import GcpPlan
        from provision.model.errors import ProviderUnavailableError

        gcp_plan = plan.expect(GcpPlan)
        if gcp_plan.unresolved:
            raise ProviderUnavailableError(
                "this GCP plan was made without Compute Engine and cannot be created: "
                + "; ".join(gcp_plan.unresolved),
                hint="log in with `gcloud auth application-default login` and run `up` again",
            )
        clients = build_clients(gcp_plan.layout.project)
        create.create(spec, gcp_plan, inv, store, clients, log.warning)

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients

        if not inv.resources:
            return  # every resource is recorded before its insert is sent: nothing was made
        teardown.destroy(inv, store, build_clients(_project_of(inv)))

    # --- recovery (contract.Recoverable) -------------------------------------------------------
    def node_alive(self, inv: Inventory, node: NodeRecord) -> bool:
        """False when Compute says the node's VM is gone (deleted, or stopping / stopped /
        suspended / terminated); True when it runs or Compute cannot be asked."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import node_alive

        try:
            return node_alive(build_clients(_project_of(inv)), inv, node)
        except MgpuError:
            return True  # cannot tell: the recovery loop tries to log in

    def replace(self, inv: Inventory, store: InventoryStore, node: NodeRecord) -> NodeRecord:
        """Delete the node's VM, then make one in its place (replace.py). CapacityError /
        ProvisionError when none can be made, with nothing of the attempt left."""
        from provision.cluster.providers.gcp.clients import build_clients
        from provision.cluster.providers.gcp.replace import replace_node

        return replace_node(build_clients(_project_of(inv)), inv, store, node)

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Instances (by label), placement policies and firewall rules (by description) of
        clusters not in `known`, in the project (and the zone / its region when given)."""
        from provision.cluster.providers.gcp import discovery
        from provision.cluster.providers.gcp.clients import build_clients

        opts = spec.options_as(GcpOptions)
        clients = build_clients(opts.project)
        found = discovery.tagged_resources(clients, opts.zone)
        return [r for r in found if r.extra.get("cluster") not in known]

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.cluster.providers.gcp import teardown
        from provision.cluster.providers.gcp.clients import build_clients

        clients = build_clients(spec.options_as(GcpOptions).project)
        failures = teardown.delete_records(clients, resources)
        if failures:
            raise TeardownError("could not delete every orphaned resource: " + "; ".join(failures),
                                hint="run the same `mgpu-cloud gc ... --delete` again")

