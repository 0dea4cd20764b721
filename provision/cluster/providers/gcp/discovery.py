"""Find mgpu-cloud resources in a project by label (instances) or description (placement
policies, firewall rules, GPUDirect data networks and subnets, which have no labels).
Read-only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from provision.cluster.providers.gcp import teardown
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.plan import region_of
from provision.model.errors import ProviderUnavailableError
from provision.model.inventory import ResourceRecord

_owner = teardown.description_owner


def tagged_resources(clients: Clients, zone: str | None) -> list[ResourceRecord]:
    """Every mgpu-cloud resource; extra["cluster"] names the owning cluster."""
    from google.cloud import compute_v1

    project = clients.project
    out: list[ResourceRecord] = []
    for owner, rec in teardown.labelled_instances(clients, project, None, zone):
        rec.extra["cluster"] = owner
        out.append(rec)
    region = region_of(zone) if zone else None

    def regional(agg: Any, field: str, record: Callable[[str, str, str], ResourceRecord]) -> None:
        for _scope, scoped in agg:
            for item in getattr(scoped, field):
                owner = _owner(item.description)
                where = item.region.rsplit("/", 1)[-1]
                if owner and (region is None or where == region):
                    add(record(project, where, item.name), owner)

    def global_(items: Any, record: Callable[[str, str], ResourceRecord]) -> None:
        for item in items:
            owner = _owner(item.description)
            if owner:
                add(record(project, item.name), owner)

    def add(rec: ResourceRecord, owner: str) -> None:
        rec.extra["cluster"] = owner
        out.append(rec)

    listing, error = "listing mgpu-cloud resources", ProviderUnavailableError

    def pages(method: Any, request: Any) -> list[Any]:
        return clients.iterate(clients.call(method, request, listing, error), listing, error)

    regional(pages(clients.resource_policies.aggregated_list,
                   compute_v1.AggregatedListResourcePoliciesRequest(project=project)),
             "resource_policies", teardown.policy_record)
    global_(pages(clients.firewalls.list, compute_v1.ListFirewallsRequest(project=project)),
            teardown.firewall_record)
    regional(pages(clients.subnetworks.aggregated_list,
                   compute_v1.AggregatedListSubnetworksRequest(project=project)),
             "subnetworks", teardown.subnetwork_record)
    global_(pages(clients.networks.list, compute_v1.ListNetworksRequest(project=project)),
            teardown.network_record)
    return out
