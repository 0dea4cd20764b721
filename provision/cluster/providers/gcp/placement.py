"""Where the N instances land: region by region (Layout.attempts: the zone's region, then each
of --regions), zone by zone, until one zone holds all N.

Per region: the regional resources (the COLLOCATED resource policy, when the layout has one, and
the GPUDirect data subnets) are made, then the zones are tried in order. The N instances are ONE
instances.bulkInsert with count = minCount = N: Compute makes all of them or none ("If
min_count instances cannot be created, then no instances will be created and instances already
created will be deleted", BulkInsertInstanceResource), like AWS's one RunInstances. A zone
without capacity (errors.ZoneCapacityError: the operation's codes, or bulkInsert's HTTP 503
insufficientCapacity) is cleaned up and the next zone tried; a region-wide shortage
(REGION_RESOURCE_POOL_EXHAUSTED) skips the region's other zones; a region that is left
without success has its regional resources deleted before the next region. Any other error
stops at once (the pipeline rolls back everything recorded).
"""

from __future__ import annotations

from typing import Any

from provision.cluster.providers.gcp import bodies, teardown
from provision.cluster.providers.gcp.clients import Clients
from provision.cluster.providers.gcp.errors import ZoneCapacityError
from provision.cluster.providers.gcp.layout import Layout
from provision.cluster.providers.gcp.writes import delete_now, insert, insert_all, request_id
from provision.model.errors import CapacityError, ProvisionError
from provision.model.inventory import CLUSTER_TAG, Inventory, InventoryStore
from provision.model.logsink import Log


def make_regional(clients: Clients, store: InventoryStore, inv: Inventory,
                  layout: Layout) -> None:
    """The resource policy and the data subnets of layout.region (what exists per region)."""
    from google.cloud import compute_v1

    project, region = clients.project, layout.region
    if layout.placement_policy:
        rec = teardown.policy_record(project, region, layout.policy_name)
        op = insert(clients, store, inv, [rec], clients.resource_policies.insert_unary,
                    compute_v1.InsertResourcePolicyRequest(
                        project=project, region=region,
                        resource_policy_resource=bodies.policy_body(layout),
                        request_id=request_id()))
        clients.wait(op, f"creating resource policy {layout.policy_name}")
    _networks, subnets, _firewalls = bodies.data_network_bodies(layout)
    insert_all(clients, store, inv, [
        (teardown.subnetwork_record(project, region, b.name), clients.subnetworks.insert_unary,
         compute_v1.InsertSubnetworkRequest(project=project, region=region,
                                            subnetwork_resource=b, request_id=request_id()))
        for b in subnets])


def _remove_regional(clients: Clients, store: InventoryStore, inv: Inventory,
                     region: str) -> None:
    recs = [r for r in inv.resources
            if r.region == region and r.kind in (teardown.POLICY, teardown.SUBNETWORK)]
    delete_now(clients, store, inv, recs, f"region {region} before trying the next one")


def read_instances(clients: Clients, layout: Layout, zone: str, names: list[str]) -> list[Any]:
    """The new instances in `names` order: one list call with the cluster label filter."""
    from google.cloud import compute_v1

    what = f"reading the instances in {zone}"
    pager = clients.call(clients.instances.list, compute_v1.ListInstancesRequest(
        project=clients.project, zone=zone,
        filter=f'labels.{CLUSTER_TAG} = "{layout.cluster}"'), what)
    found = {i.name: i for i in clients.iterate(pager, what)}
    missing = [n for n in names if n not in found]
    if missing:
        raise ProvisionError(f"the bulk insert in {zone} finished without {', '.join(missing)}")
    return [found[n] for n in names]


def insert_in_zone(clients: Clients, store: InventoryStore, inv: Inventory, layout: Layout,
                   zone: str, names: list[str], login_public: str) -> list[Any]:
    """`names` in `zone` (one bulkInsert, recorded first), read back in that order.
    ZoneCapacityError when the zone (or region) has no capacity now."""
    from google.cloud import compute_v1

    recs = [teardown.instance_record(clients.project, zone, n, layout.image) for n in names]
    op = insert(clients, store, inv, recs, clients.instances.bulk_insert_unary,
                compute_v1.BulkInsertInstanceRequest(
                    project=clients.project, zone=zone, request_id=request_id(),
                    bulk_insert_instance_resource_resource=bodies.bulk_insert_body(
                        layout, login_public, names)))
    clients.wait(op, f"creating {len(names)} x {layout.machine_type} in {zone}")
    return read_instances(clients, layout, zone, names)


def _try_region(clients: Clients, store: InventoryStore, inv: Inventory, layout: Layout,
                login_public: str, log: Log, tried: list[str]) -> tuple[str, list[Any]] | None:
    names = [layout.instance_name(rank) for rank in range(layout.nodes)]
    for zone in layout.zones:
        try:
            return zone, insert_in_zone(clients, store, inv, layout, zone, names, login_public)
        except ZoneCapacityError as exc:
            tried.append(f"{zone} ({', '.join(sorted(set(exc.codes)))})")
            log(f"no capacity for {layout.nodes} x {layout.machine_type} in {zone}"
                f"{' (nor anywhere in ' + layout.region + ')' if exc.region_wide else ''}; "
                "removing what was made there and trying further")
            recs = [r for r in inv.resources if r.kind == teardown.INSTANCE and r.zone == zone]
            delete_now(clients, store, inv, recs, f"zone {zone} before trying the next one")
            if exc.region_wide:
                return None
    return None


def place(clients: Clients, store: InventoryStore, inv: Inventory, layout: Layout,
          login_public: str, log: Log) -> tuple[Layout, str, list[Any]]:
    """See the module docstring. The first region's regional resources must exist already
    (create makes them with the rest). Returns (the layout of the region used, the zone, the
    instances in rank order); CapacityError naming every zone tried when none had capacity."""
    tried: list[str] = []
    for i, where in enumerate(layout.attempts):
        here = layout if i == 0 else layout.in_region(where)
        if i > 0:
            log(f"trying region {here.region} (--regions)")
            make_regional(clients, store, inv, here)
        placed = _try_region(clients, store, inv, here, login_public, log, tried)
        if placed is not None:
            return here, placed[0], placed[1]
        if i + 1 < len(layout.attempts):
            _remove_regional(clients, store, inv, here.region)
    how = layout.provisioning_model.lower().replace("_", "-")
    raise CapacityError(
        f"no zone had capacity for {layout.nodes} x {layout.machine_type} ({how}"
        f"{', placed together' if layout.placement_policy else ''}); tried: "
        + "; ".join(tried),
        hint="try again later, with fewer --nodes, another way to buy them (--spot, "
        "--flex-start, --reservation NAME), or more regions (--regions any)",
    )
