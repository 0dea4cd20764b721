"""Find mgpu-cloud resources in a project by label (instances) or description (placement
policies, firewall rules, GPUDirect data networks and subnets, which have no labels).
Read-only."""

from __future__ import annotations

from provision.errors import ProviderUnavailableError
from provision.inventory import ResourceRecord
from provision.providers.gcp import teardown
from provision.providers.gcp.clients import Clients
from provision.providers.gcp.errors import map_errors
from provision.providers.gcp.plan import region_of


def _owner(description: str) -> str | None:
    if description.startswith(teardown.DESCRIPTION_PREFIX):
        value = description.removeprefix(teardown.DESCRIPTION_PREFIX).split()
        return value[0] if value else None
    return None


def tagged_resources(clients: Clients, zone: str | None) -> list[ResourceRecord]:
    """Every mgpu-cloud resource; extra["cluster"] names the owning cluster."""
    from google.cloud import compute_v1

    project = clients.project
    out: list[ResourceRecord] = []
    for owner, rec in teardown.labelled_instances(clients, project, None, zone):
        rec.extra["cluster"] = owner
        out.append(rec)
    region = region_of(zone) if zone else None
    with map_errors("listing resource policies and firewall rules", ProviderUnavailableError):
        agg = clients.call(clients.resource_policies.aggregated_list,
                           compute_v1.AggregatedListResourcePoliciesRequest(project=project))
        for _scope, scoped in agg:
            for pol in scoped.resource_policies:
                pol_owner = _owner(pol.description)
                pol_region = pol.region.rsplit("/", 1)[-1]
                if pol_owner and (region is None or pol_region == region):
                    rec = teardown.policy_record(project, pol_region, pol.name)
                    rec.extra["cluster"] = pol_owner
                    out.append(rec)
        for fw in clients.call(clients.firewalls.list,
                               compute_v1.ListFirewallsRequest(project=project)):
            fw_owner = _owner(fw.description)
            if fw_owner:
                rec = teardown.firewall_record(project, fw.name)
                rec.extra["cluster"] = fw_owner
                out.append(rec)
    with map_errors("listing networks and subnets", ProviderUnavailableError):
        subnets = clients.call(clients.subnetworks.aggregated_list,
                               compute_v1.AggregatedListSubnetworksRequest(project=project))
        for _scope, scoped in subnets:
            for sub in scoped.subnetworks:
                sub_owner = _owner(sub.description)
                sub_region = sub.region.rsplit("/", 1)[-1]
                if sub_owner and (region is None or sub_region == region):
                    rec = teardown.subnetwork_record(project, sub_region, sub.name)
                    rec.extra["cluster"] = sub_owner
                    out.append(rec)
        for net in clients.call(clients.networks.list,
                                compute_v1.ListNetworksRequest(project=project)):
            net_owner = _owner(net.description)
            if net_owner:
                rec = teardown.network_record(project, net.name)
                rec.extra["cluster"] = net_owner
                out.append(rec)
    return out
