"""Delete a cluster's GCP resources: instances, then the placement policy, then firewalls,
then the GPUDirect data subnets and their networks (a network with a subnet or a firewall rule
cannot be deleted, a subnet in use by a VM neither).

Works from the inventory (each ResourceRecord's extra["project"]) plus a label lookup for
instances, so a node made but not recorded is still found. Idempotent: NotFound counts as
deleted. Each deleted resource is removed from the inventory at once (store.forget); what could
not be deleted stays there and is named in the TeardownError raised after trying everything.

Only what is the cluster's own at deletion time is deleted: each record is read first (`owner`:
a VM's label mgpu-cloud-cluster, the description "mgpu-cloud-cluster=NAME" of a policy,
firewall rule, network or subnetwork, which have no labels); a record naming another
cluster's resource or one without the mark is refused by name, left alone and dropped from the
inventory (an inventory adopted from a store a node could write must not steer `down`, the
controller's teardown or `gc --delete` onto resources that are not the cluster's).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from typing import Any

from provision.cluster.providers.gcp.clients import Clients
from provision.model.errors import MgpuError, TeardownError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore, ResourceRecord

INSTANCE = "instance"
POLICY = "resource-policy"
FIREWALL = "firewall"
SUBNETWORK = "subnetwork"
NETWORK = "network"
# a policy in use by a VM cannot be deleted; a subnet in use by a VM neither; a network with
# subnets or firewall rules neither
ORDER = (INSTANCE, POLICY, FIREWALL, SUBNETWORK, NETWORK)
DESCRIPTION_PREFIX = f"{CLUSTER_TAG}="


def instance_record(project: str, zone: str, name: str, image: str | None = None) -> ResourceRecord:
    """`image`: the boot image it was made from (a replacement is made from the same one)."""
    extra = {"project": project} | ({"image": image} if image else {})
    return ResourceRecord(kind=INSTANCE, id=f"zones/{zone}/instances/{name}", name=name,
                          zone=zone, extra=extra)


def policy_record(project: str, region: str, name: str) -> ResourceRecord:
    return ResourceRecord(kind=POLICY, id=f"regions/{region}/resourcePolicies/{name}", name=name,
                          region=region, extra={"project": project})


def firewall_record(project: str, name: str) -> ResourceRecord:
    return ResourceRecord(kind=FIREWALL, id=f"global/firewalls/{name}", name=name,
                          extra={"project": project})


def network_record(project: str, name: str) -> ResourceRecord:
    return ResourceRecord(kind=NETWORK, id=f"global/networks/{name}", name=name,
                          extra={"project": project})


def subnetwork_record(project: str, region: str, name: str) -> ResourceRecord:
    return ResourceRecord(kind=SUBNETWORK, id=f"regions/{region}/subnetworks/{name}", name=name,
                          region=region, extra={"project": project})


def _unknown_kind(rec: ResourceRecord) -> TeardownError:
    return TeardownError(
        f"cannot delete {rec.id}: the inventory records it as a {rec.kind!r}, which the gcp "
        f"provider does not make (it makes {', '.join(ORDER)})",
        hint="the inventory may come from a newer mgpu-cloud: delete it with that version, or "
        "in the Cloud console, then remove its record from the inventory")


def description_owner(description: str) -> str | None:
    """NAME of a description "mgpu-cloud-cluster=NAME ..." (None without that mark)."""
    if description.startswith(DESCRIPTION_PREFIX):
        value = description.removeprefix(DESCRIPTION_PREFIX).split()
        return value[0] if value else None
    return None


class Refused(MgpuError):
    """A record names a resource that is not the cluster's own: left alone."""


def _name(rec: ResourceRecord) -> str:
    return rec.name or rec.id.rsplit("/", 1)[-1]


def owner(clients: Clients, rec: ResourceRecord) -> tuple[bool, str | None]:
    """(whether the resource exists, the cluster it is marked for) read from Compute now."""
    from google.cloud import compute_v1

    project, name = rec.extra.get("project", clients.project), _name(rec)
    what = f"reading {rec.kind} {rec.id} before deleting it"
    found: Any
    if rec.kind == INSTANCE:
        found = clients.call_or_none(clients.instances.get, compute_v1.GetInstanceRequest(
            project=project, zone=rec.zone, instance=name), what, TeardownError)
        return found is not None, (dict(found.labels).get(CLUSTER_TAG) if found else None)
    if rec.kind == POLICY:
        found = clients.call_or_none(clients.resource_policies.get,
                                     compute_v1.GetResourcePolicyRequest(
                                         project=project, region=rec.region,
                                         resource_policy=name), what, TeardownError)
    elif rec.kind == FIREWALL:
        found = clients.call_or_none(clients.firewalls.get, compute_v1.GetFirewallRequest(
            project=project, firewall=name), what, TeardownError)
    elif rec.kind == SUBNETWORK:
        found = clients.call_or_none(clients.subnetworks.get, compute_v1.GetSubnetworkRequest(
            project=project, region=rec.region, subnetwork=name), what, TeardownError)
    elif rec.kind == NETWORK:
        found = clients.call_or_none(clients.networks.get, compute_v1.GetNetworkRequest(
            project=project, network=name), what, TeardownError)
    else:
        raise _unknown_kind(rec)
    return found is not None, (description_owner(found.description) if found else None)


def _start_delete(clients: Clients, rec: ResourceRecord, cluster: str) -> Any:
    """Issue the delete of a resource marked for `cluster`; returns the operation, or None
    when the resource is already gone. Refused when it is marked for another cluster or not
    at all."""
    from google.cloud import compute_v1

    exists, marked = owner(clients, rec)
    if not exists:
        return None
    if marked != cluster:
        how = f"it is marked {CLUSTER_TAG}={marked}" if marked else \
            f"it has no {CLUSTER_TAG} mark"
        raise Refused(f"refused to delete {rec.kind} {rec.id}: {how}, not {cluster} (left "
                      "alone; dropped from the inventory)")
    project = rec.extra.get("project", clients.project)
    name = _name(rec)
    rid = str(uuid.uuid4())  # reused by the retries of this delete
    request: Any
    method: Any
    if rec.kind == INSTANCE:
        method = clients.instances.delete_unary
        request = compute_v1.DeleteInstanceRequest(project=project, zone=rec.zone, instance=name,
                                                   request_id=rid)
    elif rec.kind == POLICY:
        method = clients.resource_policies.delete_unary
        request = compute_v1.DeleteResourcePolicyRequest(project=project, region=rec.region,
                                                         resource_policy=name, request_id=rid)
    elif rec.kind == FIREWALL:
        method = clients.firewalls.delete_unary
        request = compute_v1.DeleteFirewallRequest(project=project, firewall=name, request_id=rid)
    elif rec.kind == SUBNETWORK:
        method = clients.subnetworks.delete_unary
        request = compute_v1.DeleteSubnetworkRequest(project=project, region=rec.region,
                                                     subnetwork=name, request_id=rid)
    elif rec.kind == NETWORK:
        method = clients.networks.delete_unary
        request = compute_v1.DeleteNetworkRequest(project=project, network=name, request_id=rid)
    else:
        raise _unknown_kind(rec)
    return clients.call_or_none(method, request, f"deleting {rec.kind} {rec.id}", TeardownError)


def delete_records(clients: Clients, records: Iterable[ResourceRecord],
                   on_deleted: Callable[[ResourceRecord], None] | None = None, *,
                   cluster: str | None) -> list[str]:
    """Delete `records` kind by kind in ORDER: all deletes of one kind are issued, then waited.
    Each only if Compute shows it marked for `cluster` (None: each record's extra["cluster"],
    as `gc` found it); a record of what is not the cluster's is refused (named, never
    deleted).

    Calls `on_deleted(record)` for each one gone, and for each refused one (it is not the
    cluster's: the inventory drops it). Returns one line per failure or refusal (never raises
    for a resource; the caller decides).
    """
    records = list(records)
    unknown = [_unknown_kind(r).message for r in records if r.kind not in ORDER]
    failures: list[str] = []
    refused: list[str] = []
    for kind in ORDER:
        pending = []
        for rec in (r for r in records if r.kind == kind):
            try:
                pending.append((rec, _start_delete(
                    clients, rec, cluster if cluster is not None else
                    rec.extra.get("cluster", ""))))
            except Refused as exc:
                refused.append(exc.message)
                if on_deleted is not None:
                    on_deleted(rec)
            except MgpuError as exc:
                failures.append(exc.message)
        for rec, op in pending:
            if op is not None:
                try:
                    clients.wait(op, f"deleting {rec.kind} {rec.id}", TeardownError,
                                 missing_ok=True)
                except MgpuError as exc:
                    failures.append(exc.message)
                    continue
            if on_deleted is not None:
                on_deleted(rec)
        if failures and kind == INSTANCE:
            # The policy and firewalls still serve the instances that are left: keep them.
            break
    return unknown + refused + failures


def labelled_instances(clients: Clients, project: str, cluster: str | None,
                       zone: str | None = None) -> list[tuple[str, ResourceRecord]]:
    """(cluster, record) for each instance with the cluster label (any cluster when None)."""
    from google.cloud import compute_v1

    flt = f'labels.{CLUSTER_TAG} = "{cluster}"' if cluster else f"labels.{CLUSTER_TAG}:*"
    out: list[tuple[str, ResourceRecord]] = []
    what = "listing labelled instances"
    scoped: list[tuple[str, list[Any]]]
    if zone:
        pager = clients.call(clients.instances.list, compute_v1.ListInstancesRequest(
            project=project, zone=zone, filter=flt), what, TeardownError)
        scoped = [(f"zones/{zone}", clients.iterate(pager, what, TeardownError))]
    else:
        agg = clients.call(clients.instances.aggregated_list,
                           compute_v1.AggregatedListInstancesRequest(project=project, filter=flt),
                           what, TeardownError)
        scoped = [(scope, list(lst.instances))
                  for scope, lst in clients.iterate(agg, what, TeardownError)]
    for _scope, instances in scoped:
        for inst in instances:
            owner = dict(inst.labels).get(CLUSTER_TAG)
            if owner is None or (cluster is not None and owner != cluster):
                continue
            inst_zone = inst.zone.rsplit("/", 1)[-1]
            out.append((owner, instance_record(project, inst_zone, inst.name)))
    return out


def destroy(inv: Inventory, store: InventoryStore, clients: Clients) -> None:
    """Delete everything of `inv` (recorded or carrying its label). Idempotent."""
    projects = {r.extra.get("project", clients.project) for r in inv.resources} or {clients.project}
    known = {r.id for r in inv.resources}
    failures: list[str] = []
    for project in sorted(projects):
        try:
            for _owner, rec in labelled_instances(clients, project, inv.name):
                if rec.id not in known:
                    store.record(inv, rec)
                    known.add(rec.id)
        except MgpuError as exc:
            failures.append(exc.message)
    failures += delete_records(clients, list(inv.resources),
                               on_deleted=lambda rec: store.forget(inv, rec.kind, rec.id),
                               cluster=inv.name)
    if failures and not inv.resources and all(f.startswith("refused") for f in failures):
        raise TeardownError(
            f"the inventory of cluster {inv.name!r} names resources that are not its own: "
            + "; ".join(failures),
            hint="everything marked for the cluster is deleted; an inventory that names "
            "another cluster's resources may come from a store a node could write. "
            f"`mgpu-cloud down {inv.name}` again drops the inventory")
    if failures or inv.resources:
        left = ", ".join(r.id for r in inv.resources) or "none recorded"
        raise TeardownError(
            f"could not delete every resource of cluster {inv.name!r} (left: {left}): "
            + "; ".join(failures),
            hint=f"run `mgpu-cloud down {inv.name}` again; the inventory keeps what is left",
        )
