"""GCP provider: GPU VMs (a2-ultragpu-8g, a2-highgpu-*, a3-highgpu-8g, or N1 + guest GPUs) in
one zone under a COLLOCATED (compact) placement policy.

Per cluster NAME, in the project and the zone's region:
    resource policy  NAME-compact    groupPlacementPolicy COLLOCATED, vmCount N; attached to
                                     every instance
    firewall         NAME-ssh        tcp:22 from --ssh-cidr only (default: caller's address /32)
    firewall         NAME-internal   all protocols between instances tagged mgpu-cloud-NAME
    instances        NAME-node-R     onHostMaintenance TERMINATE, automaticRestart false,
                                     maxRunDuration --max-hours (default 8 h) -> DELETE, spot:
                                     provisioningModel SPOT (DELETE on preemption), gVNIC, DLVM
                                     boot image, login key in ssh-keys, a pre-made host key
Instances and their boot disks carry the label mgpu-cloud-cluster=NAME; resource policies and
firewall rules have no labels in the Compute API, so they carry it as their description
(`mgpu-cloud-cluster=NAME`), which is what `gc` matches.

Credentials: Application Default Credentials (google.auth.default()); never written anywhere.

Seams (for tests and local fakes; all read from the environment at call time):
    MGPU_CLOUD_GCP_ENDPOINT=http://127.0.0.1:PORT
        every client is built with ClientOptions(api_endpoint=...) and AnonymousCredentials;
        ADC is not consulted. Unset: the real endpoint with ADC.
    MGPU_CLOUD_GCP_RETRY_BASE_S=0   no wait between retries of 429/5xx (default 1.0 s base)
    MGPU_CLOUD_GCP_POLL_S=0         no pause between operation waits (default 2.0 s)

google.cloud.compute_v1 costs ~1.4 s to import: it is imported only inside functions.
"""

from __future__ import annotations

import logging

from provision.errors import TeardownError
from provision.inventory import CLUSTER_TAG, Inventory, InventoryStore, ResourceRecord
from provision.plan import Plan
from provision.spec import ClusterSpec

log = logging.getLogger(__name__)


class GcpProvider:
    name = "gcp"

    def plan(self, spec: ClusterSpec) -> Plan:
        """Read-only: resolves project, zone, machine type, image; prices the cluster."""
        from provision.caller_address import caller_cidr
        from provision.providers.gcp.clients import build_clients
        from provision.providers.gcp.plan import layout_to_plan, region_of, resolve

        if spec.gcp.zone:
            region_of(spec.gcp.zone)  # a malformed zone fails before credentials are read
        clients = build_clients(spec.gcp.project)
        ssh_cidr = spec.ssh_cidr or caller_cidr()
        layout = resolve(spec, clients, ssh_cidr)
        return layout_to_plan(layout, max_hours_defaulted=spec.max_hours is None)

    def create(self, spec: ClusterSpec, plan: Plan, inv: Inventory, store: InventoryStore) -> None:
        from provision.providers.gcp import create
        from provision.providers.gcp.clients import build_clients
        from provision.providers.gcp.plan import layout_from_plan

        clients = build_clients(layout_from_plan(plan).project)
        create.create(spec, plan, inv, store, clients, log.warning)

    def destroy(self, inv: Inventory, store: InventoryStore) -> None:
        from provision.providers.gcp import teardown
        from provision.providers.gcp.clients import build_clients

        if not inv.resources:
            return  # every resource is recorded before its insert is sent: nothing was made
        project = inv.resources[0].extra.get("project")
        teardown.destroy(inv, store, build_clients(project))

    def orphans(self, spec: ClusterSpec, known: set[str]) -> list[ResourceRecord]:
        """Instances (by label), placement policies and firewall rules (by description) of
        clusters not in `known`, in the project (and the zone / its region when given)."""
        from provision.providers.gcp import discovery
        from provision.providers.gcp.clients import build_clients

        clients = build_clients(spec.gcp.project)
        found = discovery.tagged_resources(clients, spec.gcp.zone)
        return [r for r in found if r.extra.get("cluster") not in known]

    def delete_orphans(self, spec: ClusterSpec, resources: list[ResourceRecord]) -> None:
        from provision.providers.gcp import teardown
        from provision.providers.gcp.clients import build_clients

        clients = build_clients(spec.gcp.project)
        failures = teardown.delete_records(clients, resources)
        if failures:
            raise TeardownError("could not delete every orphaned resource: " + "; ".join(failures),
                                hint="run the same `mgpu-cloud gc ... --delete` again")


PROVIDER_CLASS = GcpProvider
__all__ = ["CLUSTER_TAG", "GcpProvider", "PROVIDER_CLASS"]
